"""Window packing for encoders with a fixed input window (Whisper: 30 s).

Whisper's encoder costs the same for a 3-s clip as for 30 s, so a decoder that reads only
the encoder states (greedy CTC, CTC beam search) can place several short clips, with
short silences between them, in one window, encode the window once and cut each clip's
states back out. The embedded CTC head was trained on exactly such packed windows
(pipeline.training.ctc_features.encode_packed_shard: these same functions, with
random gaps), so its outputs on a packed clip are in distribution. Autoregressive decoders
cannot use this: Whisper's decoder would read the whole window. SSD's packed gate
(pipeline.kinds.ssd.stages.SSDFirstPassDecoder) uses it for the draft and the gate only, and
encodes the clips the gate rejects again alone.

This module is the pure part: which clip goes where (first fit in input order, clip
starts on the encoder's state grid so a clip's states line up as they do alone) and the
packed signals.

Under full attention a packed clip's states, hence its text, depend on the clips beside
it. ``plan_sequences``/``block_mask`` serve isolated packing instead (what
``decoder.pack_windows`` runs, WhisperAdapter.encode_packed without ``keep_windows``):
each clip's log-mel and convolutions are computed alone, it keeps its own positions
0..n-1, and several clips share one encoder sequence under a block-diagonal attention
mask, so the sequence costs one pass and no clip sees another.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Placement:
    window: int    # index of the packed window
    start: int     # first sample of the clip in that window (a multiple of the grid)
    length: int    # samples


def plan_windows(lengths: list[int], window: int, gap: int | Sequence[int], grid: int) -> list[Placement]:
    """One placement per clip, in input order. A clip goes into the current window when it
    fits after a ``gap`` (rounded up to the grid) and otherwise opens a new one; clips
    start on multiples of ``grid``. ``gap``: samples, the same for every clip (inference)
    or one per clip (the CTC head's training windows draw them at random). Raises on a clip
    longer than the window."""
    gaps = [gap] * len(lengths) if np.ndim(gap) == 0 else list(gap)
    if len(gaps) != len(lengths):
        raise ValueError(f"{len(gaps)} gaps for {len(lengths)} clips")
    placements, current, used = [], -1, window
    for n, g in zip(lengths, gaps):
        if n > window:
            raise ValueError(f"clip of {n} samples exceeds the {window}-sample window")
        start = -(-used // grid) * grid + -(-g // grid) * grid
        if current < 0 or start + n > window:
            current, start = current + 1, 0
        placements.append(Placement(current, start, n))
        used = start + n
    return placements


def pack_signals(audios: list[np.ndarray], placements: list[Placement], window: int) -> list[np.ndarray]:
    """The packed window signals. Each clip is scaled to the peak level of the first clip
    in its window: Whisper's log-mel floor is (window max - 8), so a quiet clip beside a
    loud one would lose its low-level detail (the head's training windows do the same)."""
    n_windows = 1 + max((p.window for p in placements), default=-1)
    signals = [np.zeros(window, np.float32) for _ in range(n_windows)]
    level: dict[int, float] = {}
    for audio, p in zip(audios, placements):
        peak = float(np.abs(audio).max()) if len(audio) else 0.0
        ref = level.setdefault(p.window, peak or 1.0)
        scaled = audio * (ref / peak) if peak > 0 else audio
        signals[p.window][p.start:p.start + p.length] = scaled
    return signals


def plan_sequences(lengths: list[int], capacity: int) -> list[tuple[int, int]]:
    """Isolated packing: (sequence, offset) per clip of ``lengths`` encoder states, first
    fit in input order into sequences of at most ``capacity`` states. Each clip attends
    only to itself there (``block_mask``), so where it lands changes nothing it computes."""
    out, seq, used = [], -1, capacity
    for n in lengths:
        if n > capacity:
            raise ValueError(f"clip of {n} states exceeds the {capacity}-state sequence")
        if used + n > capacity:
            seq, used = seq + 1, 0
        out.append((seq, used))
        used += n
    return out


def block_mask(spans: list[list[tuple[int, int]]], length: int) -> np.ndarray:
    """[sequences, length, length] booleans, True where a query may attend to a key: within
    its own clip's span ``(offset, states)``; the unused tail of a sequence attends to itself."""
    mask = np.zeros((len(spans), length, length), bool)
    for b, seq in enumerate(spans):
        end = 0
        for off, n in seq:
            mask[b, off:off + n, off:off + n] = True
            end = max(end, off + n)
        mask[b, end:, end:] = True
    return mask
