"""Streaming sources: a source is scanned for ids only and read piece by piece (in Ray
tasks or in the process), NeMo spans are their own recordings, table columns are found
by their common names, a resume leaves out what is done, and the driver's memory does
not grow with the input (`shardscribe validate` over 10x the rows and inline audio)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from conftest import ROOT, ray_job_rows
from shardscribe.pipeline.sources import SourceError, iter_input_batches, open_source, read_source, scan


def tone(seconds: float, rate: int = 16000, channels: int = 1, fmt: str = "WAV", seed: int | None = None) -> bytes:
    """A 220-Hz tone; with ``seed``, plus a little noise of its own (distinct bytes, which
    Parquet cannot dictionary-encode away)."""
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    if seed is not None:
        wave += np.random.default_rng(seed).normal(0, 0.01, len(wave)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, np.stack([wave] * channels, axis=1), rate, format=fmt)
    return buf.getvalue()


def test_nemo_spans_are_their_own_recordings(tmp_path):
    from shardscribe.pipeline.prepare import prepare_row

    (tmp_path / "long.wav").write_bytes(tone(10.0, rate=22050, channels=2))
    lines = [{"audio_filepath": "long.wav", "offset": 0, "duration": 2.5, "text": "a"},
             {"audio_filepath": "long.wav", "offset": 4.25, "duration": 3.0, "text": "b"},
             {"audio_filepath": "long.wav", "offset": 8.0, "duration": 5.0},   # runs past the end
             {"audio_filepath": "long.wav", "offset": 12.0}]                     # starts past it
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = read_source(str(tmp_path / "m.jsonl"))
    assert [r["id"] for r in rows] == ["long.wav#0", "long.wav#4.25", "long.wav#8", "long.wav#12"]
    durations = [prepare_row(r, segmenter=lambda a: []).get("duration_s") for r in rows]
    # The file's own length (soundfile) is the reference for the span cut short.
    info = sf.info(str(tmp_path / "long.wav"))
    assert durations[:3] == pytest.approx([2.5, 3.0, info.frames / info.samplerate - 8.0], abs=1e-3)
    assert durations[3] is None
    assert "past the end" in prepare_row(rows[3], segmenter=lambda a: [])["error"]
    # Each output row says where its span starts in the file (NeMo's offset), so the Parquet
    # and the NeMo manifest written from it point at the right audio.
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.formats import format_file, write_formats

    dst = tmp_path / "out"
    run_local(rows, load_config("ar", ["decoder.kind=audit"]), str(dst), progress=False)
    out = {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}
    assert [out[r["id"]]["offset_s"] for r in rows] == [0.0, 4.25, 8.0, 12.0]
    write_formats(str(dst), ["nemo"])
    nemo = [json.loads(x) for x in (dst / format_file("nemo")).read_text().splitlines()]
    spans = sorted((x["offset"], x["duration"]) for x in nemo if x["duration"])
    assert [o for o, _ in spans] == [0.0, 4.25, 8.0] and [d for _, d in spans] == pytest.approx(durations[:3])


def test_hf_table_columns_by_common_names_or_flags(tmp_path):
    data = tone(0.5)
    pq.write_table(pa.table({"file": ["a.wav", "b.wav"], "sentence": ["one", "two"],
                             "transcription": ["x", "y"]}), tmp_path / "cv.parquet")
    rows = read_source(str(tmp_path / "cv.parquet"))
    assert [r["audio"] for r in rows] == [str(tmp_path / "a.wav"), str(tmp_path / "b.wav")]
    assert [r["reference"] for r in rows] == ["one", "two"]
    rows = read_source(str(tmp_path / "cv.parquet"), text_column="transcription")
    assert [r["reference"] for r in rows] == ["x", "y"]
    pq.write_table(pa.table({"clip": [{"bytes": data, "path": "c.wav"}], "label": ["z"]}), tmp_path / "o.parquet")
    with pytest.raises(SourceError, match="needs an audio column"):
        read_source(str(tmp_path / "o.parquet"))
    with pytest.raises(SourceError, match="no audio column 'nope'"):
        read_source(str(tmp_path / "o.parquet"), audio_column="nope")
    with pytest.raises(SourceError, match="no text column 'labl'"):
        read_source(str(tmp_path / "o.parquet"), audio_column="clip", text_column="labl")
    (row,) = read_source(str(tmp_path / "o.parquet"), audio_column="clip", text_column="label")
    assert row["audio_bytes"] == data and row["reference"] == "z"


def test_a_manifest_text_key_no_line_has_is_refused(tmp_path):
    """--text-column on a JSONL manifest: a key no line holds is a typo, refused when the
    source is scanned (before any worker), as a Parquet table's missing column is; lines
    that lack it beside lines that have it are rows without a reference."""
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"audio": "a.wav", "label": "one"}) + "\n" + json.dumps({"audio": "b.wav"}) + "\n")
    with pytest.raises(SourceError, match=r"no manifest line has the text key 'labl'.*\['audio', 'label'\]"):
        scan(open_source(str(path), text_column="labl"))
    assert len(scan(open_source(str(path), text_column="label")).ids) == 2
    assert [r["reference"] for r in read_source(str(path), text_column="label")] == ["one", None]
    assert len(scan(open_source(str(path))).ids) == 2


def test_pieces_are_bounded_and_exclusions_left_out(tmp_path):
    """Many row groups and manifest lines: every work item yields tables of at most the
    batch size, all rows come back once, in order, less the excluded ids."""
    n = 103
    data = tone(0.1)
    pq.write_table(pa.table({"audio": [{"bytes": data, "path": None}] * n}), tmp_path / "t.parquet",
                   row_group_size=10)
    (tmp_path / "m.jsonl").write_text("".join(json.dumps({"audio": f"{i}.wav"}) + "\n\n" for i in range(n)))
    for uri, ids in ((tmp_path / "t.parquet", [f"t.parquet:{i}" for i in range(n)]),
                     (tmp_path / "m.jsonl", [f"{i}.wav" for i in range(n)])):
        source = open_source(str(uri))
        scanned = scan(source, rows_per_item=25)
        assert scanned.ids.to_pylist() == ids
        batches = list(iter_input_batches(source.excluding(ids[5:50]), 7, scanned.items))
        assert max(b.num_rows for b in batches) <= 7
        assert [i for b in batches for i in b.column("id").to_pylist()] == ids[:5] + ids[50:]


def test_duplicate_span_ids_fail_before_any_worker(tmp_path):
    lines = [{"audio": "a.wav", "offset": 1}, {"audio": "a.wav", "offset": 1.0}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(SourceError, match=r"duplicate ids \['a.wav#1'\]"):
        scan(open_source(str(tmp_path / "m.jsonl")))


def test_a_table_through_the_ray_plan_with_a_resume(tmp_path):
    """Inline audio in two Parquet files, read by Ray tasks, under the audit kind; ids
    already done are left out. Reference durations: the encoder's own lengths."""
    from shardscribe.pipeline.config import load_config

    lengths = [0.5 + 0.25 * i for i in range(9)]
    for f, part in (("a", lengths[:5]), ("b", lengths[5:])):
        (tmp_path / "t").mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": [f"{f}{i}" for i in range(len(part))],
                                 "audio": [{"bytes": tone(s, rate=8000), "path": None} for s in part]}),
                       tmp_path / "t" / f"{f}.parquet", row_group_size=2)
    cfg = load_config("ar", ["decoder.kind=audit", "batching.recordings_per_batch=2", "ray.num_cpus=4"])
    source = open_source(str(tmp_path / "t")).excluding(["a1", "b2"])
    rows = ray_job_rows(source, cfg, tmp_path / "out")
    want = {f"a{i}": s for i, s in enumerate(lengths[:5])} | {f"b{i}": s for i, s in enumerate(lengths[5:])}
    del want["a1"], want["b2"]
    assert {r["id"]: r["duration_s"] for r in rows} == pytest.approx(want, abs=1e-3)
    assert all(r["error"] is None and r["stage"] == "audit" for r in rows)


