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
    def __init__(self, search, frames: torch.Tensor, tokens: torch.Tensor | None, fusion,
                 capture: bool = True):
        from pipeline.decoding.ctc_beam import _Beams

        self.search, self.fusion = search, fusion
        self.shape, self.device = tuple(frames.shape), frames.device
        t, b, _ = frames.shape
        k = search.beam_size
        dev = frames.device
        self.frames = torch.zeros_like(frames)
        self.tokens = None if tokens is None else torch.zeros_like(tokens)
        self.thresholds = torch.zeros((t, b), device=dev)
        self.valid = torch.zeros((t, b), device=dev)
        self.t = torch.zeros(1, dtype=torch.int64, device=dev)
        zeros = lambda: torch.zeros((b, k), dtype=torch.int64, device=dev)  # noqa: E731
        self.beams = _Beams(torch.zeros((b, k), device=dev), zeros(), zeros(), zeros(),
                            [zeros() for _ in fusion])
        self.labels = torch.zeros((t, b, k), dtype=torch.int64, device=dev)
        self.parents = torch.zeros_like(self.labels)
        self.alive = torch.zeros(b, device=dev)
        self.graph = None
        self.ok = True
        if capture:
            try:
                self._capture()
            except Exception as exc:  # capture is an optimisation: never fail the decode
                log.warning("CUDA graph capture failed (%s); using eager mode", exc)
                self.ok = False

    def matches(self, frames: torch.Tensor, fusion) -> bool:
        return (tuple(frames.shape) == self.shape and frames.device == self.device
                and [id(m) for m, _ in fusion] == [id(m) for m, _ in self.fusion]
                and [a for _, a in fusion] == [a for _, a in self.fusion])

    def _body(self) -> None:
        frame = self.frames.index_select(0, self.t)[0]
        tokens = None if self.tokens is None else self.tokens.index_select(0, self.t)[0]
        threshold = self.thresholds.index_select(0, self.t)[0]
        new, label, parent = self.search.step(self.beams, frame, tokens, threshold, self.fusion)
        self._set_beams(new)
        self.labels.index_copy_(0, self.t, label[None])
        self.parents.index_copy_(0, self.t, parent[None])
        if self.search.track_beams:
            live = (new.scores > NEG_INF).sum(1) * self.valid.index_select(0, self.t)[0]
            self.alive.add_(live)
        self.t.add_(1)

    def _load(self, beams) -> None:
        self.t.zero_()
        self.alive.zero_()
        self._set_beams(beams)

    def _set_beams(self, beams) -> None:
        """Copy ``beams`` into the static buffers (in place: the graph reads these)."""
        for dst, src in zip(self._static(), [beams.scores, beams.last, beams.hash, beams.length, *beams.fusion]):
            dst.copy_(src)

    def _static(self) -> list[torch.Tensor]:
        b = self.beams
        return [b.scores, b.last, b.hash, b.length, *b.fusion]

    def _capture(self) -> None:
        init = self.search._init_beams(self.shape[1], self.device, self.fusion)
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

    def run(self, frames, tokens, thresholds, beams, fusion, lengths):
        from pipeline.decoding.ctc_beam import _Beams

        t = frames.shape[0]
        self.frames.copy_(frames)
        if tokens is not None:
            self.tokens.copy_(tokens)
        self.thresholds.copy_(thresholds)
        self.valid.copy_((torch.arange(t, device=frames.device)[:, None] < lengths[None, :]).float())
        self._load(beams)
        for _ in range(t):
            if self.graph is not None:
                self.graph.replay()
            else:
                self._body()
        out = _Beams(self.beams.scores.clone(), self.beams.last.clone(), self.beams.hash.clone(),
                     self.beams.length.clone(), [s.clone() for s in self.beams.fusion])
        alive = self.alive.clone() if self.search.track_beams else None
        return out, self.labels.clone(), self.parents.clone(), alive
