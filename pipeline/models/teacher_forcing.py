"""One teacher-forced decoder pass: the distributions an attention decoder gives to tokens it
is handed, with greedy decoding's suppress masks (as the verification of "Self-Speculative
Decoding for LLM-based ASR with CTC Encoder Drafts", eq. 5, scores a draft). Confidence
(pipeline.confidence.scores) measures a transcript's tokens with it; a family's language
check scores a transcript under a language with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .kv_cache import cross_attention_cache

if TYPE_CHECKING:
    from .base import ARDecoderModel


@torch.inference_mode()
def teacher_forced_logprobs(adapter: ARDecoderModel, encoder_states: torch.Tensor, tokens: list[list[int]],
                            prompts: list[list[int]] | None = None, cross_kv: list | None = None):
    """Per row, the log-distributions [K, V] that predicted its K ``tokens`` and those
    tokens as a tensor, or None for a row without tokens: one teacher-forced decoder pass
    over left-padded prompt + tokens (``encoder_states[i]`` is row i's; ``prompts`` default
    to the adapter's), with greedy decoding's suppress masks. ``cross_kv``: the
    cross-attention K/V greedy decoding already projected for exactly these rows
    (``greedy_decode(cross_out=...)``), so this pass does not project them again."""
    B = len(tokens)
    if B == 0 or not any(tokens):
        return [None] * B
    device = encoder_states.device
    prompts = prompts or adapter.batch_prompts(encoder_states)
    P = max(len(p) for p in prompts)
    K = [len(t) for t in tokens]
    Kmax = max(K)
    ids = torch.full((B, P + Kmax), adapter.eot_id, dtype=torch.long, device=device)
    for i, (p, t) in enumerate(zip(prompts, tokens)):
        ids[i, P - len(p):P + len(t)] = torch.tensor(list(p) + list(t), dtype=torch.long, device=device)
    lead = torch.tensor([P - len(p) for p in prompts], device=device)
    cols = torch.arange(P + Kmax, device=device).unsqueeze(0)
    mask = ((cols >= lead.unsqueeze(1)) & (cols < (P + torch.tensor(K, device=device)).unsqueeze(1))).long()
    positions = (cols - lead.unsqueeze(1)).clamp(min=0)
    cache = None
    if cross_kv:
        cache = cross_attention_cache(cross_kv)
    hidden, _ = adapter.decoder_hidden(ids, encoder_states, cache, mask, positions)
    out = []
    for i in range(B):
        if K[i] == 0:
            out.append(None)
            continue
        logits = adapter.logits(hidden[i, P - 1:P - 1 + K[i]])              # [K, V], one row at a time
        logits = logits.masked_fill(adapter.suppress_mask, float("-inf"))
        if adapter.begin_suppress_ids.numel():
            logits[0, adapter.begin_suppress_ids] = float("-inf")
        out.append((logits.float().log_softmax(-1), ids[i, P:P + K[i]]))
    return out
