"""CUDA-graph replay of the static-cache greedy step ("Accelerating Generative AI with
PyTorch II: GPT, Fast": a static KV cache makes the decoding step's shapes fixed, so it
is captured once and replayed; here with ``torch.cuda.CUDAGraph``).

One graph per bucket: the batch and the cache's columns rounded up to powers of two (the
columns at most the model's positions: Whisper's 448, so nearly every Whisper call has
the same), the encoder frames and the dtype as they are. Coarse buckets keep the
captures few (granite-speech's prompt length follows its audio); the padding rows and
columns cost little in a step that waits on its weights. A call loads
its prefill into the bucket's buffers (rows past its batch are finished padding) and
replays the graph once per token; the step is the function the eager static loop runs
(pipeline.decoding.ar.static.advance), so the tokens are the same. Where capture fails
(no CUDA, an operation that syncs with the host) greedy decoding takes the eager loop,
with one log line.

``StaticDecoding`` is decoder.use_cuda_graphs resolved for a call: graphs on CUDA, the
static loop without capture on a CPU only where ``cpu_static`` (off by default: measured
slower than the eager loop there, see docs/ar.md), else the eager loop.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from .static import CHECK_EVERY, EagerRunner, StepState, advance

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel

log = logging.getLogger(__name__)

# Graphs kept per adapter (each holds its bucket's cross-attention K/V: ~1 GB for the
# large-v3-turbo shape at batch 32); the oldest is dropped first.
MAX_GRAPHS = 6


def bucket(n: int) -> int:
    """``n`` rounded up to a power of two."""
    return 1 << max(0, n - 1).bit_length()


class GraphRunner:
    """The static step captured over one bucket's buffers (see the module docstring). The
    first load captures; where that fails, the adapter's ``pool`` is marked failed (one
    log line: later calls take the eager loop) and this call runs the step uncaptured."""

    def __init__(self, adapter: ARDecoderModel, B: int, S: int, self_like, cross_like, device, pool: dict):
        self.adapter, self.step, self.pool = adapter, adapter.static_step(), pool
        self.state = StepState(B, S, S, self_like, cross_like, device, own_cross=True)
        self.graph, self.device = None, device
        self.check_every = CHECK_EVERY

    def load(self, self_kv, cross_kv, mask, pos, first, limit: int) -> StepState:
        args = (self_kv, cross_kv, mask, pos, first, self.adapter.eot_id, True)
        self.state.load(*args)
        if self.graph is None and not self.pool.get("failed"):
            try:
                self._capture()
            except Exception as exc:  # capture is an optimisation: never fail the decode
                log.warning("CUDA graph capture of the greedy AR step failed (%s); decoding eagerly", exc)
                self.pool.clear()
                self.pool["failed"] = True
                self.graph = None
            self.state.load(*args)
        return self.state

    def _capture(self) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):   # warm-up outside the graph: allocator, lazy init, kernel choice
            for _ in range(2):
                self._eager()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._eager()
        self.graph = graph

    def _eager(self) -> None:
        advance(self.step, self.adapter, self.state, screened=False)

    def advance(self) -> None:
        if self.graph is None:
            self._eager()
        else:
            self.graph.replay()

    def finish(self) -> None:
        """The buffers stay for the bucket's next call."""


class StaticDecoding:
    """Which loop a greedy decoding takes (see the module docstring): on CUDA the static
    loop, captured unless ``capture=False``; on a CPU the static loop (never captured)
    only where ``cpu_static``, else the eager one."""

    def __init__(self, use_cuda_graphs: bool = True, cpu_static: bool = False, capture: bool = True):
        self.use_cuda_graphs, self.cpu_static, self.capture = use_cuda_graphs, cpu_static, capture

    def applies(self, device: torch.device) -> bool:
        """Whether calls on ``device`` take the static loop (before any work for it)."""
        return self.use_cuda_graphs and (device.type == "cuda" or self.cpu_static)

    def runner(self, adapter: ARDecoderModel, mask: torch.Tensor, limit: int, self_kv, cross_kv):
        """The runner for a call (``mask`` [B, L]: its prefill's), or None: the eager loop."""
        if not self.applies(mask.device):
            return None
        if mask.device.type == "cuda":
            return self._graph(adapter, mask, limit, self_kv, cross_kv) if self.capture else \
                EagerRunner(adapter, screened=False)
        return EagerRunner(adapter, screened=True) if self.cpu_static else None

    def _graph(self, adapter: ARDecoderModel, mask, limit, self_kv, cross_kv):
        pool = adapter.__dict__.setdefault("_ar_graphs", {})
        if pool.get("failed"):
            return None
        B, L = mask.shape
        S = min(bucket(L + limit), max(L + limit, adapter.max_positions))
        cross = tuple(cross_kv[0][0].shape[1:]) if cross_kv else ()
        key = (bucket(B), S, cross, self_kv[0][0].dtype, str(mask.device))
        runner = pool.pop(key, None)
        if runner is None:
            runner = GraphRunner(adapter, key[0], S, self_kv, cross_kv, mask.device, pool)
        pool[key] = runner   # most recent last
        graphs = [k for k in pool if k != "failed"]
        for old in graphs[:-MAX_GRAPHS]:
            del pool[old]
        return runner
