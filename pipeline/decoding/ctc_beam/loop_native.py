"""The frame loop of Algorithm 1 of "FlexCTC: GPU-powered CTC Beam Decoding with advanced
Contextual Abilities" as one native call on a CPU, with the trie of "Pushing the Limits of
Beam Search Decoding for Transducer-based ASR models" (§2.1) and the token pruning of
"FLToP CTC: Frame-Level Token Pruning via Relative Threshold for Efficient and
Memory-Saving Decoding on Diverse Platforms" (Algorithm 1): the ctypes bindings of
``loop_native.c``.

On a CPU the torch frame step is about fifty small tensor ops per frame, and at small
beams and batches their dispatch, not the arithmetic, is most of its time. The C loop runs
the same step for every frame and utterance in one call: the same candidates, float
summation order, recombination keys and trie, plus two shortcuts that cannot change a
result (dead hypotheses and theta-pruned columns are not enumerated). It is what CUDA
graphs are on the GPU: the step without per-op overhead. The same library also prunes and
compresses FLToP frames and reads the trie back.

The library is built on first use by :mod:`pipeline.decoding.native_build`. Where no
compiler is available the search runs the torch step (``available()`` is False, the
reason is logged once).

Supported: max merge, fusion lookups over dense tables (every character LM and boosting
tree the pipeline builds), over NGPU-LM back-off graphs (a model too large for a dense
table: a token n-gram over a subword vocabulary), or the insertion bonus alone, on CPU
tensors. Anything else returns None and the caller uses the torch loop.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import math
import weakref
from pathlib import Path

import torch

from .. import native_build
from .fusion import BetaOnly, DenseLookup, GenericLookup
from .state import Beams, Frames
from .step import FrameStep

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("loop_native.c")
# No -ffast-math: the loop relies on IEEE -inf and on the torch step's summation order,
# and no contraction into fused multiply-adds (torch rounds alpha * score before + beta).
CFLAGS = ("-O3", "-g", "-shared", "-fPIC", "-std=gnu99", "-ffp-contract=off")
_P = ctypes.c_void_p
_I = ctypes.c_int64
# lookup -> its tables packed for the C loop, built once per lookup
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# the back-off chain signatures (the C chain_t) take CHAIN_BYTES a state; a graph that
# would need more than CHAIN_MAX_BYTES goes without them (every lookup walks its chain:
# same scores, slower)
CHAIN_BYTES = 32
CHAIN_MAX_BYTES = 256 * 2 ** 20


def build(out_dir: Path | None = None) -> Path:
    """Compile the C source (if not cached) and return the shared library's path.
    Raises RuntimeError with the compiler's message when that fails."""
    return native_build.build(SOURCE, CFLAGS, out_dir)


@functools.lru_cache(maxsize=1)
def _library():
    try:
        lib = native_build.load(SOURCE, CFLAGS)
    except (OSError, RuntimeError) as exc:
        log.warning("native CTC beam loop unavailable (%s); using the torch frame step", exc)
        return None
    lib.ctc_beam_loop.restype = ctypes.c_int
    lib.ctc_beam_loop.argtypes = [_I, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _I, _P, _P, _P,
                                  ctypes.c_int, ctypes.c_float, _P, _P, _P, _P, _P, _P]
    lib.ctc_flop_prune.restype = None
    lib.ctc_flop_prune.argtypes = [_I, _I, _I, _I, _I, _P, _P, ctypes.c_int, ctypes.c_float, _P, _P]
    lib.ctc_flop_compress.restype = ctypes.c_int64
    lib.ctc_flop_compress.argtypes = [_I, _I, _I, _I, _P, _P, _P, ctypes.c_float, _P, _P, _P, _P, _P, _P]
    lib.ctc_alignments.restype = None
    lib.ctc_alignments.argtypes = [_I, _I, _I, _I, _P, _P, _I, _P, _P, _P, _P, _P]
    lib.ctc_graph_chains.restype = None
    lib.ctc_graph_chains.argtypes = [_I, _I, _P, _P, _P, _P, _P]
    lib.ctc_backtrack.restype = ctypes.c_int
    lib.ctc_backtrack.argtypes = [_I, _I, _I, _I, _I, _P, _P, _P, _P]
    return lib


