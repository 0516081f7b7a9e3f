"""Per-row isolation in the segment runner: a batch whose decode raises is decoded again in
halves, so only the segment that fails gets an error, in about 2 log2(n) extra calls."""
from __future__ import annotations

import math

import numpy as np

from shardscribe.pipeline.kinds.base import PENDING, SegmentResult
from shardscribe.pipeline.segment_runner import complete_pending, decode_segments


class Fragile:
    """Raises on any batch holding a segment whose first sample is negative."""
    name = "fragile"

    def __init__(self):
        self.calls = 0

    def segment_cost(self, audio) -> int:
        return 1

    def decode(self, audios):
        self.calls += 1
        if any(a[0] < 0 for a in audios):
            raise RuntimeError("bad segment in batch")
        return [SegmentResult(f"{a[0]:.0f}", "ok") for a in audios]


def test_only_the_bad_segment_errors_and_halving_is_cheap():
    n, bad = 64, 37
    audios = [np.full(4, float(i), dtype=np.float32) for i in range(n)]
    audios[bad] = -audios[bad] - 1
    decoder = Fragile()
    results = decode_segments(decoder, audios, max_tokens=n)
    assert [r.error is not None for r in results] == [i == bad for i in range(n)]
    assert "bad segment in batch" in results[bad].error and results[bad].stage == "error"
    assert [r.text for i, r in enumerate(results) if i != bad] == [f"{i}" for i in range(n) if i != bad]
    # One call for the batch, then two per level of halving down to the bad segment.
    assert decoder.calls == 1 + 2 * int(math.log2(n))


class FragileFinisher:
    name = "fragile_finisher"
    pending_type = None

    def cost(self, result) -> int:
        return 1

    def finish(self, results) -> float:
        if any(r.key_phrases == ["poison"] for r in results):
            raise ValueError("cannot finish")
        for r in results:
            r.text, r.stage = "done", "finished"
        return 1.0


def test_the_second_stage_isolates_a_failing_item_too():
    class State:
        @staticmethod
        def from_bytes(b):
            return b

    finisher = FragileFinisher()
    finisher.pending_type = State
    rows = []
    for i in range(8):
        seg = {"start": 0.0, "end": 1.0, "text": "", "stage": PENDING, "tokens": 0, "max_entropy": 0.0,
               "min_prob": 0.0, "prefix_len": 0, "drafted": 0, "generated": 0, "error": None}
        rows.append({"id": str(i), "segments": [seg], "pending_index": [0], "pending_state": [b"x"],
                     "key_phrases": ["poison"] if i == 5 else None, "prepare_error": None})
    out = complete_pending(rows, finisher, max_tokens=8)
    assert [r["error"] is not None for r in out] == [i == 5 for i in range(8)]
    assert "cannot finish" in out[5]["error"] and all(r["text"] == "done" for i, r in enumerate(out) if i != 5)
