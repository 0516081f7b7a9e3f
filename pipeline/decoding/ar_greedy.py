"""Batched greedy autoregressive decoding with a KV cache (the AR baseline; SSD eq. 6).

Every row may start from its own forced prefix (SSD resumes from the verified prefix j),
and may have its own prompt (``adapter.batch_prompts``: granite-speech puts one audio
token per audio embedding in it; Whisper's is fixed), so rows are left-padded to a
common length with an attention mask and explicit positions. The begin-suppress rule
(no blank / end-of-text as the first token) applies only where a row's transcript is
still empty, i.e. not after a non-empty forced prefix: a prefix is text already decided,
so the next token is not the transcript's first.
Finished rows leave the batch (their cache rows are dropped), so the tail of a batch
costs only what its unfinished rows need.
"""
from __future__ import annotations

import torch


@torch.inference_mode()
def greedy_decode(adapter, encoder_states: torch.Tensor, prefixes: list[list[int]] | None = None,
                  max_new_tokens: int = 224) -> list[list[int]]:
    """Return, per row, the generated tokens after its prefix (end-of-text excluded)."""
    B = encoder_states.shape[0]
    device = encoder_states.device
    prefixes = prefixes or [[] for _ in range(B)]
    prompts = adapter.batch_prompts(encoder_states)
    seqs = [prompt + list(p) for prompt, p in zip(prompts, prefixes)]
    L = max(len(s) for s in seqs)
    limit = min(max_new_tokens, adapter.max_positions - L)
    eot = adapter.eot_id
    input_ids = torch.full((B, L), eot, dtype=torch.long, device=device)
    mask = torch.zeros((B, L), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        input_ids[i, L - len(s):] = torch.tensor(s, device=device)
        mask[i, L - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    empty = torch.tensor([len(p) == 0 for p in prefixes], device=device)

    generated: list[list[int]] = [[] for _ in range(B)]
    alive = torch.arange(B, device=device)
    cache = None
    enc = encoder_states
    step_ids, step_pos = input_ids, positions
    for step in range(max(limit, 0)):
        hidden, cache = adapter.decoder_hidden(step_ids, enc, cache, mask, step_pos)
        logits = adapter.logits(hidden[:, -1])
        logits.masked_fill_(adapter.suppress_mask, float("-inf"))
        if step == 0 and adapter.begin_suppress_ids.numel():
            rows = empty[alive].nonzero().squeeze(-1)
            if rows.numel():
                logits[rows.unsqueeze(-1), adapter.begin_suppress_ids] = float("-inf")
        next_tok = logits.argmax(-1)
        done = next_tok == eot
        for r, tok in zip(alive.tolist(), next_tok.tolist()):
            if tok != eot:
                generated[r].append(tok)
        keep = (~done).nonzero().squeeze(-1)
        if keep.numel() == 0:
            break
        if keep.numel() < alive.numel():
            alive, next_tok = alive[keep], next_tok[keep]
            enc, mask = enc[keep], mask[keep]
            step_pos = step_pos[keep]
            cache.batch_select_indices(keep)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        step_pos = step_pos[:, -1:] + 1
        step_ids = next_tok.unsqueeze(-1)
    return generated
