"""Frozen-encoder states of the transcribed segments a CTC draft head learns from
("Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts": the draft head
reads the frozen encoder's states, as SSD computes them at inference).

Each kept recording is read and cut again exactly as the job cut it (pipeline.prepare
with the job's VAD settings), so a segment's audio is the audio its transcript was
decoded from; a recording whose segments no longer line up with its row's (the file
changed since) is left out and counted. Segments are encoded by the model adapter's own
``encode`` (the path the ``ssd`` decoder takes), so the head trains on the states it will
draft from: the same window padding, encoder dtype and micro-batching. Rows come out in
the form the head's fitting loop reads (pipeline.models.whisper.ctc_head_fit): ``id``,
``text`` (the segment's AR transcript), ``states`` [valid frames, D] fp16 on the CPU,
plus ``row_id`` and ``seconds``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

# Start times of the re-cut segments must agree with the row's within this (seconds).
START_TOLERANCE_S = 1e-3


@dataclass
class StatesTally:
    recordings: int = 0
    segments: int = 0                # segments with text, no error and no filter reason, encoded
    empty_segments: int = 0          # no text: nothing for CTC to learn
    filtered_segments: int = 0       # a segment filter reason on a kept row
    unmatched_recordings: int = 0    # re-cut segments differ from the row's (file changed) or unreadable
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def _segmenter(audio: dict):
    from ..segment import VadSegmenter

    return VadSegmenter(audio["max_segment_s"], audio["vad_threshold"], audio["vad_pad_s"])


def _prepared(row: dict, segmenter, audio: dict) -> dict:
    from ..prepare import prepare_row

    # duration_s is the span the job decoded from offset_s: a manifest span's length (a
    # whole file's row is read whole again).
    source = {"id": row["id"], "audio": row["audio"], "offset_s": row.get("offset_s"),
              "duration_s": row.get("duration_s") if row.get("offset_s") is not None else None}
    return prepare_row(source, segmenter, audio["resample_quality"], audio["max_seconds"])


def _lined_up(row: dict, prepared: dict) -> bool:
    segments = row.get("segments") or []
    return (not prepared["error"] and len(prepared["seg_start"]) == len(segments)
            and all(abs(a - s["start"]) <= START_TOLERANCE_S for a, s in zip(prepared["seg_start"], segments)))


def segment_audio(rows: list[dict], audio: dict, tally: StatesTally) -> list[dict]:
    """(``id``, ``row_id``, ``text``, ``audio``) per usable segment of ``rows`` (output rows
    the keep rule kept); ``audio``: the job's audio settings (max_segment_s, vad_threshold,
    vad_pad_s, resample_quality, max_seconds)."""
    from ..audio import SAMPLE_RATE
    from ..device import torch_threads

    with torch_threads(1):
        segmenter = _segmenter(audio)
    out = []
    for row in rows:
        with torch_threads(1):
            prepared = _prepared(row, segmenter, audio)
        if not _lined_up(row, prepared):
            tally.unmatched_recordings += 1
            continue
        tally.recordings += 1
        for i, (seg, samples) in enumerate(zip(row["segments"], prepared["seg_audio"])):
            text = (seg.get("text") or "").strip()
            if seg.get("error"):
                continue
            if seg.get("filter_reasons"):
                tally.filtered_segments += 1
                continue
            if not text:
                tally.empty_segments += 1
                continue
            out.append({"id": f"{row['id']}#{i}", "row_id": row["id"], "text": text, "audio": samples,
                        "seconds": len(samples) / SAMPLE_RATE})
    return out


@torch.inference_mode()
def encode_segments(adapter, segments: list[dict], tally: StatesTally, batch_segments: int = 8,
                    log=print) -> list[dict]:
    """The segments with their ``states`` (valid frames, fp16, CPU) in place of ``audio``,
    longest first in batches of ``batch_segments`` (the encoder always reads a 30-s window,
    so batching by length only keeps the memory of a batch even)."""
    order = sorted(range(len(segments)), key=lambda i: -len(segments[i]["audio"]))
    out: list[dict | None] = [None] * len(segments)
    for k in range(0, len(order), batch_segments):
        idx = order[k:k + batch_segments]
        enc = adapter.encode([segments[i]["audio"] for i in idx])
        for j, i in enumerate(idx):
            n = int(enc.valid_frames[j])
            seg = {key: v for key, v in segments[i].items() if key != "audio"}
            out[i] = seg | {"states": enc.states[j, :n].to("cpu", torch.float16).contiguous()}
            tally.segments += 1
            tally.seconds += seg["seconds"]
        if log and (k // batch_segments) % 25 == 24:
            log(f"states: {k + len(idx)}/{len(order)} segments encoded")
    return out
