"""Long recordings streamed in windows: the same segments and transcript as the
whole-recording path, bounded memory, progress within a recording, one row per recording."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from shardscribe.jobs.bench.long_audio import SAMPLE, peak_rss_of, speech_starts, transcribe_command, write_long_recording
from shardscribe.pipeline.audio import SAMPLE_RATE
from shardscribe.pipeline.pieces import PIECE_SEP, PieceJoiner
from shardscribe.pipeline.records import OUTPUT_SCHEMA, PREPARED_SCHEMA, table
from shardscribe.pipeline.segment import VadSegmenter
from shardscribe.pipeline.stream_segment import WindowedSegmenter

# How far a streamed segment's edge may lie from the whole-recording one: silero-vad
# starts each window with fresh state in a pause, which moves a span's padded edge by a
# few of its 32-ms frames at most (vad_pad_s, 0.2 s, bounds it).
EDGE_TOLERANCE_S = 0.1
WINDOW_S, OVERLAP_S = 40.0, 5.0
SPEECH_AT = [3.0, 16.0, 35.0, 52.0, 61.0, 95.0]   # 35.0: the 40-s window edge falls inside speech


def _recording(seconds: float = 120.0) -> np.ndarray:
    speech, _ = sf.read(str(SAMPLE), dtype="float32")
    audio = np.random.default_rng(0).normal(0, 1e-3, int(seconds * SAMPLE_RATE)).astype(np.float32)
    for t in SPEECH_AT:
        at = int(t * SAMPLE_RATE)
        if at + len(speech) <= len(audio):
            audio[at:at + len(speech)] += speech
    return audio


@pytest.fixture(scope="module")
def segmenter():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield VadSegmenter()
    torch.set_num_threads(threads)


def test_windowed_segments_are_the_whole_recordings_within_the_tolerance(segmenter):
    audio = _recording()
    whole = segmenter(audio)
    edge = int(WINDOW_S * SAMPLE_RATE)
    # The case that could break: a speech span the first window's edge cuts through.
    assert any(s.start < edge < s.end for s in segmenter.speech_spans(audio))
    blocks = [audio[i:i + 30 * SAMPLE_RATE] for i in range(0, len(audio), 30 * SAMPLE_RATE)]
    windows = WindowedSegmenter(segmenter, WINDOW_S, OVERLAP_S)
    streamed = list(windows.segments(blocks))
    assert windows.length == len(audio)
    assert len(streamed) == len(whole) >= 4
    for (seg, clip, _), ref in zip(streamed, whole):
        assert abs(seg.start - ref.start) <= EDGE_TOLERANCE_S * SAMPLE_RATE
        assert abs(seg.end - ref.end) <= EDGE_TOLERANCE_S * SAMPLE_RATE
        assert seg.end - seg.start <= segmenter.max_len
        np.testing.assert_array_equal(clip, audio[seg.start:seg.end])
    decided = [d for _, _, d in streamed]
    assert decided == sorted(decided) and decided[0] < len(audio)   # segments leave before the end


def test_a_recording_within_one_window_is_segmented_whole(segmenter):
    audio = _recording(60.0)
    blocks = [audio[i:i + 30 * SAMPLE_RATE] for i in range(0, len(audio), 30 * SAMPLE_RATE)]
    streamed = [seg for seg, _, _ in WindowedSegmenter(segmenter, 60.0, 5.0).segments(blocks)]
    assert streamed == segmenter(audio)


def _piece_row(rid, piece, segments, duration, error=None):
    return {"id": f"{rid}{PIECE_SEP}{piece}", "audio": "a.flac", "duration_s": duration, "error": error,
            "segments": [{"start": s, "end": e, "text": t, "stage": "ar"} for s, e, t in segments],
            "t_prepare_s": 1.0, "t_encode_s": 2.0, "t_decode_s": 3.0, "t_fallback_s": 0.0, "stage": "ar"}


def _prepared(rid, pieces):
    return table([{"id": rid, "audio": "a.flac", "piece": p, "pieces": n, "share": s} for p, n, s in pieces],
                 PREPARED_SCHEMA)


def test_pieces_finished_in_any_order_join_into_the_recordings_one_row():
    joiner = PieceJoiner()
    joiner.tag(_prepared("rec", [(0, None, 0.25), (1, None, 0.5), (2, 3, 1.0)]))
    tagged = joiner.tag(_prepared("short", [(0, 1, 1.0)]))   # one piece: passes as it is
    assert tagged.column("id").to_pylist() == ["short"]
    outs = [_piece_row("rec", 2, [(70.0, 75.0, "three")], 20.0),
            _piece_row("rec", 0, [(1.0, 5.0, "one")], 20.0),
            _piece_row("rec", 1, [(30.0, 40.0, "two")], 40.0)]
    progress = []
    whole = None
    for out in outs:
        rows, counts = joiner.join(table([out], OUTPUT_SCHEMA))
        progress.append(counts)
        whole = rows if rows is not None else whole
    row = whole.to_pylist()[0]
    assert whole.num_rows == 1 and row["id"] == "rec"
    assert [s["text"] for s in row["segments"]] == ["one", "two", "three"]
    assert row["text"] == "one two three" and row["error"] is None
    assert row["duration_s"] == 80.0 and row["t_encode_s"] == 6.0
    # The pieces before the last moved the bar; the joined row's own counts (its caller's
    # block_counts: 1 row, 80 s) then complete it, net of what the pieces counted.
    assert progress[:2] == [(0, 20.0, 0, 0.0), (0, 20.0, 0, 0.25)]
    assert [sum(c[i] for c in progress) for i in range(4)] == pytest.approx([0, 0.0, 0, 0.0])
    assert joiner.holds == 0


def test_an_error_in_a_later_piece_makes_the_whole_row_an_error_without_segments():
    joiner = PieceJoiner()
    joiner.tag(_prepared("rec", [(0, None, 0.5), (1, 2, 1.0)]))
    joiner.join(table([_piece_row("rec", 0, [(1.0, 5.0, "one")], 300.0)], OUTPUT_SCHEMA))
    rows, _ = joiner.join(table([_piece_row("rec", 1, [], None, error="truncated or corrupt: decoded 300 s")],
                                OUTPUT_SCHEMA))
    row = rows.to_pylist()[0]
    assert row["error"].startswith("truncated") and row["segments"] == [] and row["text"] is None
    assert row["stage"] == "error" and row["duration_s"] is None


def test_the_console_line_counts_a_recording_in_progress():
    import io

    from shardscribe.jobs.console import Progress

    out = io.StringIO()
    bar = Progress(1, out, interval_s=0.0, tty=False)
    bar.update(0, 600.0, 0, 0.25)
    bar.update(0, 1200.0, 0, 0.5)
    lines = out.getvalue().splitlines()
    assert "0/1 rec (25%)" in lines[0] and "0/1 rec (50%)" in lines[1]


def _rows(dst):
    return [r for f in sorted(dst.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def _write(path, seconds, every=None, starts=None):
    write_long_recording(path, seconds, starts if starts is not None else speech_starts(seconds, every))
    return path


@pytest.mark.slow
def test_a_streamed_recording_has_the_whole_recordings_transcript(tmp_path, model_cache):
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config

    audio = _write(tmp_path / "rec.flac", 120.0, starts=SPEECH_AT)
    rows = [{"id": "rec", "audio": str(audio), "audio_bytes": None}]
    whole_cfg = load_config("ar", [f"model.cache_dir={model_cache}", "audio.window_s=200"])
    run_local(rows, whole_cfg, str(tmp_path / "whole"), progress=False)
    progress = []
    cfg = load_config("ar", [f"model.cache_dir={model_cache}", f"audio.window_s={WINDOW_S}",
                             f"audio.window_overlap_s={OVERLAP_S}", "audio.piece_s=30"])
    run_local(rows, cfg, str(tmp_path / "streamed"), progress=False, on_progress=progress.append)
    (whole,), (streamed,) = _rows(tmp_path / "whole"), _rows(tmp_path / "streamed")
    assert streamed["text"] == whole["text"] and streamed["error"] is None
    assert streamed["duration_s"] == pytest.approx(whole["duration_s"])
    assert len(streamed["segments"]) == len(whole["segments"])
    for a, b in zip(streamed["segments"], whole["segments"]):
        assert abs(a["start"] - b["start"]) <= EDGE_TOLERANCE_S and abs(a["end"] - b["end"]) <= EDGE_TOLERANCE_S
    shares = [c[3] for c in progress if c[3] > 0]
    assert len(shares) >= 2     # pieces reported before the row was done


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_recordings_length(tmp_path):
    """10 and 40 minutes through the CLI (--runner local): the job's largest process stays
    under 1 GB and grows by at most 10% (the whole-recording path grew by 230 MB an hour);
    `shardscribe bench long-audio` carries the 1-, 2- and 10-hour figures."""
    import os

    peaks = []
    for minutes in (10, 40):
        audio = _write(tmp_path / f"rec{minutes}.flac", minutes * 60.0, every=300.0)
        dst = tmp_path / f"out{minutes}"
        rc, _, rss = peak_rss_of(transcribe_command(audio, dst, "ar", "local", minutes * 60.0), dict(os.environ))
        assert rc == 0
        (row,) = _rows(dst)
        assert row["error"] is None and len(row["segments"]) == len(speech_starts(minutes * 60.0, 300.0))
        peaks.append(rss)
    assert max(peaks) < 1 << 30, peaks
    assert peaks[1] <= 1.10 * peaks[0], peaks


@pytest.mark.slow
def test_an_hour_long_recording_moves_the_bar_as_its_pieces_finish(tmp_path, model_cache):
    from shardscribe.actors.job import JobSpec, run_job

    audio = _write(tmp_path / "hour.flac", 3600.0, every=600.0)
    seen = []
    spec = JobSpec(input=str(audio), output=str(tmp_path / "out"), config="ar", runner="local",
                   overrides=[f"model.cache_dir={model_cache}"])
    summary = run_job(spec, on_progress=seen.append)
    assert summary["rows_out"] == 1 and summary["errors"] == 0
    # The bar's position (console.Progress: rows + partial) moves before the row is done.
    positions = [p.rows + p.partial for p in seen if not p.final]
    moves = [b for a, b in zip(positions, positions[1:]) if b > a and b < 1]
    assert len(moves) >= 5, positions
    (row,) = _rows(tmp_path / "out")
    assert len(row["segments"]) == 6 and row["duration_s"] == pytest.approx(3600.0)


@pytest.mark.slow
def test_a_long_recording_through_ray_is_the_local_runners_row(tmp_path, model_cache):
    from shardscribe.jobs.api import transcribe

    audio = _write(tmp_path / "rec.flac", 240.0, every=60.0)
    sets = {"model.cache_dir": str(model_cache), "audio.piece_s": 60}
    transcribe(str(audio), str(tmp_path / "local"), "ar", "local", set=sets)
    summary = transcribe(str(audio), str(tmp_path / "ray"), "ar", "ray", set=sets)
    assert summary["rows_in"] == summary["rows_out"] == 1
    (local,), (ray,) = _rows(tmp_path / "local"), _rows(tmp_path / "ray")
    assert ray["text"] == local["text"] and ray["error"] is None and len(ray["segments"]) == 4
    assert [(s["start"], s["end"]) for s in ray["segments"]] == [(s["start"], s["end"]) for s in local["segments"]]
