"""Length-sorted, padded-token-budget batching, as in "Self-Speculative Decoding for
LLM-based ASR with CTC Encoder Drafts" (§3.2: sort by length, batch by a token budget, 50K
there, so padding waste stays small and memory stays bounded), and the budget itself
(``batching.max_tokens``): the number a config sets, else the CPU's, else on CUDA one sized
from the GPU's free memory and the model's shape (:func:`resolve_max_tokens`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# batching.max_tokens where the config leaves it null and no GPU sizes it: the CPU's
# budget, what the key held before it could be null (16 Whisper segments of 1500 frames).
CPU_MAX_TOKENS = 24000
# The share of a GPU's free memory the budget leaves unplanned: bytes_per_token counts a
# batch's large tensors, not the allocator's fragmentation, cuBLAS/cuDNN workspaces, CUDA
# graphs' private pools or the decoders' small buffers. A batch that still runs out of
# memory is halved by the segment runner, at the cost of its first try.
RESERVE_FRACTION = 0.2


class UnsetMaxTokens(int):
    """batching.max_tokens left null: an int equal to CPU_MAX_TOKENS, so every reader of
    the key gets today's number (the CPU's, exactly), yet a type of its own, so the process
    that loads the model on CUDA can tell it from an explicit 24000 and size the budget from
    the GPU (:func:`resolve_max_tokens`). It survives what carries a config to a worker
    (``to_dict``'s deep copy, pickling); JSON writes it as 24000, which reads back as set."""

    def __new__(cls):
        return super().__new__(cls, CPU_MAX_TOKENS)

    def __reduce__(self):
        return UnsetMaxTokens, ()

    # Shown as a null key is: `shardscribe keys` prints defaults' repr (None), transcribe
    # --help their str (null). Arithmetic, comparisons, %d and JSON see 24000.
    def __repr__(self) -> str:
        return "None"

    def __str__(self) -> str:
        return "null"


def max_tokens_set(value) -> bool:
    """Whether batching.max_tokens ``value`` is a number the config set (it then wins on
    every device) rather than left null."""
    return value is not None and not isinstance(value, UnsetMaxTokens)


def pack_by_budget(costs: list[int], budget: int) -> list[list[int]]:
    """Group item indices into batches, longest first, so that for each batch
    ``len(batch) * max(cost in batch) <= budget`` (a single over-budget item gets its own batch).
    """
    order = sorted(range(len(costs)), key=lambda i: -costs[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted descending, so the first item of a batch sets its padded width.
        width = costs[current[0]] if current else costs[i]
        if current and (len(current) + 1) * width > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def equal_length_buckets(lengths: list[int]) -> list[list[int]]:
    """Item indices grouped by exact length, in first-seen order: batches that need no
    padding, for a model whose padding leaks into the valid frames (a norm or convolution
    that reads the whole time axis before any mask applies)."""
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        buckets.setdefault(n, []).append(i)
    return list(buckets.values())


def slow_start(first: int, full: int) -> list[int]:
    """The sizes a job's first ``full`` rows are cut into: ``first``, twice that, and so
    on, while what is left is at least the next size; the last piece takes the rest (16
    from 1: 1, 2, 4, 9). ``[full]`` where ``first >= full``.

    A job's first rows then finish within seconds instead of after a whole batch, for at
    most log2(full) extra batches a job; every later batch is whole."""
    first, full = max(1, first), max(1, full)
    if first >= full:
        return [full]
    sizes, size, left = [], first, full
    while left:
        take = left if left - size < size else size
        sizes.append(take)
        left -= take
        size *= 2
    return sizes


def in_slow_start(rows_read: int, first: int, full: int) -> bool:
    """Whether the batch that brought the rows read to ``rows_read`` is one of the slow
    start's pieces (:func:`slow_start`) but its last: its pending rows are finished at once
    (pipeline.pending_pool's ``start``), the last piece's pool with the next batches'."""
    return first < full and rows_read < full


def budget_from_memory(free_bytes: int, model_bytes: int, bytes_per_token: float,
                       reserve_fraction: float = RESERVE_FRACTION, floor: int = 1) -> int:
    """A token budget (batching.max_tokens) for a GPU with ``free_bytes`` free once the
    model is on it: the free memory less ``reserve_fraction`` of it and less
    ``model_bytes`` (room for one more copy of the weights: a second process that loads the
    model on the same GPU after this one measured, such as a separate fallback stage),
    divided by ``bytes_per_token`` (:func:`bytes_per_token`); never below ``floor`` (one
    segment's cost: a batch of one must stay possible however full the GPU is).

    Monotone in ``free_bytes``: more free memory never gives a smaller budget."""
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    if not 0.0 <= reserve_fraction < 1.0:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction}")
    usable = free_bytes * (1.0 - reserve_fraction) - model_bytes
    tokens = math.floor(usable / bytes_per_token) if usable > 0 else 0
    return max(int(floor), tokens)


@dataclass(frozen=True)
class ModelShape:
    """What the token budget's memory estimate reads from a checkpoint's config."""
    hidden: int                     # encoder width: its states' features per frame
    ffn: int                        # encoder feed-forward width
    decoder_layers: int = 0         # attention decoder layers (0: none: CTC, transducers)
    decoder_kv: int = 0             # one decoder layer's K (= V) width per token: KV heads x head size
    frames_per_decoder_token: int = 1   # encoder frames per token the decoder attends to
    vocab: int = 0                  # output classes (logits per decoded token, or per frame)
    score_heads: int = 0            # encoder heads whose attention scores are materialised (eager)
    score_span: int = 0             # frames each frame's scores cover (0: the whole segment)


def _size(config, *names: str) -> int:
    """The first of ``names`` that ``config`` has as a positive int, else 0."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def model_shape(config) -> ModelShape:
    """ModelShape from a transformers config, read by attribute so that every family's
    works: Whisper (d_model, encoder_ffn_dim, decoder_layers), wav2vec2-style
    (hidden_size, intermediate_size), a nested ``encoder_config`` (Parakeet,
    granite-speech's conformer: hidden_dim, feedforward_mult, context_size) and a
    ``text_config`` (granite-speech's LLM: its layers and grouped KV heads; the projector
    hands it one audio token per ``downsample_rate`` frames), and the embedded transducer's
    own (d_encoder). A width the config lacks falls back to 1024, a feed-forward to 4x the
    width (Whisper's, wav2vec2's). Attention scores count only where the encoder
    materialises them (eager attention, or block attention computed by hand): sdpa on CUDA
    (what the loaders name where a class has it) runs the flash or memory-efficient
    kernels, which keep none."""
    config = config if config is not None else object()
    enc = getattr(config, "encoder_config", None) or config
    hidden = (_size(enc, "d_encoder", "d_model", "hidden_size", "hidden_dim")
              or _size(config, "d_encoder", "d_model", "hidden_size") or 1024)
    ffn = _size(enc, "encoder_ffn_dim", "intermediate_size") or hidden * (_size(enc, "feedforward_mult") or 4)
    text = getattr(config, "text_config", None)
    if text is not None:
        layers = _size(text, "num_hidden_layers")
        heads = _size(text, "num_attention_heads") or 1
        head = _size(text, "head_dim") or (_size(text, "hidden_size") or hidden) // heads
        kv, per_token = (_size(text, "num_key_value_heads") or heads) * head, _size(config, "downsample_rate") or 1
        vocab = _size(text, "vocab_size")
    else:
        layers = _size(config, "decoder_layers")
        kv, per_token = (_size(config, "d_model") or hidden) if layers else 0, 1
        vocab = _size(config, "vocab_size")
    # Block attention (context_size: granite-speech's conformer) computes its scores itself.
    span = _size(enc, "context_size")
    eager = getattr(enc, "_attn_implementation", getattr(config, "_attn_implementation", "eager")) == "eager"
    heads = _size(enc, "encoder_attention_heads", "num_attention_heads", "num_heads") if eager or span else 0
    return ModelShape(hidden=hidden, ffn=ffn, decoder_layers=layers, decoder_kv=kv,
                      frames_per_decoder_token=per_token, vocab=vocab, score_heads=heads, score_span=span)


def bytes_per_token(shape: ModelShape, dtype_bytes: int, frames_per_segment: int, max_new_tokens: int) -> float:
    """Device bytes one budget token (one padded encoder frame) costs while its batch runs,
    estimated from the model's shape, for :func:`budget_from_memory`. Per frame, in the
    model's dtype (``dtype_bytes``) unless said:

    - the encoder at its peak, one layer at a time (inference keeps no earlier layer's
      activations): the residual stream and its norm, the feed-forward's input and its
      activated output, ``2 x hidden + 2 x ffn``; plus, where attention is eager, its
      scores in float32, ``heads x span x 4``;
    - the encoder states kept while the batch decodes, ``hidden x 4`` (float32: the
      second stage's pending rows keep them so);
    - the decoder's cross-attention K and V over the frames, ``2 x layers x kv`` per
      decoder token (Whisper caches them per layer; an LLM decoder holds the audio as
      prompt tokens, one per ``frames_per_decoder_token`` frames);
    - the decoder's self-attention KV cache, ``2 x layers x kv x max_new_tokens`` per
      segment (the static cache is allocated at its full length), spread over the
      segment's ``frames_per_segment`` frames;
    - the logits and log-probabilities in float32, ``2 x vocab x 4``: per decoding step of
      a segment (spread over its frames), or per frame without a decoder (CTC, a
      transducer's joint).

    Beams are not counted (the searches keep per-beam state on a small scale beside these)."""
    b, frames = dtype_bytes, max(1, frames_per_segment)
    encoder = (2 * shape.hidden + 2 * shape.ffn) * b
    scores = shape.score_heads * (shape.score_span or frames) * 4
    states = shape.hidden * 4
    kv_token = 2 * shape.decoder_layers * shape.decoder_kv * b
    cross = kv_token / max(1, shape.frames_per_decoder_token)
    cache = kv_token * max_new_tokens / frames
    logits = 2 * shape.vocab * 4 / (frames if shape.decoder_layers else 1)
    return float(encoder + scores + states + cross + cache + logits)


def resolve_max_tokens(cfg, adapter) -> int:
    """batching.max_tokens for ``adapter``'s model where it runs (``adapter.device``): the
    number the config set, on any device; left null, on a CUDA device a budget from its
    free memory and the model's shape (:func:`budget_from_memory`, :func:`bytes_per_token`;
    at least the job's longest segment), elsewhere CPU_MAX_TOKENS (the value itself, still
    unset). Call it once the model is loaded, in the process that loaded it (the driver may
    have no GPU), and keep the result in that process's config
    (``cfg.batching.max_tokens = ...``), which every stage there reads."""
    from .device import cuda_memory, is_cuda

    value = cfg.batching.max_tokens
    device = str(getattr(adapter, "device", "cpu"))
    if max_tokens_set(value) or not is_cuda(device):
        return value
    import torch

    frames = adapter.segment_cost(int(cfg.audio.max_segment_s * 16000))   # 16 kHz: the audio stage's rate
    model = getattr(adapter, "model", None)
    shape = model_shape(getattr(model, "config", None))
    dtype_bytes = torch.empty((), dtype=getattr(adapter, "dtype", torch.float32)).element_size()
    per_token = bytes_per_token(shape, dtype_bytes, frames, cfg.decoder.max_new_tokens)
    free, held = cuda_memory(device)
    return budget_from_memory(free, held, per_token, RESERVE_FRACTION, floor=frames)
