"""Greedy RNN-T and TDT decoding by label-looping, "Label-Looping: Highly Efficient
Decoding for Transducers" (Bataev, Xu, Galvez, Lavrukhin, Ginsburg; Algorithm 2, and §3's
CUDA graphs), NeMo's formulation, over static buffers.

The outer loop is over labels: each iteration the prediction network reads, for every
row at once, the label the row found last (:func:`label_step`'s first part). The inner
loop finds each row's next label with the joint alone: a row whose argmax is blank moves
on by a frame (TDT: by the predicted duration) and reads the joint again at its new frame
with the same predictor output; the frame advance is a tensor update under masks, never a
Python branch. A row that finds a label waits, masked, until the next outer iteration
feeds it to the predictor. The inner loop runs ``inner`` joint steps per outer iteration,
so a step has a fixed shape and can be captured into a CUDA graph; rows still looking
after ``inner`` steps go on looking in the next iteration.

The rules are :func:`pipeline.decoding.transducer.greedy.transducer_greedy`'s (the eager
reference, transformers' ``generate`` with NeMo's max-symbols guard for TDT): a blank
predicted with duration 0 moves one frame; the ``max_symbols``-th token at one frame moves
on too. Every row sees the same sequence of (frame, predictor state) joints as in the
reference and adds the same log-probs in the same order, so tokens, frames and scores are
identical (bit for bit where the arithmetic is: on a GPU both step every row, masked; on
a CPU the predictor steps only the rows that emitted, which is the reference's own subset
when ``inner`` is 1).

No tensor is read back inside a step; the loop reads the end test once every
``check_every`` steps (steps after the end change nothing).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import advance_predictor, copy_state_, greedy_choice
from .greedy import GreedyResult, transducer_greedy
from .loop_graphs import GraphCache, StepGraph
from .static_state import LabelLoopState, frame_bucket

if TYPE_CHECKING:
    from ...models.base import TransducerModel

LOOPS = ("auto", "eager", "static", "cuda_graph")
# On a CPU the static loop costs what the eager one does (same joints, same predictor
# subsets; measured in docs/transducer.md), so the reference keeps the CPU.
CPU_LOOP = "eager"


def _find_label(model: TransducerModel, s: LabelLoopState, durations, max_symbols: int) -> None:
    """One inner step: the joint of every row still looking for a label, in place."""
    searching = (s.t < s.lengths) & ~s.pending
    frame = s.frames[s.rows, s.t.clamp(max=s.frames.shape[1] - 1)]
    tok_lp, dur_lp = model.joint(frame, model.predictor_output(s.pred))
    token, blank, advance, step_lp, symbols = greedy_choice(tok_lp, dur_lp, model.blank, durations, s.symbols,
                                                           max_symbols)
    emit = searching & ~blank
    # written for every row at its next free slot; only an emission moves the slot on
    s.tokens.scatter_(1, s.count[:, None], token[:, None])
    s.at.scatter_(1, s.count[:, None], s.t[:, None])
    s.count.add_(emit.long())
    s.score.copy_(s.score + torch.where(searching, step_lp, 0.0))
    s.symbols.copy_(torch.where(searching, symbols, s.symbols))
    s.t.copy_(torch.where(searching, s.t + advance, s.t))
    s.label.copy_(torch.where(emit, token, s.label))
    s.pending.logical_or_(emit)


def label_step(model: TransducerModel, s: LabelLoopState, durations, max_symbols: int, inner: int,
               masked: bool | None) -> None:
    """One outer iteration: the predictor reads the pending labels, then ``inner`` joint
    steps look for every row's next label."""
    copy_state_(s.pred, advance_predictor(model, s.pred, s.label, s.pending, masked=masked))
    s.pending.zero_()
    for _ in range(inner):
        _find_label(model, s, durations, max_symbols)


