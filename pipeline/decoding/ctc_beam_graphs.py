"""CUDA-graph replay of the FlexCTC frame step (seed 002 §III-D).

The frame step of :class:`pipeline.decoding.ctc_beam.CTCBeamSearch` is captured once per
input shape into a CUDA graph over static buffers: the frames [T, B, V+1], the pruning
thresholds, the beams, the trie storage and a device-side frame counter ``t`` that the
graph itself increments. Decoding then replays the graph T times: no host sync and no
kernel-launch overhead per frame. The step is the same function eager mode runs, so
results are identical. Where capture fails (no CUDA, or a fusion model whose lookups sync
with the host, e.g. a data-dependent ``int(...)``) the loop reports ``ok = False`` and
the search falls back to eager mode.

``capture=False`` runs the static-buffer loop without a graph, which lets CPU tests check
the buffer plumbing (``index_select``/``index_copy_`` by the device-side counter).
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

NEG_INF = float("-inf")


class GraphedFrameLoop:
    def __init__(self, search, frames, fusion, lookups, capture: bool = True):
        from pipeline.decoding.ctc_beam import _Beams

        self.search, self.fusion, self.lookups = search, fusion, lookups
        values = frames.values
        self.shape, self.device = tuple(values.shape), values.device
        t, b, _ = values.shape
        k = search.beam_size
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
        self.beams = _Beams(torch.zeros((b, k), device=dev), zeros(), zeros(), [zeros() for _ in fusion])
        self.choices = torch.zeros((t, b, k), dtype=torch.int64, device=dev)
        self.alive = torch.zeros(b, device=dev)
        self.graph = None
        self.ok = True
        if capture:
            try:
                self._capture(frames)
            except Exception as exc:  # capture is an optimisation: never fail the decode
                log.warning("CUDA graph capture failed (%s); using eager mode", exc)
                self.ok = False

    def matches(self, frames, fusion, lookups) -> bool:
        return (tuple(frames.values.shape) == self.shape and frames.values.device == self.device
                and (frames.tokens is None) == (self.tokens is None)
                and tuple(frames.lm_tokens.shape) == tuple(self.lm_tokens.shape)
                and [id(m) for m, _ in fusion] == [id(m) for m, _ in self.fusion]
                and [a for _, a in fusion] == [a for _, a in self.fusion]
                and [id(x) for x in lookups] == [id(x) for x in self.lookups])

    def _body(self) -> None:
        values = self.values.index_select(0, self.t)[0]
        tokens = None if self.tokens is None else self.tokens.index_select(0, self.t)[0]
        lm_tokens = self.lm_tokens.index_select(0, self.t)[0] if self.per_frame_lm else self.lm_tokens
        threshold = self.thresholds.index_select(0, self.t)[0]
        new, choice = self.search.step(self.beams, values, tokens, lm_tokens, threshold, self.lookups)
        self._set_beams(new)
        self.choices.index_copy_(0, self.t, choice[None])
        if self.search.track_beams:
            live = (new.scores > NEG_INF).sum(1) * self.weights.index_select(0, self.t)[0]
            self.alive.add_(live)
        self.t.add_(1)

    def _load(self, beams) -> None:
        self.t.zero_()
        self.alive.zero_()
        self._set_beams(beams)

    def _set_beams(self, beams) -> None:
        """Copy ``beams`` into the static buffers (in place: the graph reads these)."""
        for dst, src in zip(self._static(), [beams.scores, beams.last, beams.key, *beams.fusion]):
            dst.copy_(src)

    def _static(self) -> list[torch.Tensor]:
        b = self.beams
        return [b.scores, b.last, b.key, *b.fusion]

    def _capture(self, frames) -> None:
        init = self.search._init_beams(self.shape[1], self.device, self.fusion, self.lookups)
        self._fill(frames)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up outside the graph (allocator, lazy init)
            self._load(init)
            for _ in range(2):
                self._body()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._load(init)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body()
        self.graph = graph

    def _fill(self, frames) -> None:
        self.values.copy_(frames.values)
        if frames.tokens is not None:
            self.tokens.copy_(frames.tokens)
        self.lm_tokens.copy_(frames.lm_tokens)
        self.thresholds.copy_(frames.thresholds)
        self.weights.copy_(frames.weights)

    def run(self, frames, beams, lookups):
        """Replay the step for the ``frames.steps`` frames to search (compressed runs
        need fewer than the buffers hold)."""
        from pipeline.decoding.ctc_beam import _Beams

        self._fill(frames)
        self._load(beams)
        for _ in range(frames.steps):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._body()
        out = _Beams(self.beams.scores.clone(), self.beams.last.clone(), self.beams.key.clone(),
                     [s.clone() for s in self.beams.fusion])
        alive = self.alive.clone() if self.search.track_beams else None
        return out, self.choices[:frames.steps].clone(), alive
