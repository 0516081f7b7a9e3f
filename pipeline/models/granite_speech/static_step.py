"""granite-speech's LLM step for the static-cache greedy loop (pipeline.decoding.ar.static;
the static KV cache of "Accelerating Generative AI with PyTorch II: GPT, Fast"): one token
per row through the Granite LLM's layers (RMSNorm, rotary positions, grouped-query
attention, the Granite multipliers), reading and writing caller-owned K/V buffers
[B, H, S, d] at a column given as a device tensor, attending under a boolean column mask,
with the layers' own modules in their forward's order (the eager pass's hidden states on
a CPU). The adapter builds it (``ARDecoderModel.static_step``); another LLM body has none,
and greedy decoding keeps its eager loop.
"""
from __future__ import annotations

import torch


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
