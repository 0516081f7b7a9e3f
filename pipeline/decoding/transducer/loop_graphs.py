"""CUDA-graph replay of a transducer loop's step, as "Label-Looping: Highly Efficient
Decoding for Transducers" (Bataev et al., §3, CUDA graphs) runs greedy decoding and
"Pushing the Limits of Beam Search Decoding for Transducer-based ASR models" (§2.1) runs
ALSD++ / AES++: the step over static buffers
(:mod:`pipeline.decoding.transducer.static_state`) is captured once per bucket and then
replayed, one launch per step instead of one per kernel.

The step is the same function the uncaptured static loop runs, so the two give identical
results. A step that cannot be captured (a fusion lookup that reads a tensor back to the
host, an old driver) leaves the graph out: the caller logs it once and decodes eagerly.
"""
from __future__ import annotations

import logging
from collections import OrderedDict

import torch

log = logging.getLogger(__name__)

MAX_GRAPHS = 8  # buckets kept per decoder: each graph holds its own memory pool


class StepGraph:
    """``body`` (no arguments, reads and writes static buffers only), captured into a CUDA
    graph when ``capture``; calling the object runs one step (replay, or ``body``
    itself). ``reset`` puts the buffers back in a valid start state: the warm-up before
    capture runs the body on them. Capture errors propagate (the caller decides)."""

    def __init__(self, body, reset, device, capture: bool):
        self.body = body
        self.graph = None
        if capture:
            self._capture(reset, torch.device(device))

    def _capture(self, reset, device) -> None:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):   # allocator and lazy-init warm-up outside the graph
            reset()
            for _ in range(2):
                self.body()
        torch.cuda.current_stream(device).wait_stream(side)
        reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.body()
        self.graph = graph

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.body()


class GraphCache:
    """Static loops by bucket key, least recently used dropped past ``MAX_GRAPHS``; after
    one capture failure no further capture is tried (one log line per decoder)."""

    def __init__(self):
        self.loops: OrderedDict = OrderedDict()
        self.failed = False

    def get(self, key, build):
        """The loop for ``key``, built by ``build()`` when missing; None once capture
        has failed (build raised)."""
        if key in self.loops:
            self.loops.move_to_end(key)
            return self.loops[key]
        if self.failed:
            return None
        try:
            loop = build()
        except Exception as exc:  # graphs are an optimisation: never fail the decode
            log.warning("transducer: CUDA graph capture failed (%s: %s); decoding eagerly",
                        type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            self.failed = True
            return None
        self.loops[key] = loop
        while len(self.loops) > MAX_GRAPHS:
            self.loops.popitem(last=False)
        return loop
