"""Turn prepared recordings into output rows with a segment decoder.

Segments of all recordings in a batch are pooled, sorted by length and packed under the
padded-token budget (pipeline.batching), decoded, then put back per recording. A failure
while decoding one sub-batch retries its segments one at a time, so only the segment that
really fails marks its recording with an `error`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.batching import pack_by_budget
from pipeline.decoding.ar_greedy import greedy_decode
from pipeline.records import recording_stage

ENCODER_FRAMES = 1500  # Whisper encodes a fixed 30-s window per segment


@dataclass
class SegmentResult:
    text: str
    stage: str
    tokens: int
    t_encode_s: float
    t_decode_s: float
    error: str | None = None


class ARSegmentDecoder:
    """Full autoregressive greedy decoding of each segment (the baseline)."""

    name = "ar"

    def __init__(self, adapter, max_new_tokens: int = 224):
        self.adapter = adapter
        self.max_new_tokens = max_new_tokens

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        t0 = time.perf_counter()
        enc = self.adapter.encode(audios)
        _sync(enc.states)
        t1 = time.perf_counter()
        tokens = greedy_decode(self.adapter, enc.states, max_new_tokens=self.max_new_tokens)
        t2 = time.perf_counter()
        n = len(audios)
        return [SegmentResult(self.adapter.text(t), "ar", len(t), (t1 - t0) / n, (t2 - t1) / n)
                for t in tokens]


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def decode_segments(decoder, audios: list[np.ndarray], max_tokens: int) -> list[SegmentResult]:
    results: list[SegmentResult | None] = [None] * len(audios)
    for batch in pack_by_budget([ENCODER_FRAMES] * len(audios), max_tokens):
        try:
            outs = decoder.decode([audios[i] for i in batch])
        except Exception:
            outs = [_decode_one(decoder, audios[i]) for i in batch]
        for i, res in zip(batch, outs):
            results[i] = res
    return results


def _decode_one(decoder, audio: np.ndarray) -> SegmentResult:
    try:
        return decoder.decode([audio])[0]
    except Exception as exc:
        return SegmentResult("", "error", 0, 0.0, 0.0, f"{type(exc).__name__} while decoding: {exc}")


def transcribe_prepared(rows: list[dict], decoder, max_tokens: int) -> list[dict]:
    """Output rows (records.OUTPUT_SCHEMA) for prepared rows, one per input row."""
    flat: list[tuple[int, int]] = []
    audios: list[np.ndarray] = []
    for r, row in enumerate(rows):
        if row.get("error"):
            continue
        for s, audio in enumerate(row["seg_audio"]):
            flat.append((r, s))
            audios.append(np.asarray(audio, dtype=np.float32))
    results = decode_segments(decoder, audios, max_tokens) if audios else []
    per_row: dict[int, list[tuple[int, SegmentResult]]] = {}
    for (r, s), res in zip(flat, results):
        per_row.setdefault(r, []).append((s, res))
    out = []
    for r, row in enumerate(rows):
        segs = sorted(per_row.get(r, []), key=lambda x: x[0])
        error = row.get("error") or next((res.error for _, res in segs if res.error), None)
        segments = [{"start": row["seg_start"][s], "end": row["seg_end"][s], "text": res.text,
                     "stage": res.stage, "tokens": res.tokens} for s, res in segs]
        out.append({
            "id": row["id"], "audio": row["audio"], "duration_s": row.get("duration_s"),
            "text": None if error else " ".join(t for t in (sg["text"] for sg in segments) if t),
            "reference": row.get("reference"), "segments": segments,
            "stage": recording_stage([sg["stage"] for sg in segments], error),
            "error": error, "decoder": decoder.name,
            "t_prepare_s": row.get("t_prepare_s"),
            "t_encode_s": sum(res.t_encode_s for _, res in segs),
            "t_decode_s": sum(res.t_decode_s for _, res in segs),
        })
    return out