# Runs `shardscribe validate` in a child that has already imported and loaded what every
# job loads (torch, silero-vad), and reports the job's peak of live bytes above that: Python
# objects (tracemalloc, which numpy's buffers report to) plus Arrow's memory pool. RSS is
# not the measure because it counts the allocators' caches: the 60- vs 600-row RSS
# difference ranged 22-65 MB between identical runs, and ~100 MB with Arrow on the system
# allocator, while the live peaks below agree to 0.3 MB.
GROWTH = """
import json, sys, threading, time, tracemalloc
import pyarrow as pa
import torch
from shardscribe.pipeline.segment import VadSegmenter
from shardscribe.jobs.cli import main
VadSegmenter()
tracemalloc.start()
base_py, base_arrow, peak_arrow, done = tracemalloc.get_traced_memory()[0], pa.total_allocated_bytes(), [0], []
def sample():
    while not done:
        peak_arrow[0] = max(peak_arrow[0], pa.total_allocated_bytes() - base_arrow)
        time.sleep(0.002)
t = threading.Thread(target=sample, daemon=True)
t.start()
code = main(sys.argv[1:])
done.append(1)
t.join()
peak_py = tracemalloc.get_traced_memory()[1] - base_py
print(json.dumps({"code": code, "python_mb": peak_py / 2**20, "arrow_mb": peak_arrow[0] / 2**20}))
"""


