"""Whisper's decoder step for the static-cache greedy loop (pipeline.decoding.ar.static; the
static KV cache of "Accelerating Generative AI with PyTorch II: GPT, Fast"): one token per
row through transformers' WhisperDecoder layers (self-attention, cross-attention over
cached encoder K/V, MLP), reading and writing caller-owned K/V buffers [B, H, S, d] at a
column given as a device tensor, attending under a boolean column mask. It runs the layers'
own modules in the order their forward runs them, so on a CPU the hidden states are those
of the eager pass. The adapter builds it (``ARDecoderModel.static_step``).
"""
from __future__ import annotations

import torch


class WhisperStaticStep:
    """One token per row through a Whisper decoder (transformers' WhisperDecoder), reading
    and writing caller-owned K/V buffers; the same operations in the same order as the
    model's own layers, so the hidden states are the eager pass's."""

    def __init__(self, decoder):
        self.decoder = decoder
        first = decoder.layers[0].self_attn
        self.heads, self.head_dim = first.num_heads, first.head_dim
        self.scaling = first.scaling

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, col: torch.Tensor, valid: torch.Tensor,
                 self_kv: list[tuple[torch.Tensor, torch.Tensor]],
                 cross_kv: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Hidden states [B, D] after tokens ``tok`` [B] at positions ``pos`` [B]; their K/V
        are written at column ``col`` ([1] long) of ``self_kv`` (per layer [B, H, S, d]);
        ``valid`` [B, 1, 1, S] bool: the columns each row attends to."""
        dec, attend = self.decoder, torch.nn.functional.scaled_dot_product_attention
        B = tok.shape[0]
        shape = (B, 1, self.heads, self.head_dim)
        x = dec.embed_tokens(tok.unsqueeze(1)) + dec.embed_positions.weight[pos.unsqueeze(1)]
        for layer, (keys, values), (ck, cv) in zip(dec.layers, self_kv, cross_kv):
            sa = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            q = (sa.q_proj(h) * sa.scaling).view(shape).transpose(1, 2).contiguous()
            keys.index_copy_(2, col, sa.k_proj(h).view(shape).transpose(1, 2).contiguous())
            values.index_copy_(2, col, sa.v_proj(h).view(shape).transpose(1, 2).contiguous())
            a = attend(q, keys, values, attn_mask=valid, scale=1.0)
            x = x + sa.out_proj(a.transpose(1, 2).reshape(B, 1, -1))
            ca = layer.encoder_attn
            h = layer.encoder_attn_layer_norm(x)
            q = (ca.q_proj(h) * ca.scaling).view(shape).transpose(1, 2).contiguous()
            a = attend(q, ck, cv, scale=1.0)
            x = x + ca.out_proj(a.transpose(1, 2).reshape(B, 1, -1))
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(layer.activation_fn(layer.fc1(h)))
        return dec.layer_norm(x)[:, 0]
