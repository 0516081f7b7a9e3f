"""ALSD++ and AES++ of "Pushing the Limits of Beam Search Decoding for Transducer-based ASR
models" (§2.1-2.3; the batched hypotheses of §2.1 in static [B, beam] buffers, the step
captured as a CUDA graph, as the paper runs its searches) over
:mod:`pipeline.decoding.transducer.static_state`.

The step is the eager search's own (``TransducerBeamSearch._step``): a replay reads the
hypotheses from the static buffers and writes the new ones back in place, and stores its
trie entry at the device-side step counter, so eager, static and graphed loops give the
same tokens and scores. The step skips the joint of frozen hypotheses (finished ones, and
in AES++ those waiting for the next frame) where rows can be dropped, on a CPU; under a
graph every slot goes through the joint, masked, as in eager GPU decoding: a graph's shapes
are fixed, and another row count could round differently from eager decoding's.

Loop control follows the eager search: ALSD++ runs until every hypothesis has read its
frames, AES++ runs ``max_symbols`` steps per frame (on a CPU it stops a frame early when no
hypothesis is left at it). A graphed loop reads the end test once every ``check_every``
steps; a step after the end changes nothing.
"""
from __future__ import annotations

import torch

from ..ctc_beam.state import NEG_INF
from .loop_graphs import GraphCache, StepGraph
from .static_state import BeamState, frame_bucket

LOOPS = ("auto", "eager", "static", "cuda_graph")
# On a CPU the step's arithmetic is the cost and the static loop adds its copies (measured
# in docs/transducer.md), so the eager loop keeps the CPU.
CPU_LOOP = "eager"


def _finished(hyps, lengths: torch.Tensor) -> torch.Tensor:
    return ((hyps.t >= lengths[:, None]) | (hyps.score == NEG_INF)).all()


class StaticBeamLoop:
    """One bucket's buffers and step (captured when ``capture``)."""

    def __init__(self, search, frames: torch.Tensor, lengths: torch.Tensor, fusion: list, lookups: list,
                 initial, bucket: int, capture: bool):
        b, _, h = frames.shape
        device = frames.device
        self.search = search
        # the graph reads these by address: keep them (and their ids) alive with it
        self.fusion, self.lookups = fusion, lookups
        steps = bucket * search.max_symbols + 1
        self.state = st = BeamState.allocate(initial, b, bucket, h, frames.dtype, device, steps)
        aes = search.algorithm == "aes"

        def body():
            waiting = (st.hyps.t > st.f) if aes else None
            trie = []
            st.set_hyps(search._step(st.hyps, st.frames, st.lengths, fusion, lookups, waiting, trie))
            st.record(*trie[0])

        self.step = StepGraph(body, lambda: st.load(frames, lengths, initial), device, capture)
        self.captured = self.step.graph is not None

    def matches(self, fusion: list, lookups: list) -> bool:
        return ([id(m) for m, _ in fusion] == [id(m) for m, _ in self.fusion]
                and [a for _, a in fusion] == [a for _, a in self.fusion]
                and [id(x) for x in lookups] == [id(x) for x in self.lookups])

    def run(self, frames: torch.Tensor, lengths: torch.Tensor, initial, check_every: int):
        search, st = self.search, self.state
        st.load(frames, lengths, initial)
        t_max = frames.shape[1]
        steps = 0
        if search.algorithm == "alsd":
            for i in range(max(t_max, 1) * search.max_symbols + 1):
                if i % check_every == 0 and bool(_finished(st.hyps, st.lengths)):
                    break
                self.step()
                steps += 1
        else:
            frame_end = frames.device.type == "cpu" and not self.captured   # the eager CPU rule
            lim = st.lengths[:, None]
            for f in range(t_max):
                st.f.fill_(f)
                if not frame_end and steps and steps % check_every == 0 and bool(_finished(st.hyps, st.lengths)):
                    break
                for _ in range(search.max_symbols):
                    h = st.hyps
                    if frame_end and not bool(((h.t == f) & (h.score > NEG_INF) & (h.t < lim)).any()):
                        break
                    self.step()
                    steps += 1
        return st.hyps, st.trie(steps)


class StaticLoops:
    """The static loops of one :class:`TransducerBeamSearch`, one per bucket."""

    def __init__(self, search):
        self.search = search
        self.graphs = GraphCache()

    def mode(self, device) -> str:
        s = self.search
        if s.loop != "auto":
            return s.loop
        if device.type == "cuda":
            return "cuda_graph" if s.use_cuda_graphs else "eager"
        return CPU_LOOP

    def run(self, frames: torch.Tensor, lengths: torch.Tensor, fusion: list, lookups: list, initial):
        """The search's result from a static loop, or None where the eager loop runs."""
        s = self.search
        mode = self.mode(frames.device)
        b, t, h = frames.shape
        if mode == "eager" or t == 0:
            return None
        capture = mode == "cuda_graph"
        bucket = frame_bucket(t)

        def build():
            return StaticBeamLoop(s, frames, lengths, fusion, lookups, initial, bucket, capture)
        if capture:
            key = (b, bucket, h, frames.dtype, str(frames.device), tuple(id(x) for x in lookups))
            loop = self.graphs.get(key, build)
            if loop is not None and not loop.matches(fusion, lookups):
                self.graphs.loops.pop(key)
                loop = self.graphs.get(key, build)
            if loop is None:
                return None
        else:
            loop = build()
        check = s.check_every or (8 if frames.device.type == "cuda" else 1)
        hyps, trie = loop.run(frames, lengths, initial, check)
        s.last_loop = mode
        return s._result(hyps, fusion, lookups, trie)
