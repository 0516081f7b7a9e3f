"""Hostile audio: files built to cost memory or time, or to pass as a transcript while being
nothing. Each is one row with an `error` of a fixed kind, in bounded memory and time; a read
that times out is stopped, not left running; and the kinds of errors are a fixed vocabulary
that no path ever enters. Run alone: pytest -n 0 tests/faults/test_hostile_audio.py
"""
from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from conftest import ROOT, SAMPLES

# The vocabulary, spelled out here so that a change to it is a change to this test too.
VOCABULARY = {"missing", "unreadable", "empty", "corrupt", "unsupported", "too_long", "timeout",
              "model_error", "other"}
MB = 1 << 20


def _wav_header(rate: int, channels: int, data_bytes: int, bits: int = 16) -> bytes:
    """A plain PCM RIFF/WAVE header that declares what it is told to, true or not."""
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * block, block, bits)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt) + 8 + data_bytes) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", data_bytes))


def _noise(frames: int, channels: int = 1) -> bytes:
    return (np.random.default_rng(0).standard_normal(frames * channels) * 3000).astype("<i2").tobytes()


# The tester's files: 66 KB each.
RATE_1 = _wav_header(1, 1, 66000) + _noise(33000)          # 33000 s at 1 Hz: 2 GB at 16 kHz
CHANNELS_1000 = _wav_header(16000, 1000, 66000) + _noise(33000)   # 2 ms of 1000 channels
TRUNCATED = _wav_header(16000, 1, 48000) + _noise(9600)    # declares 1.5 s, holds 0.6 s


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class _PeakRSS:
    """The highest VmRSS seen while the block runs (sampled every 5 ms)."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return self.peak - self.base


def _whole(frames):
    from shardscribe.pipeline.segment import Segment

    return [Segment(0, len(frames))]


def _prepare(path, timeout_s: float = 5.0, **kw) -> dict:
    from shardscribe.pipeline.prepare import prepare_row_within

    return prepare_row_within({"id": Path(path).name, "audio": str(path)}, _whole, "HQ", timeout_s, **kw)


def test_a_1_hz_wav_is_an_error_row_in_bounded_memory_and_time(tmp_path):
    """Resampled from 1 Hz to 16 kHz, 66 KB would become 2 GB (the tester saw 2.6 GB of
    peak RSS, and a read timeout that left the decode running): the header's rate is
    refused before a sample is decoded."""
    from shardscribe.pipeline.output import error_kind

    path = tmp_path / "rate1.wav"
    path.write_bytes(RATE_1)
    (tmp_path / "ok.wav").write_bytes(TRUNCATED[:44] + _noise(24000))
    assert _prepare(tmp_path / "ok.wav")["error"] is None      # imports and first-use allocations, outside the measure
    start = time.monotonic()
    with _PeakRSS() as rss:
        row = _prepare(path)
    assert "unsupported sample rate" in row["error"] and "1 Hz" in row["error"], row["error"]
    assert error_kind(row["error"]) == "unsupported"
    assert row["seg_audio"] == [] and row["duration_s"] is None
    assert rss.growth < 50 * MB, rss.growth / MB
    assert time.monotonic() - start < 2.0


def test_100_rate_1_wavs_leave_memory_and_threads_flat(tmp_path):
    """100 of them through the audio stage (actors.audio_prep.AudioPrep, in-process) with a
    5-s read timeout: each is its own error row, and the process ends as it began: no
    thread left decoding, no memory held."""
    from shardscribe.actors.audio_prep import AudioPrep
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.sources import input_batches, open_source, scan

    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(100):
        (folder / f"rate1_{i:03d}.wav").write_bytes(RATE_1)
    cfg = load_config("ar", ["audio.read_timeout_s=5"])
    prep = AudioPrep(cfg.to_dict())
    source = open_source(str(folder))
    warm = tmp_path / "warm"
    warm.mkdir()
    (warm / "rate1.wav").write_bytes(RATE_1)
    for batch in input_batches(open_source(str(warm)), 16):     # first-use allocations, outside the measure
        prep(batch)
    threads, base = threading.active_count(), _rss()
    rows, start = [], time.monotonic()
    with _PeakRSS() as rss:
        for batch in input_batches(source, 16, scan(source).items):
            rows += prep(batch).to_pylist()
    assert len(rows) == 100 and len({r["id"] for r in rows}) == 100
    assert all("unsupported sample rate" in (r["error"] or "") for r in rows), rows[0]["error"]
    assert threading.active_count() <= threads
    assert _rss() - base < 100 * MB and rss.growth < 100 * MB, (_rss() - base, rss.growth)
    assert time.monotonic() - start < 60


class _SlowFile(io.BytesIO):
    """A file that answers each read after a pause (slow storage): its decode takes far
    longer than the read timeout, block after block."""

    def read(self, n=-1):
        time.sleep(0.002)
        return super().read(n)

    def readinto(self, buffer):
        time.sleep(0.002)
        return super().readinto(buffer)


def test_a_timed_out_read_is_stopped_not_left_running(monkeypatch):
    """A decode that runs past audio.read_timeout_s stops at its deadline (checked between
    blocks): after each timed-out row no reader thread is left, and memory does not grow
    with the rows that timed out."""
    import shardscribe.pipeline.prepare as prepare

    data = io.BytesIO()
    sf.write(data, np.zeros(16000 * 600, np.float32), 16000, format="WAV", subtype="PCM_16")
    wav = data.getvalue()              # 10 min: a few seconds to read through _SlowFile
    monkeypatch.setattr(prepare, "open_audio", lambda row: _SlowFile(wav))
    threads, base = threading.active_count(), _rss()
    for i in range(6):
        start = time.monotonic()
        row = prepare.prepare_row_within({"id": f"slow{i}", "audio": f"memory://slow{i}.wav"}, _whole, "HQ", 0.3)
        assert row["error"].startswith("read timeout") and not row.get("reader_alive"), row["error"]
        assert time.monotonic() - start < 0.3 + getattr(prepare, "CANCEL_GRACE_S", 1.0) + 0.2
        assert threading.active_count() == threads, [t.name for t in threading.enumerate()]
    assert _rss() - base < 100 * MB


def test_a_1000_channel_header_is_an_error_row_not_a_word(tmp_path):
    """1000 channels over a mono file's bytes decode as 2 ms of noise, which the model
    transcribed as "you": the channel count is refused from the header."""
    from shardscribe.pipeline.output import error_kind

    path = tmp_path / "ch1000.wav"
    path.write_bytes(CHANNELS_1000)
    row = _prepare(path)
    assert "unsupported channel count" in row["error"] and "1000 channels" in row["error"], row["error"]
    assert error_kind(row["error"]) == "unsupported" and row["seg_audio"] == []


def _flac(seconds: float) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(np.arange(int(16000 * seconds)) / 5.0)).astype(np.float32), 16000, format="FLAC")
    return buf.getvalue()


def _mp3_cut(seconds: float, share: float) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(np.arange(int(16000 * seconds)) / 5.0)).astype(np.float32), 16000,
             format="MP3", subtype="MPEG_LAYER_III")
    return buf.getvalue()[: int(len(buf.getvalue()) * share)]


@pytest.mark.parametrize("name, data", [
    ("trunc.wav", TRUNCATED),
    # an MP3 cut short: its Xing header declares 1.5 s, frames for about 0.6 s follow
    ("trunc.mp3", _mp3_cut(1.5, 0.45)),
])
def test_a_file_far_shorter_than_its_header_is_corrupt(tmp_path, name, data):
    """Less than half of what the header declares is a corrupt file, not a shorter
    recording, also where the shortfall is under the 1-s tolerance for long files."""
    from shardscribe.pipeline.audio import AudioError, decode_audio, decode_stream
    from shardscribe.pipeline.output import error_kind

    path = tmp_path / name
    path.write_bytes(data)
    row = _prepare(path)
    assert "truncated or corrupt" in row["error"], row["error"]
    assert error_kind(row["error"]) == "corrupt"
    for decode in (decode_audio, lambda b: decode_stream(io.BytesIO(b))):
        with pytest.raises(AudioError, match="truncated or corrupt") as err:
            decode(data)
        assert err.value.kind == "corrupt"


def test_streamed_and_open_length_files_still_decode():
    """What the short-read rule must not catch: a WAV whose writer left its sizes unwritten
    (0, 0xFFFFFFFF, a stream) decodes whole; a short file decodes whole in each format."""
    from shardscribe.pipeline.audio import decode_audio, decode_stream

    tone = (0.3 * np.sin(np.arange(24000) / 5.0)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, tone, 16000, format="WAV", subtype="PCM_16")
    wav = bytearray(buf.getvalue())
    at = wav.index(b"data") + 4
    for size in (0, 0xFFFFFFFF):
        wav[at:at + 4] = size.to_bytes(4, "little")
        for decode in (decode_audio, lambda b: decode_stream(io.BytesIO(b))):
            assert len(decode(bytes(wav))[0]) == 24000
    for fmt, subtype in (("FLAC", None), ("OGG", "VORBIS"), ("MP3", "MPEG_LAYER_III"), ("WAV", "PCM_16")):
        buf = io.BytesIO()
        sf.write(buf, tone[:800], 16000, format=fmt, subtype=subtype)     # 50 ms
        for decode in (decode_audio, lambda b: decode_stream(io.BytesIO(b))):
            assert abs(len(decode(buf.getvalue())[0]) - 800) < 100


def test_audio_max_seconds_bounds_what_is_decoded():
    """More audio than audio.max_seconds is a too_long row, from the header, before a sample
    is decoded; a header that leaves its length open (a FLAC stream's total 0, which
    libsndfile reports as 2**63-1 frames and cannot read to its end) is refused, not a
    2**63-frame allocation."""
    from shardscribe.pipeline.audio import AudioError, decode_audio, decode_stream
    from shardscribe.pipeline.output import error_kind

    buf = io.BytesIO()
    sf.write(buf, np.zeros(16000 * 5, np.float32), 16000, format="WAV", subtype="PCM_16")
    flac = bytearray(_flac(5.0))
    flac[8 + 13] &= 0xF0                   # STREAMINFO's 36-bit total samples: 0, unknown
    flac[8 + 14:8 + 18] = bytes(4)
    with sf.SoundFile(io.BytesIO(bytes(flac))) as f:
        assert f.frames > 1 << 62
    for data, ok, kind in ((buf.getvalue(), True, "too_long"), (bytes(flac), False, "unsupported")):
        for decode in (lambda b, s: decode_stream(io.BytesIO(b), max_seconds=s),
                       lambda b, s: decode_audio(b, max_seconds=s)):
            with pytest.raises(AudioError) as err:
                decode(data, 2.0)
            assert err.value.kind == kind == error_kind(str(err.value)), str(err.value)
            if ok:
                assert len(decode(data, 5.0)[0]) == 80000
    # a span within the limit of a longer file is fine
    assert len(decode_stream(io.BytesIO(buf.getvalue()), offset_s=1.0, duration_s=2.0, max_seconds=2.0)[0]) == 32000


def test_a_directory_named_like_audio_is_an_error_row(tmp_path):
    """A folder input lists a directory named x.wav as a recording: its row says what it is."""
    from shardscribe.pipeline.output import error_kind
    from shardscribe.pipeline.sources import read_source

    (tmp_path / "x.wav").mkdir()
    (tmp_path / "x.wav" / "inside.wav").write_bytes(TRUNCATED)
    (tmp_path / "good.wav").write_bytes(TRUNCATED)
    (tmp_path / "tables.parquet").mkdir()   # a dataset folder: not audio, not listed
    rows = {r["id"]: r for r in read_source(str(tmp_path))}
    assert sorted(rows) == ["good.wav", "x.wav", "x.wav/inside.wav"]
    row = _prepare(rows["x.wav"]["audio"])
    assert "it is a directory" in row["error"] and error_kind(row["error"]) == "unreadable"


def test_error_kinds_are_a_fixed_vocabulary_without_paths(tmp_path):
    """Broken files under distinct long paths, each failing its own way: summary.json's
    errors_by_kind has vocabulary words as keys, never a path, however many there are;
    each row's error still names its file."""
    from shardscribe.pipeline import output
    from shardscribe.pipeline.audio import AudioError
    from shardscribe.pipeline.records import OUTPUT_SCHEMA, table

    contents = {"rate1.wav": RATE_1, "ch1000.wav": CHANNELS_1000, "trunc.wav": TRUNCATED, "empty.wav": b"",
                "random.wav": bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8))}
    paths = []
    for i in range(6):
        folder = tmp_path / ("d" * 200 + str(i)) / ("e" * 200)
        folder.mkdir(parents=True)
        for name, data in contents.items():
            (folder / name).write_bytes(data)
            paths.append(folder / name)
        (folder / "dir.wav").mkdir()
        paths += [folder / "dir.wav", folder / "missing.wav", folder / ("n" * 300 + ".wav")]   # name too long
    rows = []
    for path in paths:
        prepared = _prepare(path)
        if output.error_kind(prepared["error"]) in ("missing", "unreadable"):
            assert str(path) in prepared["error"], prepared["error"]      # the path stays in the message
        rows.append({"id": str(path), "audio": str(path), "stage": "error", "segments": [],
                     "error": prepared["error"]})
    rows.append({"id": "model", "audio": "/m.wav", "stage": "error", "segments": [],
                 "error": "RuntimeError while decoding: CUDA error at /very/long/path"})
    output.write_part(table(rows, OUTPUT_SCHEMA), str(tmp_path / "out"), "job")
    kinds = output.summarize(str(tmp_path / "out"), [r["id"] for r in rows], {"wall_seconds": 1.0})["errors_by_kind"]
    assert set(kinds) <= VOCABULARY and sum(kinds.values()) == len(rows), kinds
    assert kinds == {"unsupported": 12, "corrupt": 12, "empty": 6, "unreadable": 12, "missing": 6,
                     "model_error": 1}, kinds
    assert set(output.ERROR_KINDS) == VOCABULARY
    # The kind an AudioError carries is the kind its message reads as.
    from shardscribe.pipeline.audio import decode_stream

    for data in contents.values():
        with pytest.raises(AudioError) as err:
            decode_stream(io.BytesIO(data))
        assert output.error_kind(str(err.value)) == err.value.kind


