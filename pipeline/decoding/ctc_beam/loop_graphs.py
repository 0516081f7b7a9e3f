"""CUDA-graph replay of the frame step of "FlexCTC: GPU-powered CTC Beam Decoding with
advanced Contextual Abilities" (§III-D, CUDA Graphs).

The frame step (:class:`pipeline.decoding.ctc_beam.step.FrameStep`) is captured once per
input shape into a CUDA graph over static buffers: the frames [T, B, W], the pruning
thresholds, the beams, the trie storage and a device-side frame counter ``t`` that the
graph itself increments. Decoding then replays the graph once per frame: no host sync and
no kernel-launch overhead per frame. The step is the same function eager mode runs, so
results are identical. Where capture fails (no CUDA, or a fusion model whose lookups sync
with the host, e.g. a data-dependent ``int(...)``) the loop reports ``ok = False`` and
the search falls back to eager mode.

``capture=False`` runs the static-buffer loop without a graph, which lets CPU tests check
the buffer plumbing (``index_select``/``index_copy_`` by the device-side counter).
"""
from __future__ import annotations

import logging

import torch

from .state import NEG_INF, Beams, Frames
from .step import FrameStep

log = logging.getLogger(__name__)


class GraphedFrameLoop:
    """The frame loop over static buffers shaped like ``frames``, captured into a CUDA
    graph (``capture``) after a warm-up from the ``initial`` beams."""

    def __init__(self, step: FrameStep, frames: Frames, fusion: list, lookups: list, initial: Beams,
                 track_beams: bool, capture: bool = True):
        self.step, self.fusion, self.lookups = step, fusion, lookups
        # the graph bakes V in as a constant: a different vocabulary needs a new capture
        self.vocab = step.vocab
        self.track_beams = track_beams
        values = frames.values
        self.shape, self.device = tuple(values.shape), values.device
        t, b, _ = values.shape
        k = initial.scores.shape[1]
        dev = values.device
        self.values = torch.zeros_like(values)
        self.tokens = None if frames.tokens is None else torch.zeros_like(frames.tokens)
        # without FLToP the LM ids are one constant row, else one row per frame
        self.lm_tokens = torch.zeros_like(frames.lm_tokens)
        self.per_frame_lm = frames.tokens is not None
        self.thresholds = torch.zeros((t, b), device=dev)
        self.weights = torch.zeros((t, b), device=dev)
        self.t = torch.zeros(1, dtype=torch.int64, device=dev)
        zeros = lambda: torch.zeros((b, k), dtype=torch.int64, device=dev)  # noqa: E731
        self.beams = Beams(torch.zeros((b, k), device=dev), zeros(), zeros(), [zeros() for _ in fusion])
        self.choices = torch.zeros((t, b, k), dtype=torch.int64, device=dev)
        self.alive = torch.zeros(b, device=dev)
        self.graph = None
        self.ok = True
        if capture:
            try:
                self._capture(frames, initial)
            except Exception as exc:  # capture is an optimisation: never fail the decode
                log.warning("CUDA graph capture failed (%s); using eager mode", exc)
                self.ok = False

    def matches(self, frames: Frames, fusion: list, lookups: list, step: FrameStep) -> bool:
        return (tuple(frames.values.shape) == self.shape and frames.values.device == self.device
                and (frames.tokens is None) == (self.tokens is None)
                and tuple(frames.lm_tokens.shape) == tuple(self.lm_tokens.shape)
                and step is self.step and step.vocab == self.vocab
                and [id(m) for m, _ in fusion] == [id(m) for m, _ in self.fusion]
                and [a for _, a in fusion] == [a for _, a in self.fusion]
                and [id(x) for x in lookups] == [id(x) for x in self.lookups])

    def _body(self) -> None:
        values = self.values.index_select(0, self.t)[0]
        tokens = None if self.tokens is None else self.tokens.index_select(0, self.t)[0]
        lm_tokens = self.lm_tokens.index_select(0, self.t)[0] if self.per_frame_lm else self.lm_tokens
        threshold = self.thresholds.index_select(0, self.t)[0]
        new, choice = self.step(self.beams, values, tokens, lm_tokens, threshold, self.lookups)
        self._set_beams(new)
        self.choices.index_copy_(0, self.t, choice[None])
        if self.track_beams:
            live = (new.scores > NEG_INF).sum(1) * self.weights.index_select(0, self.t)[0]
            self.alive.add_(live)
        self.t.add_(1)

    def _load(self, beams: Beams) -> None:
        self.t.zero_()
        self.alive.zero_()
        self._set_beams(beams)

    def _set_beams(self, beams: Beams) -> None:
        """Copy ``beams`` into the static buffers (in place: the graph reads these)."""
        for dst, src in zip(self._static(), [beams.scores, beams.last, beams.key, *beams.fusion]):
            dst.copy_(src)

    def _static(self) -> list[torch.Tensor]:
        b = self.beams
        return [b.scores, b.last, b.key, *b.fusion]

    def _capture(self, frames: Frames, initial: Beams) -> None:
        self._fill(frames)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up outside the graph (allocator, lazy init)
            self._load(initial)
            for _ in range(2):
                self._body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._load(initial)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body()
        self.graph = graph

    def _fill(self, frames: Frames) -> None:
        self.values.copy_(frames.values)
        if frames.tokens is not None:
            self.tokens.copy_(frames.tokens)
        self.lm_tokens.copy_(frames.lm_tokens)
        self.thresholds.copy_(frames.thresholds)
        self.weights.copy_(frames.weights)

    def run(self, frames: Frames, beams: Beams, lookups: list):
        """Replay the step for the ``frames.steps`` frames to search (compressed runs
        need fewer than the buffers hold): ``(beams, choices, alive)`` as
        :func:`pipeline.decoding.ctc_beam.loop_eager.eager_loop` returns them."""
        self._fill(frames)
        self._load(beams)
        for _ in range(frames.steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._body()
        alive = self.alive.clone() if self.track_beams else None
        return self.beams.clone(), self.choices[:frames.steps].clone(), alive