def available() -> bool:
    return _library() is not None


def _ptr(t: torch.Tensor | None):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _ready(t: torch.Tensor, dtype) -> torch.Tensor:
    if t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("native loop: tensors must be contiguous CPU tensors of the right dtype")
    return t


def packed_table(lookup: DenseLookup) -> tuple[torch.Tensor, float] | None:
    """The lookup's score and next-state tables interleaved as int32 pairs (the C
    ``entry_t``: float bits, row offset) and the largest score (the bonus bound the loop
    prunes with), built once per lookup; None when the offsets do not fit int32."""
    packed = _PACKED.get(lookup)
    if packed is None:
        if lookup.next.numel() and int(lookup.next.max()) >= 2 ** 31:
            return None
        table = torch.stack([lookup.scores.float().contiguous().view(torch.int32),
                             lookup.next.to(torch.int32)], dim=-1).contiguous()
        packed = _PACKED[lookup] = (table, float(lookup.scores.max()))
    return packed


class _Graph(ctypes.Structure):
    """The C ``graph_t``: a back-off graph's arrays and the lookup's alpha and beta."""

    _fields_ = [("arc_start", _P), ("arc_label", _P), ("arc_to", _P), ("arc_w", _P), ("backoff_to", _P),
                ("root_row", _P), ("root_to", _P), ("backoff_w", _P), ("root_w", _P), ("chains", _P), ("depth", _I),
                ("alpha", ctypes.c_float), ("beta", ctypes.c_float)]


_GRAPH_DTYPES = {"arc_start": torch.int64, "arc_label": torch.int32, "arc_to": torch.int32,
                 "arc_w": torch.float32, "backoff_to": torch.int32, "root_row": torch.int32,
                 "root_to": torch.int32, "backoff_w": torch.float32, "root_w": torch.float32}


def packed_graph(lookup: GenericLookup, vocab: int):
    """``(struct, bonus bound, arrays)`` of a lookup over a back-off graph of ``vocab``
    labels, or None for any other model (or a negative weight: the bound below assumes
    alpha >= 0). The bound is alpha x (largest arc or root weight + depth x largest
    positive back-off) + beta: no lookup can score more. Each state's back-off chain is
    summarised once here (``ctc_graph_chains``) for the loop's shortcut to the root, up to
    ``CHAIN_MAX_BYTES``."""
    graph = getattr(lookup.model, "graph", None)
    lib = _library()
    if lib is None or graph is None or not hasattr(graph, "arc_start") or graph.vocab_size != vocab \
            or lookup.alpha < 0:
        return None
    packed = _PACKED.get(lookup)
    if packed is None:
        arrays = {name: getattr(graph, name).to("cpu", dtype).contiguous() for name, dtype in _GRAPH_DTYPES.items()}
        states = int(arrays["backoff_to"].numel())
        if CHAIN_BYTES * states <= CHAIN_MAX_BYTES:
            arrays["chains"] = torch.empty((states, CHAIN_BYTES), dtype=torch.uint8)
            lib.ctc_graph_chains(states, graph.depth, _ptr(arrays["arc_start"]), _ptr(arrays["arc_label"]),
                                 _ptr(arrays["backoff_to"]), _ptr(arrays["backoff_w"]), _ptr(arrays["chains"]))
        pointers = {name: t.data_ptr() for name, t in arrays.items()}
        struct = _Graph(**pointers, depth=graph.depth, alpha=lookup.alpha, beta=lookup.beta)
        top = max(float(arrays["arc_w"].max()) if arrays["arc_w"].numel() else -math.inf,
                  float(arrays["root_w"].max()))
        bound = lookup.alpha * (top + graph.depth * max(0.0, float(arrays["backoff_w"].max()))) + lookup.beta
        packed = _PACKED[lookup] = (struct, bound, arrays)
    return packed


