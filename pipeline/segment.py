"""Segmentation of long recordings into <= 30-s pieces cut at pauses (silero-vad).

Recordings that fit Whisper's window are never cut. Longer ones: silero-vad finds speech
spans (itself splitting any span longer than the limit at its longest internal silence);
consecutive spans are packed greedily into segments no longer than the limit, so every
cut falls in a pause and every speech span lands in exactly one segment. Only stretches
that the VAD judges non-speech between segments are left out; a span the VAD cannot split
is cut hard at the limit rather than truncated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .audio import SAMPLE_RATE
from .device import torch_threads


@dataclass(frozen=True)
class Segment:
    start: int  # sample index, inclusive
    end: int    # sample index, exclusive


class VadSegmenter:
    def __init__(self, max_segment_s: float = 30.0, threshold: float = 0.5, pad_s: float = 0.2):
        with torch_threads():  # silero-vad's import sets torch's process-wide thread count to 1
            from silero_vad import load_silero_vad

            self.model = load_silero_vad()
        self.max_len = int(max_segment_s * SAMPLE_RATE)
        self.threshold = threshold
        self.pad_ms = int(pad_s * 1000)
        self.max_segment_s = max_segment_s

    def speech_spans(self, audio: np.ndarray) -> list[Segment]:
        from silero_vad import get_speech_timestamps

        # Leave room for the padding silero adds on both sides of a span.
        limit_s = max(1.0, self.max_segment_s - 2 * self.pad_ms / 1000 - 0.1)
        # One thread: the VAD runs in a row's reader thread (pipeline.prepare), beside the
        # model's threads in the in-process runner, and a thread starts at torch's default
        # count (every CPU), whatever its caller set. Two teams on two cores turned an
        # hour of silence from 27 s of VAD into 120 s; alone, one thread costs 1.3x two.
        with torch_threads(1):
            stamps = get_speech_timestamps(torch.from_numpy(audio), self.model, threshold=self.threshold,
                                           sampling_rate=SAMPLE_RATE, max_speech_duration_s=limit_s,
                                           speech_pad_ms=self.pad_ms)
        return [Segment(int(s["start"]), int(s["end"])) for s in stamps]

    def __call__(self, audio: np.ndarray) -> list[Segment]:
        n = len(audio)
        if n <= self.max_len:
            return [Segment(0, n)]
        return pack_spans(self.speech_spans(audio), self.max_len)


def pack_spans(spans: list[Segment], max_len: int) -> list[Segment]:
    """Greedily merge sorted speech spans into segments of at most ``max_len`` samples."""
    out: list[Segment] = []
    for span in spans:
        for piece in hard_split(span, max_len):
            if out and piece.end - out[-1].start <= max_len:
                out[-1] = Segment(out[-1].start, piece.end)
            else:
                out.append(piece)
    return out


def hard_split(span: Segment, max_len: int) -> list[Segment]:
    length = span.end - span.start
    if length <= max_len:
        return [span]
    pieces = -(-length // max_len)
    step = -(-length // pieces)
    return [Segment(s, min(s + step, span.end)) for s in range(span.start, span.end, step)]