def job_peak_live_mb(args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", GROWTH, *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["code"] == 0
    return result


def test_driver_memory_does_not_grow_with_the_rows(tmp_path):
    """`shardscribe validate --runner local` (driver and workers in one process) over a
    table of 200 and of 600 rows of 192 KB of inline audio each (6 s of 16-bit PCM; 38 MB
    vs 115 MB): the job's peak of live Python and Arrow bytes differs by less than 10 MB.
    A process holding the table would add its 77 MB at least once, as Python bytes or as
    Arrow buffers. Both sizes are past the blocks the audio stage reads ahead of the model
    (actors.local_runner.PREFETCH_BATCHES), which 60 rows did not fill."""
    peaks = []
    for n in (200, 600):
        path = tmp_path / f"t{n}.parquet"
        pq.write_table(pa.table({"id": [f"r{i}" for i in range(n)],
                                 "audio": [{"bytes": tone(6.0, seed=i), "path": None} for i in range(n)]}),
                       path, row_group_size=50)
        peaks.append(job_peak_live_mb(["validate", str(path), "--runner", "local", "--output",
                                       str(tmp_path / f"out{n}"), "--set", "batching.recordings_per_batch=16"]))
    for kind in ("python_mb", "arrow_mb"):
        assert peaks[1][kind] - peaks[0][kind] < 10, peaks


def test_validate_reports_only_its_own_source(tmp_path, capsys):
    """One --output audited twice, for two sources: the second report holds the second
    source alone, and an audit (no transcript) prints no WER."""
    from shardscribe.jobs.cli import main

    (tmp_path / "bad.wav").write_bytes(b"not audio at all")
    (tmp_path / "good.wav").write_bytes(tone(1.0, seed=1))
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text(json.dumps({"id": "bad", "audio": str(tmp_path / "bad.wav"), "text": "x"}) + "\n")
    second.write_text(json.dumps({"id": "good", "audio": str(tmp_path / "good.wav"), "text": "x y"}) + "\n")
    out = str(tmp_path / "audit")
    assert main(["validate", str(first), "--runner", "local", "--output", out]) == 1
    capsys.readouterr()
    assert main(["validate", str(second), "--runner", "local", "--output", out]) == 0
    captured = capsys.readouterr()
    assert "validate: 1 recordings" in captured.err and "0 unusable" in captured.err, captured.err
    assert "bad" not in captured.err and "WER" not in captured.out + captured.err
    # Without --output the rows live in a temporary folder: no line points into it.
    assert main(["validate", str(second), "--runner", "local"]) == 0
    captured = capsys.readouterr()
    assert "Output:" not in captured.out and "validate: 1 recordings" in captured.err