def run_loop(step: FrameStep, frames: Frames, beams: Beams, lookups: list, track_beams: bool):
    """The frame loop of ``step`` over ``frames`` from ``beams``: ``(beams, choices
    [S, B, K], alive)`` as :func:`pipeline.decoding.ctc_beam.loop_eager.eager_loop` returns
    them, or None when this configuration needs the torch loop."""
    lib = _library()
    values = frames.values
    if lib is None or step.merge != "max" or values.device.type != "cpu":
        return None
    _, b, w = values.shape
    k = beams.scores.shape[1]
    v1 = step.vocab + 1
    tables, graphs, bmax, beta_only = [], [], [], None
    for lookup in lookups:
        if isinstance(lookup, DenseLookup) and lookup.width == v1:
            packed = packed_table(lookup)
            if packed is None:
                return None
            tables.append(packed[0])
            graphs.append(None)
            bmax.append(packed[1])
        elif isinstance(lookup, GenericLookup):
            packed = packed_graph(lookup, step.vocab)
            if packed is None:
                return None
            tables.append(None)
            graphs.append(packed[0])
            bmax.append(packed[1])
        elif isinstance(lookup, BetaOnly):
            beta_only = float(lookup.beta)
        else:
            return None
    m = min(k * step.preselect, k * w)
    steps = frames.steps
    tokens = None if frames.tokens is None else _ready(frames.tokens, torch.int64)
    lm_tokens = _ready(frames.lm_tokens.reshape(-1) if tokens is None else frames.lm_tokens, torch.int64)
    scores = beams.scores.float().contiguous().clone()
    last, key = beams.last.contiguous().clone(), beams.key.contiguous().clone()
    # stack copies, so the loop may write the states in place
    states = torch.stack(beams.fusion) if beams.fusion else torch.zeros((0, b, k), dtype=torch.int64)
    choices = torch.empty((steps, b, k), dtype=torch.int64)
    alive = torch.zeros(b) if track_beams else None
    n = len(tables)
    tab_arr = (ctypes.c_void_p * max(n, 1))(*[None if t is None else t.data_ptr() for t in tables])
    gr_arr = (ctypes.c_void_p * max(n, 1))(*[None if g is None else ctypes.addressof(g) for g in graphs])
    bmax_arr = (ctypes.c_float * max(n, 1))(*bmax)
    rc = lib.ctc_beam_loop(
        steps, b, k, w, v1 - 1, m,
        _ptr(_ready(values, torch.float32)), _ptr(tokens), _ptr(lm_tokens),
        _ptr(_ready(frames.thresholds, torch.float32)), _ptr(_ready(frames.weights, torch.float32)),
        n, ctypes.cast(tab_arr, ctypes.c_void_p), ctypes.cast(gr_arr, ctypes.c_void_p),
        ctypes.cast(bmax_arr, ctypes.c_void_p),
        int(beta_only is not None), float(beta_only or 0.0),
        _ptr(scores), _ptr(last), _ptr(key), _ptr(states), _ptr(choices), _ptr(alive))
    if rc != 0:
        return None
    fusion = [states[i] for i in range(n)] if beams.fusion else []
    return Beams(scores, last, key, fusion), choices, alive


