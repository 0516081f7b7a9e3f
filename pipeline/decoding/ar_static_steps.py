"""Decoder steps for the static-cache greedy loop (pipeline.decoding.ar_static; the
static KV cache of "Accelerating Generative AI with PyTorch II: GPT, Fast"): one token
per row through a model's own decoder layers, reading and writing caller-owned K/V
buffers [B, H, S, d] at a column given as a device tensor, attending under a boolean
column mask. Each step runs the layers' own modules in the order their forward runs
them, so on a CPU the hidden states are those of the eager pass (same operations;
the attention reads more, masked, columns). Whisper (transformers' WhisperDecoder:
self-attention, cross-attention over cached encoder K/V, MLP) and granite-speech's
Granite LLM (RMSNorm, rotary positions, grouped-query attention, the Granite
multipliers); another decoder has none, and greedy decoding keeps its eager loop. An
adapter builds its own (``ARDecoderModel.static_step``, pipeline.models.base): it knows
where its decoder's layers are.
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


class GraniteStaticStep:
    """One token per row through a Granite LLM body (transformers' GraniteModel), as its
    layers run it: embeddings times embedding_multiplier, rotary position embeddings,
    attention through transformers' own SDPA function (its grouped-query handling),
    residuals times residual_multiplier, the final RMSNorm. No cross-attention: the audio
    is in the prompt's K/V."""

    def __init__(self, body):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.models.granite.modeling_granite import apply_rotary_pos_emb

        self.body, self.attend, self.rotate = body, sdpa_attention_forward, apply_rotary_pos_emb

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, col: torch.Tensor, valid: torch.Tensor,
                 self_kv: list[tuple[torch.Tensor, torch.Tensor]], cross_kv: list) -> torch.Tensor:
        """As :meth:`WhisperStaticStep.__call__`; ``cross_kv`` is unused."""
        body = self.body
        B = tok.shape[0]
        x = body.embed_tokens(tok.unsqueeze(1)) * body.embedding_multiplier
        cos, sin = body.rotary_emb(x, position_ids=pos.unsqueeze(1))
        for layer, (keys, values) in zip(body.layers, self_kv):
            sa = layer.self_attn
            h = layer.input_layernorm(x)
            shape = (B, 1, -1, sa.head_dim)
            q = sa.q_proj(h).view(shape).transpose(1, 2)
            k = sa.k_proj(h).view(shape).transpose(1, 2)
            v = sa.v_proj(h).view(shape).transpose(1, 2)
            q, k = self.rotate(q, k, cos, sin)
            keys.index_copy_(2, col, k)
            values.index_copy_(2, col, v)
            a, _ = self.attend(sa, q, keys, values, valid, dropout=0.0, scaling=sa.scaling)
            x = x + sa.o_proj(a.reshape(B, 1, -1).contiguous()) * layer.residual_multiplier
            x = x + layer.mlp(layer.post_attention_layernorm(x)) * layer.residual_multiplier
        return body.norm(x)[:, 0]
