"""The decoder's cross-attention keys and values of the encoder states, projected at the
encoder's precision ("Robust Speech Recognition via Large-Scale Weak Supervision", Fig. 1:
every decoder block attends to the encoder output through its own K and V projections).

K_l = X W_K,l and V_l = X W_V,l + b_V,l for each decoder layer l are functions of the
encoder states X alone, computed once per segment. For Whisper tiny.en on a 30-s window
that is 8 products of [1500, 384] x [384, 384] per segment, the multiply-adds of ~200
tokens through the decoder's four layers: most of a short clip's decoding on CPU.
Where the encoder runs in bfloat16 (``model.encoder_dtype``), X carries bfloat16's
precision already; projecting it in bfloat16 too halves the weight and state traffic. The
products are returned in the decoder's dtype, laid out as the model's attention caches
them ([B, heads, T, head_dim]), so the float32 decoder reads them unchanged.
"""
from __future__ import annotations

import torch


class CrossProjection:
    """Per-layer cross-attention K/V of encoder states in ``dtype``, returned in ``out_dtype``."""

    def __init__(self, decoder_layers, dtype: torch.dtype, out_dtype: torch.dtype):
        self.dtype, self.out_dtype = dtype, out_dtype
        self.weights = []
        for layer in decoder_layers:
            attn = layer.encoder_attn
            k, v = attn.k_proj, attn.v_proj
            if type(k) is not torch.nn.Linear or type(v) is not torch.nn.Linear:
                raise ValueError("cross-attention projections must be plain Linear layers (not quantised)")
            self.weights.append(tuple(None if t is None else t.detach().to(dtype)
                                      for t in (k.weight, k.bias, v.weight, v.bias)))
        self.heads = decoder_layers[0].encoder_attn.num_heads

    def __call__(self, states: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        B, T, _ = states.shape
        x = states.to(self.dtype)
        out = []
        for wk, bk, wv, bv in self.weights:
            k = torch.nn.functional.linear(x, wk, bk).view(B, T, self.heads, -1).transpose(1, 2)
            v = torch.nn.functional.linear(x, wv, bv).view(B, T, self.heads, -1).transpose(1, 2)
            out.append((k.to(self.out_dtype), v.to(self.out_dtype)))
        return out