def alignments(choices, tokens, slots, width: int, frame_map, num_frames: int, blank: int, finite):
    """Back-track the trie from ``slots`` [B, n] and read the emitted tokens: ``(align
    [B, n, T] in model ids, counts, tokens, frames)`` with the last three as flat lists in
    (utterance, n-best) order, as :func:`pipeline.decoding.ctc_beam.state.trie_alignments`
    returns them; None where the native library is unavailable (or n exceeds its slots)."""
    lib = _library()
    if lib is None or choices.device.type != "cpu":
        return None
    s, b, k = choices.shape
    n = slots.shape[1]
    choices = _ready(choices.contiguous(), torch.int64)
    slots = _ready(slots.contiguous(), torch.int64)
    if tokens is not None:
        tokens = _ready(tokens[:s].contiguous(), torch.int64)
    steps = torch.empty((b, n, s), dtype=torch.int64)
    if lib.ctc_backtrack(s, b, k, width, n, _ptr(choices), _ptr(tokens), _ptr(slots), _ptr(steps)) != 0:
        return None
    fmap = None if frame_map is None else _ready(frame_map.contiguous(), torch.int64)
    t = num_frames if frame_map is not None else s
    align = torch.empty((b, n, t), dtype=torch.int64)
    counts = torch.empty(b * n, dtype=torch.int64)
    flat_tokens = torch.empty(b * n * t, dtype=torch.int64)
    flat_frames = torch.empty(b * n * t, dtype=torch.int64)
    ok = finite.to(torch.uint8).contiguous()
    lib.ctc_alignments(b, n, s, t, _ptr(steps), _ptr(fmap), blank, _ptr(ok), _ptr(align), _ptr(counts),
                       _ptr(flat_tokens), _ptr(flat_frames))
    counts = counts.tolist()
    total = sum(counts)
    return align, counts, flat_tokens[:total].tolist(), flat_frames[:total].tolist()


def flop_prune(log_probs, lengths: torch.Tensor, blank: int, top_n: int, ratio: float | None):
    """FLToP over a batch (``pipeline.decoding.ctc_beam.flop.prune_frame`` on every valid frame,
    padded frames frozen, blank as token 0): ``(values, tokens)`` [T * B, N], frame-major,
    or None where the native library is unavailable. ``log_probs``: a padded [B, T, V+1]
    tensor, or a list of each utterance's [T_b, V+1] log-probs (read in place: no padded
    copy of the batch)."""
    lib = _library()
    rows = list(log_probs.unbind(0)) if isinstance(log_probs, torch.Tensor) else list(log_probs)
    if lib is None or any(r.device.type != "cpu" for r in rows):
        return None
    b, v1 = len(rows), int(rows[0].shape[-1])
    rows = [r.float().contiguous() for r in rows]
    t = max((int(r.shape[0]) for r in rows), default=0)
    n = min(top_n, v1)
    lengths = lengths.to(torch.int64).contiguous()
    pointers = (ctypes.c_void_p * max(b, 1))(*[r.data_ptr() for r in rows])
    values = torch.empty((t * b, n), dtype=torch.float32)
    tokens = torch.empty((t * b, n), dtype=torch.int64)
    has_ratio = ratio is not None and ratio > 0.0
    lib.ctc_flop_prune(b, t, v1, n, blank, pointers, _ptr(lengths), int(has_ratio),
                       float(math.log(ratio)) if has_ratio else 0.0, _ptr(values), _ptr(tokens))
    return values, tokens


def flop_compress(values: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor, theta: float, v1: int):
    """:func:`pipeline.decoding.ctc_beam.frames.compress_runs` for max merge, natively:
    ``(values, tokens, lm_tokens, thresholds, weights, steps, frame_map)`` in
    :class:`Frames` order, or None where the native library is unavailable."""
    lib = _library()
    if lib is None or values.device.type != "cpu":
        return None
    t, b, n = values.shape
    values = _ready(values.contiguous(), torch.float32)
    tokens = _ready(tokens.contiguous(), torch.int64)
    lengths = lengths.to(torch.int64).contiguous()
    out_v = torch.empty((t, b, n), dtype=torch.float32)
    out_t = torch.empty((t, b, n), dtype=torch.int64)
    out_lm = torch.empty((t, b, n), dtype=torch.int64)
    out_th = torch.empty((t, b), dtype=torch.float32)
    out_w = torch.empty((t, b), dtype=torch.float32)
    frame_map = torch.empty((b, t), dtype=torch.int64)
    steps = lib.ctc_flop_compress(t, b, n, v1, _ptr(values), _ptr(tokens), _ptr(lengths), float(theta),
                                  _ptr(out_v), _ptr(out_t), _ptr(out_lm), _ptr(out_th), _ptr(out_w),
                                  _ptr(frame_map))
    return out_v, out_t, out_lm, out_th, out_w, int(steps), frame_map
