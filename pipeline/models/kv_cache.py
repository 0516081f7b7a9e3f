"""transformers' decoder caches over tensors the caller already holds: the static and
speculative decoding loops (pipeline.decoding) keep their own K/V buffers and hand them to a
model's decoder as a cache without a copy.
"""
from __future__ import annotations

import torch


def cache_of(kv: list[tuple[torch.Tensor, torch.Tensor]]):
    """A DynamicCache holding exactly these tensors (its constructor would copy them)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    cache = DynamicCache()
    for k, v in kv:
        layer = DynamicLayer()
        layer.lazy_initialization(k, v)
        layer.keys, layer.values = k, v
        cache.layers.append(layer)
    return cache


def cross_attention_cache(cross_kv: list[tuple[torch.Tensor, torch.Tensor]]):
    """An encoder-decoder cache with no self-attention entries and ``cross_kv`` (per layer
    [B, H, T, d], as ``greedy_decode(cross_out=...)`` leaves them) as its cross-attention:
    a pass over the same rows then skips projecting the encoder states again."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(), cache_of(cross_kv))
