"""Segmentation of a recording streamed as 16-kHz blocks, in bounded memory.

The whole-recording segmenter (pipeline.segment.VadSegmenter) runs silero-vad over all of
a recording and packs the speech spans greedily into segments. Here the same VAD runs over
a window of ``window_s`` seconds plus ``overlap_s`` of look-ahead: the spans that end
inside the window (seen with at least ``overlap_s`` after them) are final, and the next
window starts where the last of them ends, in the pause after it. A span that crosses the
window's edge is never cut there: it is found again, whole, by the next window. The final
spans go through the same greedy packing, kept open across windows, so a segment is cut
(and handed on) as soon as the next span no longer fits in it.

What is held: the window, its look-ahead and the open segment (at most
``max_segment_s``), whatever the recording's length. silero-vad starts each window with
fresh state in a pause, so span edges can move by up to the VAD's padding against the
whole-recording run; a stretch of speech without a pause longer than the window is cut
where the VAD splits it, as the whole-recording run does, but not always at the same place.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from .segment import Segment, VadSegmenter, hard_split

# Seconds of audio before the first undecided speech span that the next window starts
# with, where no span ended inside the window: the VAD's context and padding.
LEAD_IN_S = 1.0


class SpanPacker:
    """pipeline.segment.pack_spans one span at a time: ``add`` returns the segments that
    the span closes, ``close`` the one still open."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.open: Segment | None = None

    def add(self, span: Segment) -> list[Segment]:
        closed = []
        for piece in hard_split(span, self.max_len):
            if self.open is not None and piece.end - self.open.start <= self.max_len:
                self.open = Segment(self.open.start, piece.end)
            else:
                if self.open is not None:
                    closed.append(self.open)
                self.open = piece
        return closed

    def close(self) -> list[Segment]:
        out, self.open = ([self.open] if self.open is not None else []), None
        return out


class WindowedSegmenter:
    """Segments of a block stream, cut by ``segmenter``'s VAD over windows; ``length``:
    the samples the last stream held (once it is read).

    ``segments(blocks)`` yields ``(segment, its audio, decided)`` as segments are cut:
    sample indices from the stream's start, and ``decided``: the samples before which
    nothing more will be cut (the progress of the stream). A stream no longer than one
    window and its look-ahead is segmented whole, exactly as ``segmenter`` does."""

    def __init__(self, segmenter: VadSegmenter, window_s: float, overlap_s: float, sample_rate: int = 16000):
        self.segmenter = segmenter
        self.window = int(window_s * sample_rate)
        self.overlap = int(overlap_s * sample_rate)
        self.lead_in = int(LEAD_IN_S * sample_rate)
        if self.window <= segmenter.max_len:
            raise ValueError(f"window of {window_s:g} s must be longer than a segment "
                             f"({segmenter.max_len / sample_rate:g} s)")

    def segments(self, blocks: Iterable[np.ndarray], scale=None) -> Iterator[tuple[Segment, np.ndarray, int]]:
        """``scale()``: the factor the audio is multiplied by where it is read (the VAD's
        window, a segment's audio), as it stands then; None: 1."""
        held = _Held(scale)
        base = 0            # where the next VAD window starts
        packer = SpanPacker(self.segmenter.max_len)
        streamed = False
        self.length = 0
        for block in blocks:
            held.add(block)
            while held.end - base >= self.window + self.overlap:
                streamed = True
                spans = self._spans(held, base, held.end)
                final = [s for s in spans if s.end <= base + self.window]
                if final:
                    cut = final[-1].end
                else:
                    later = [s.start for s in spans]
                    cut = max(base + 1, min(base + self.window, later[0] - self.lead_in)) if later \
                        else base + self.window
                for span in final:
                    for seg in packer.add(span):
                        yield seg, held.take(seg), cut
                base = cut
                held.drop_before(min(base, packer.open.start) if packer.open else base)
        self.length = held.end
        if not streamed:    # the short recording: today's whole-recording segmentation
            audio = held.take(Segment(0, held.end))
            for seg in self.segmenter(audio) if len(audio) else []:
                yield seg, audio[seg.start:seg.end], held.end
            return
        for span in self._spans(held, base, held.end):
            for seg in packer.add(span):
                yield seg, held.take(seg), base
        for seg in packer.close():
            yield seg, held.take(seg), held.end

    def _spans(self, held: "_Held", lo: int, hi: int) -> list[Segment]:
        if hi <= lo:
            return []
        return [Segment(s.start + lo, s.end + lo) for s in self.segmenter.speech_spans(held.take(Segment(lo, hi)))]


class _Held:
    """The stream's samples from ``start`` to ``end`` (indices from the stream's start),
    appended block by block and dropped from the front."""

    def __init__(self, scale=None):
        self.buf = np.zeros(0, np.float32)
        self.start = 0
        self.scale = scale

    @property
    def end(self) -> int:
        return self.start + len(self.buf)

    def add(self, block: np.ndarray) -> None:
        self.buf = np.concatenate([self.buf, block]) if len(self.buf) else np.asarray(block, np.float32)

    def take(self, seg: Segment) -> np.ndarray:
        """The samples of ``seg``, scaled: a copy that outlives the buffer."""
        audio = self.buf[seg.start - self.start:seg.end - self.start].copy()
        factor = self.scale() if self.scale is not None else None
        if factor is not None:
            audio *= np.float32(factor)
        return audio

    def drop_before(self, at: int) -> None:
        if at > self.start:
            self.buf = self.buf[at - self.start:].copy()
            self.start = at
