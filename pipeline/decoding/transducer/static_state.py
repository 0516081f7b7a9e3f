"""Static search state for the transducer loops of "Label-Looping: Highly Efficient
Decoding for Transducers" (Bataev et al.; its CUDA-graph section: every tensor a step
touches is allocated once, before the loop, at a fixed shape) and of the batched beam
searches of "Pushing the Limits of Beam Search Decoding for Transducer-based ASR models"
(§2.1, BatchedBeamHyps in preallocated [B, beam] tensors).

A captured CUDA graph replays fixed kernels on fixed addresses, so a step writes its new
state into these buffers in place, and a batch is copied into buffers shaped for its
bucket: the exact number of rows (another row count can make cuBLAS pick another kernel,
whose sums round differently from eager decoding's) by the frames rounded up
(:func:`frame_bucket`), so one graph serves every batch of that size up to the bucket's
length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from . import clone_state, copy_state_

if TYPE_CHECKING:
    from ...models.base import TransducerModel


def frame_bucket(frames: int) -> int:
    """The buffer length for ``frames`` frames: 16, 24, 32, 48, 64, 96, ... (a power of
    two or 1.5 times one), so there are two graphs per doubling of the length and at most
    a third of a buffer is padding."""
    if frames <= 16:
        return 16
    p = 1 << (frames - 1).bit_length()
    mid = p // 2 * 3 // 2
    return mid if frames <= mid else p


@dataclass
class LabelLoopState:
    """The label-looping greedy search of every row, [B] each, plus its output buffers.

    ``pending`` marks rows that found a label the predictor has not read yet (``label``);
    ``tokens`` / ``at`` [B, L] take each row's emissions at position ``count`` (a write
    past ``count`` is scratch, overwritten by the next emission)."""

    frames: torch.Tensor      # [B, T, H] encoder frames, zero past a row's length
    lengths: torch.Tensor     # [B] int64 valid frames
    rows: torch.Tensor        # [B] arange
    t: torch.Tensor           # [B] int64 current frame
    symbols: torch.Tensor     # [B] int64 tokens emitted at frame t
    score: torch.Tensor       # [B] float32 summed log-probs of the path
    label: torch.Tensor       # [B] int64 the last label found
    pending: torch.Tensor     # [B] bool: ``label`` still to be read by the predictor
    count: torch.Tensor       # [B] int64 tokens emitted
    tokens: torch.Tensor      # [B, L] int64 emitted tokens
    at: torch.Tensor          # [B, L] int64 the frame of each
    pred: tuple               # predictor state, rows = B

    @classmethod
    def allocate(cls, model: TransducerModel, rows: int, frames: int, width: int, dtype, device,
                 max_symbols: int) -> "LabelLoopState":
        long = lambda: torch.zeros(rows, dtype=torch.long, device=device)  # noqa: E731
        # a row emits at most max_symbols tokens per frame, plus one scratch column
        out = frames * max_symbols + 1
        return cls(torch.zeros((rows, frames, width), dtype=dtype, device=device), long(),
                   torch.arange(rows, device=device), long(), long(),
                   torch.zeros(rows, dtype=torch.float32, device=device), long(),
                   torch.zeros(rows, dtype=torch.bool, device=device), long(),
                   torch.zeros((rows, out), dtype=torch.long, device=device),
                   torch.zeros((rows, out), dtype=torch.long, device=device),
                   clone_state(model.predictor_init(rows)))

    def load(self, model: TransducerModel, frames: torch.Tensor, lengths: torch.Tensor) -> None:
        """Start a search over ``frames`` [B, T<=bucket, H] in place."""
        n = frames.shape[1]
        self.frames[:, :n].copy_(frames)
        self.frames[:, n:].zero_()
        self.lengths.copy_(lengths)
        for x in (self.t, self.symbols, self.score, self.label, self.pending, self.count):
            x.zero_()
        copy_state_(self.pred, model.predictor_init(self.lengths.shape[0]))

    def done(self) -> torch.Tensor:
        return (self.t >= self.lengths).all()


@dataclass
class BeamState:
    """ALSD++ / AES++ state in place: the hypotheses (``search._Hyps`` fields, rows of the
    predictor state = B x beam), the trie of every step [S, B, beam] (parent slot, token
    appended or -1, the parent's frame), the step counter ``s`` and, for AES++, the frame
    ``f`` being expanded, both on the device so a replayed graph reads them."""

    frames: torch.Tensor      # [B, T, H]
    lengths: torch.Tensor     # [B] int64
    hyps: object              # search._Hyps of static tensors
    parents: torch.Tensor     # [S, B, K] int64
    tokens: torch.Tensor      # [S, B, K] int64
    at: torch.Tensor          # [S, B, K] int64
    s: torch.Tensor           # [1] int64 steps taken
    f: torch.Tensor           # [1] int64 AES++'s frame

    @classmethod
    def allocate(cls, initial, rows: int, frames: int, width: int, dtype, device, steps: int) -> "BeamState":
        k = initial.score.shape[1]
        trie = lambda: torch.zeros((steps, rows, k), dtype=torch.long, device=device)  # noqa: E731
        hyps = type(initial)(*(x.clone() for x in (initial.score, initial.t, initial.sym, initial.key,
                                                     initial.last)),
                             clone_state(initial.pred), [x.clone() for x in initial.fusion])
        return cls(torch.zeros((rows, frames, width), dtype=dtype, device=device),
                   torch.zeros(rows, dtype=torch.long, device=device), hyps, trie(), trie(), trie(),
                   torch.zeros(1, dtype=torch.long, device=device), torch.zeros(1, dtype=torch.long, device=device))

    def set_hyps(self, new) -> None:
        h = self.hyps
        for dst, src in zip((h.score, h.t, h.sym, h.key, h.last), (new.score, new.t, new.sym, new.key, new.last)):
            dst.copy_(src)
        copy_state_(h.pred, new.pred)
        for dst, src in zip(h.fusion, new.fusion):
            dst.copy_(src)

    def load(self, frames: torch.Tensor, lengths: torch.Tensor, initial) -> None:
        n = frames.shape[1]
        self.frames[:, :n].copy_(frames)
        self.frames[:, n:].zero_()
        self.lengths.copy_(lengths)
        self.set_hyps(initial)
        self.s.zero_()
        self.f.zero_()

    def record(self, parent: torch.Tensor, token: torch.Tensor, frame: torch.Tensor) -> None:
        """Store one step's trie entry at step ``s`` (a device index: no host read)."""
        for dst, src in zip((self.parents, self.tokens, self.at), (parent, token, frame)):
            dst.index_copy_(0, self.s, src[None])
        self.s.add_(1)

    def trie(self, steps: int) -> list:
        """The first ``steps`` entries as ``search._result`` reads them."""
        return [(self.parents[i], self.tokens[i], self.at[i]) for i in range(steps)]