class StaticGreedyLoop:
    """The label-looping loop over one bucket's buffers, optionally captured."""

    def __init__(self, model: TransducerModel, rows: int, frames: int, width: int, dtype, device, max_symbols: int,
                 inner: int, masked: bool | None, capture: bool, first=None):
        self.model, self.max_symbols = model, max_symbols
        self.state = LabelLoopState.allocate(model, rows, frames, width, dtype, device, max_symbols)
        self.durations = None if model.durations is None else torch.tensor(model.durations, device=device)

        def body():
            label_step(model, self.state, self.durations, max_symbols, inner, masked)

        def reset():
            if first is not None:
                self.state.load(model, *first)
        self.step = StepGraph(body, reset, device, capture)

    def run(self, frames: torch.Tensor, lengths: torch.Tensor, check_every: int) -> GreedyResult:
        s = self.state
        b, t_max = frames.shape[:2]
        s.load(self.model, frames, lengths)
        # each outer step makes progress on every unfinished row: the reference's bound
        for i in range(max(t_max, 1) * self.max_symbols + 1):
            if i % check_every == 0 and bool(s.done()):
                break
            self.step()
        count = s.count.cpu().tolist()
        tok, at = s.tokens.cpu(), s.at.cpu()
        return GreedyResult([tok[i, :count[i]].tolist() for i in range(b)],
                            [at[i, :count[i]].tolist() for i in range(b)], s.score.clone())


class LabelLoopingGreedy:
    """Greedy transducer decoding: ``__call__(frames [B, T, H], lengths [B]) ->
    GreedyResult``, equal to :func:`transducer_greedy`.

    Args:
        model: a :class:`pipeline.models.base.TransducerModel`.
        max_symbols: tokens per frame (default: the model's).
        use_cuda_graphs: on CUDA, capture the step per bucket (else eager decoding).
        loop: "auto" (CUDA graphs on CUDA when enabled, ``CPU_LOOP`` on a CPU), or one of
            "eager", "static" (the buffers without capture), "cuda_graph".
        inner: joint steps per outer iteration (default: 2 for RNN-T, whose every frame
            ends in a blank, with a masked predictor; else 1: TDT blanks jump frames, and
            an unmasked predictor with one inner step reads the reference's own rows).
        masked: step the predictor on every row, masked (None: on a GPU).
        check_every: steps between reads of the end test (default: 8 on CUDA, else 1).
    ``last_loop`` names the loop the last call ran.
    """

    def __init__(self, model: TransducerModel, max_symbols: int | None = None, use_cuda_graphs: bool = True,
                 loop: str = "auto", inner: int | None = None, masked: bool | None = None,
                 check_every: int | None = None):
        if loop not in LOOPS:
            raise ValueError(f"loop must be one of {LOOPS}")
        self.model = model
        self.max_symbols = int(max_symbols or model.max_symbols)
        self.use_cuda_graphs, self.loop = use_cuda_graphs, loop
        self.inner = inner
        self.masked, self.check_every = masked, check_every
        self.graphs = GraphCache()
        self.last_loop: str | None = None

    def _choose(self, device) -> str:
        if self.loop != "auto":
            return self.loop
        if device.type == "cuda":
            return "cuda_graph" if self.use_cuda_graphs else "eager"
        return CPU_LOOP

    @torch.inference_mode()
    def __call__(self, frames: torch.Tensor, lengths: torch.Tensor) -> GreedyResult:
        mode = self._choose(frames.device)
        if mode != "eager" and frames.shape[1] > 0:
            out = self._static(frames, lengths, capture=mode == "cuda_graph")
            if out is not None:
                self.last_loop = mode
                return out
        self.last_loop = "eager"
        return transducer_greedy(self.model, frames, lengths, self.max_symbols)

    def _static(self, frames, lengths, capture: bool) -> GreedyResult | None:
        b, t, h = frames.shape
        device = frames.device
        lengths = lengths.to(device=device, dtype=torch.long)
        bucket = frame_bucket(t)
        masked = self.masked if self.masked is not None else device.type != "cpu"
        # unmasked (a CPU), only one inner step keeps the reference's predictor subsets
        inner = self.inner or (2 if masked and self.model.durations is None else 1)

        def build():
            return StaticGreedyLoop(self.model, b, bucket, h, frames.dtype, device, self.max_symbols, inner,
                                    masked, capture, first=(frames, lengths))
        key = (b, bucket, h, frames.dtype, str(device), capture, inner, masked)
        if capture:
            loop = self.graphs.get(key, build)
            if loop is None:
                return None
        else:
            loop = build()
        check = self.check_every or (8 if device.type == "cuda" else 1)
        return loop.run(frames, lengths, check)
