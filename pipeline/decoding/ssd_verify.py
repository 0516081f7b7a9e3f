"""One-pass verification of CTC drafts by the decoder (seed 000, eq. 5).

All drafts of a batch are right-padded behind the prompt and scored in ONE teacher-forced
decoder pass over the (reused) encoder output. Logits are computed only where they are
needed: the hidden state at position P-1+k predicts draft token k (prompt length P), and
the one at P-1+K predicts what follows the whole draft. Prompts may differ per row
(``adapter.batch_prompts``); shorter ones are left-padded so that every prompt ends at
column P-1, and positions count from each row's first real token. The suppress masks of
greedy decoding apply, so a token greedy decoding could never emit is never accepted.

A draft is accepted when every token has probability > tau_slm and end-of-text is the
most likely token after it; otherwise j is the first failing position (j = K when all
tokens pass but the draft is incomplete), and AR decoding resumes from tokens < j.

The pass also leaves what that fallback needs to skip its own prefill (eqs. 6-7, "reuse
the verification KV cache, cropped to the prefix"): the decoder cache of the whole pass
(``cache``; row b's prompt + prefix occupy columns [lead_b, P + j_b)) and the greedy token
after the prefix (``next_token``: argmax of the masked logits at step j, which is exactly
what greedy decoding forced with tokens < j picks first).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Verification:
    accepted: torch.Tensor      # [B] bool
    first_reject: torch.Tensor  # [B] int64, j (= K when accepted)
    min_prob: torch.Tensor      # [B] min draft-token probability (1.0 for an empty draft)
    token_probs: torch.Tensor   # [B, Kmax] probabilities of the draft tokens (0 on padding)
    next_token: torch.Tensor | None = None  # [B] greedy token after tokens < j
    cache: object = None        # the pass's decoder cache (self-attention: all P + Kmax columns)
    lead: torch.Tensor | None = None        # [B] left padding before each row's prompt
    prompt_end: int = 0         # P: column of the first draft token


@torch.inference_mode()
def verify_drafts(adapter, encoder_states: torch.Tensor, drafts: list[list[int]],
                  tau_slm: float) -> Verification:
    B = len(drafts)
    device = encoder_states.device
    prompts = adapter.batch_prompts(encoder_states)
    P = max((len(p) for p in prompts), default=0)
    lead = torch.tensor([P - len(p) for p in prompts], dtype=torch.long, device=device)  # left padding
    K = torch.tensor([len(d) for d in drafts], device=device)
    Kmax = int(K.max()) if B else 0
    eot = adapter.eot_id
    ids = torch.full((B, P + Kmax), eot, dtype=torch.long, device=device)
    for i, (p, d) in enumerate(zip(prompts, drafts)):
        ids[i, P - len(p):P + len(d)] = torch.tensor(p + list(d), dtype=torch.long, device=device)
    steps = torch.arange(Kmax + 1, device=device)
    cols = torch.arange(P + Kmax, device=device).unsqueeze(0)
    mask = ((cols >= lead.unsqueeze(1)) & (cols < (P + K).unsqueeze(1))).long()
    positions = (cols - lead.unsqueeze(1)).clamp(min=0)
    hidden, cache = adapter.decoder_hidden(ids, encoder_states, None, mask, positions)
    # Only the positions that predict draft tokens (and the one after the draft).
    gather_at = (P - 1 + torch.minimum(steps.unsqueeze(0), K.unsqueeze(1)))      # [B, Kmax+1]
    h = hidden.gather(1, gather_at.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    logits = adapter.logits(h)                                                  # [B, Kmax+1, V]
    logits.masked_fill_(adapter.suppress_mask, float("-inf"))
    if adapter.begin_suppress_ids.numel():
        logits[:, 0, adapter.begin_suppress_ids] = float("-inf")
    logp = logits.log_softmax(-1)
    targets = torch.cat([ids[:, P:], torch.full((B, 1), eot, device=device, dtype=torch.long)], 1)
    probs = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).exp()[:, :Kmax]  # [B, Kmax]
    in_draft = steps[:Kmax].unsqueeze(0) < K.unsqueeze(1)
    probs = probs.masked_fill(~in_draft, 0.0)
    fails = (probs <= tau_slm) & in_draft
    first_fail = torch.where(fails.any(1), fails.float().argmax(1), K)
    after = logits[torch.arange(B, device=device), K]                          # [B, V]
    ends = after.argmax(-1) == eot
    accepted = (first_fail == K) & ends & (K > 0)
    min_prob = torch.where(in_draft, probs, torch.ones_like(probs)).min(1).values if Kmax else \
        torch.ones(B, device=device)
    next_token = logits[torch.arange(B, device=device), first_fail].argmax(-1)
    return Verification(accepted=accepted, first_reject=first_fail, min_prob=min_prob, token_probs=probs,
                        next_token=next_token, cache=cache, lead=lead, prompt_end=P)
