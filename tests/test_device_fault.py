"""A failure that leaves the device unusable (a CUDA device-side assert) stops the job
instead of being isolated by halving: on a poisoned context every later batch fails too, so
isolating would turn each remaining recording into an error row. The rows committed
before it stay and a rerun resumes after them. Out of memory is still isolated (a smaller
batch succeeds)."""
from __future__ import annotations

import contextlib
import io
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from shardscribe.pipeline.kinds.base import PENDING, SegmentResult
from shardscribe.pipeline.device import DeviceFault, is_device_fault
from shardscribe.pipeline.segment_runner import complete_pending, decode_segments

ASSERT = "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."


class PoisonedDevice:
    """Raises ``error`` on any batch holding a segment whose first sample is negative."""
    name = "poisoned"

    def __init__(self, error: Exception):
        self.error, self.calls = error, 0

    def segment_cost(self, audio) -> int:
        return 1

    def decode(self, audios):
        self.calls += 1
        if any(a[0] < 0 for a in audios):
            raise self.error
        return [SegmentResult(f"{a[0]:.0f}", "ok") for a in audios]


def _audios(n: int, bad: int) -> list[np.ndarray]:
    audios = [np.full(4, float(i), dtype=np.float32) for i in range(n)]
    audios[bad] = -audios[bad] - 1
    return audios


def test_which_errors_poison_the_device():
    assert is_device_fault(torch.AcceleratorError(ASSERT))
    assert is_device_fault(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_device_fault(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_device_fault(RuntimeError("shape mismatch"))


def test_a_device_side_assert_stops_decoding_at_once():
    decoder = PoisonedDevice(torch.AcceleratorError(ASSERT))
    with pytest.raises(DeviceFault, match="the device failed while decoding .*device-side assert.*resumes") as info:
        decode_segments(decoder, _audios(16, 9), max_tokens=16)
    assert decoder.calls == 1                       # no halving on a dead context
    assert isinstance(info.value.__cause__, torch.AcceleratorError)


def test_out_of_memory_is_still_isolated_to_its_segment():
    decoder = PoisonedDevice(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    results = decode_segments(decoder, _audios(16, 9), max_tokens=16)
    assert [r.error is not None for r in results] == [i == 9 for i in range(16)]


def test_the_second_stage_stops_on_a_poisoned_device_too():
    class State:
        @staticmethod
        def from_bytes(b):
            return b

    class Finisher:
        name, pending_type = "poisoned_finisher", State

        def cost(self, result) -> int:
            return 1

        def finish(self, results) -> float:
            raise torch.AcceleratorError(ASSERT)

    seg = {"start": 0.0, "end": 1.0, "text": "", "stage": PENDING, "tokens": 0, "max_entropy": 0.0,
           "min_prob": 0.0, "prefix_len": 0, "drafted": 0, "generated": 0, "error": None}
    rows = [{"id": str(i), "segments": [dict(seg)], "pending_index": [0], "pending_state": [b"x"],
             "key_phrases": None, "prepare_error": None} for i in range(4)]
    with pytest.raises(DeviceFault, match="in poisoned_finisher"):
        complete_pending(rows, Finisher(), max_tokens=8)


@pytest.mark.slow
def test_the_job_stops_keeps_what_it_committed_and_the_rerun_does_the_rest(tmp_path, samples_dir, model_cache,
                                                                            monkeypatch):
    """A local-runner job whose second batch hits a device-side assert: exit 1 with one
    line naming it, the first batch's rows committed with no error rows, and the same
    command then transcribes only the rest."""
    from shardscribe.jobs.cli import main
    from shardscribe.pipeline.kinds.ar.stage import ARSegmentDecoder

    audio = tmp_path / "audio"
    audio.mkdir()
    clips = sorted(p for p in samples_dir.iterdir() if p.suffix in (".wav", ".flac"))[:6]
    assert len(clips) == 6
    for p in clips:
        shutil.copy(p, audio / p.name)
    out = tmp_path / "out"
    args = ["transcribe", "--input", str(audio), "--output", str(out), "--runner", "local", "--config", "ar",
            "--quiet", "--set", f"model.cache_dir={model_cache}", "--set", "batching.recordings_per_batch=2"]
    real_decode, calls = ARSegmentDecoder.decode, []

    def decode(self, audios, *a, **kw):
        calls.append(len(audios))
        if len(calls) >= 2:   # a poisoned context: every call from the second on fails
            raise torch.AcceleratorError(ASSERT)
        return real_decode(self, audios, *a, **kw)

    monkeypatch.setattr(ARSegmentDecoder, "decode", decode)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    assert code not in (0, None), err.getvalue()
    assert "the device failed while decoding (AcceleratorError: CUDA error: device-side assert" in err.getvalue()
    assert len(calls) == 2                           # stopped, not isolated segment by segment
    kept = pq.read_table(out).to_pylist()
    assert kept and all(r["error"] is None and r["text"] for r in kept), kept
    monkeypatch.setattr(ARSegmentDecoder, "decode", real_decode)
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        assert main(args) in (0, None)
    rows = pq.read_table(out).to_pylist()
    assert sorted(r["id"] for r in rows) == sorted(p.name for p in clips)
    assert all(r["error"] is None for r in rows)
    import json

    summary = json.loads((out / "__shardscribe__" / "summary.json").read_text())
    assert summary["run_rows"] == len(clips) - len(kept)