def test_hostile_folder_through_the_real_job(tmp_path):
    """The tester's files and a real recording through the CLI (local runner): rows in ==
    rows out, one error row each, kinds from the vocabulary, the real one transcribed."""
    from shardscribe.pipeline import output

    folder = tmp_path / "in"
    folder.mkdir()
    for name, data in {"rate1.wav": RATE_1, "ch1000.wav": CHANNELS_1000, "trunc.wav": TRUNCATED}.items():
        (folder / name).write_bytes(data)
    (folder / "x.wav").mkdir()
    good = sorted(SAMPLES.glob("*.flac"))[0]
    (folder / good.name).write_bytes(good.read_bytes())
    dst = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(folder), "--output",
                           str(dst), "--runner", "local", "--config", "ar"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}
    summary = json.loads((dst / output.SUMMARY_NAME).read_text())
    assert summary["rows_in"] == summary["rows_out"] == len(rows) == 5
    assert summary["errors_by_kind"] == {"unsupported": 2, "corrupt": 1, "unreadable": 1}, summary
    assert "it is a directory" in rows["x.wav"]["error"]
    assert all(rows[n]["error"] and rows[n]["text"] is None for n in ("rate1.wav", "ch1000.wav", "trunc.wav"))
    assert rows[good.name]["error"] is None and rows[good.name]["text"]
