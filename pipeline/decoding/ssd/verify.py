"""One-pass verification of CTC drafts by the decoder ("Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts", eq. 5).

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

``accept_tau`` (beyond the paper, for SSD's gate verification): a per-row acceptance
threshold at or below tau_slm. Row b is accepted when every token has probability >
accept_tau[b] and end-of-text follows; j (and the next token) are still found at tau_slm,
so one pass serves a gated draft checked at a low tau and the prefix its fallback needs if
that check fails. Without it every row is accepted at tau_slm, as in the paper.

``greedy`` (beyond the paper, ``ssd.verify_rule: greedy``): a draft token passes where it
is the decoder's own argmax, whatever its probability, so what is accepted is exactly what
greedy AR writes (eq. 5 keeps any token above tau_slm, which lets a draft close to, but
not equal to, the decoder's text through). No threshold applies: an argmax below tau_slm is
still the token greedy AR writes, and failing it would send a draft equal to AR's text to
the fallback.

``head_chunk`` (beyond the paper): the output projection runs over draft positions in
chunks and stops for a row at the chunk holding its first failure. The decisions (accept,
j, next token) are those of the full projection; a rejected row's ``min_prob`` is then the
minimum over the positions computed (still <= tau_slm).

The pass also leaves what that fallback needs to skip its own prefill (eqs. 6-7, "reuse
the verification KV cache, cropped to the prefix"): the decoder cache of the whole pass
(``cache``; row b's prompt + prefix occupy columns [lead_b, P + j_b)) and the greedy token
after the prefix (``next_token``: argmax of the masked logits at step j, which is exactly
what greedy decoding forced with tokens < j picks first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel


@dataclass
class Verification:
    accepted: torch.Tensor      # [B] bool
    first_reject: torch.Tensor  # [B] int64, j at tau_slm (= K when every token passes tau_slm;
                                # greedy: the first token that is not the argmax)
    min_prob: torch.Tensor      # [B] min draft-token probability (1.0 for an empty draft)
    token_probs: torch.Tensor   # [B, Kmax] probabilities of the draft tokens (0 on padding and
                                # beyond the head chunk holding j: never computed)
    next_token: torch.Tensor | None = None  # [B] greedy token after tokens < j
    cache: object = None        # the pass's decoder cache (self-attention: all P + Kmax columns)
    lead: torch.Tensor | None = None        # [B] left padding before each row's prompt
    prompt_end: int = 0         # P: column of the first draft token


@torch.inference_mode()
def verify_drafts(adapter: ARDecoderModel, encoder_states: torch.Tensor, drafts: list[list[int]],
                  tau_slm: float, head_chunk: int | None = None,
                  accept_tau: torch.Tensor | None = None, greedy: bool = False) -> Verification:
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
    # padding columns are masked: any position in range will do (the caller keeps every
    # row's prompt + draft within adapter.max_positions)
    positions = (cols - lead.unsqueeze(1)).clamp(min=0, max=adapter.max_positions - 1)
    hidden, cache = adapter.decoder_hidden(ids, encoder_states, None, mask, positions)
    # Only the positions that predict draft tokens (and the one after the draft).
    gather_at = (P - 1 + torch.minimum(steps.unsqueeze(0), K.unsqueeze(1)))      # [B, Kmax+1]
    h = hidden.gather(1, gather_at.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    targets = torch.cat([ids[:, P:], torch.full((B, 1), eot, device=device, dtype=torch.long)], 1)
    probs = torch.zeros((B, Kmax + 1), device=device)
    computed = torch.zeros((B, Kmax + 1), dtype=torch.bool, device=device)
    first_fail, next_token = K.clone(), torch.zeros_like(K)
    acc_tau = torch.full((B,), float(tau_slm), device=device) if accept_tau is None else \
        accept_tau.to(device=device, dtype=torch.float32).clamp(max=float(tau_slm))
    j_found = torch.zeros(B, dtype=torch.bool, device=device)
    acc_failed = torch.zeros(B, dtype=torch.bool, device=device)
    after = torch.full_like(K, -1)  # argmax after the whole draft, where it was reached
    alive = torch.arange(B, device=device)
    chunk = head_chunk or (Kmax + 1)
    # The output projection, chunk by chunk of draft positions, only for rows not yet
    # decided: a row is decided at its first token at or below its acceptance threshold
    # (tau_slm unless accept_tau) or at the position after its draft. Rejected drafts
    # usually fail early (mean j ~1.5-2.5 here), so long drafts need a fraction of the
    # [positions, vocabulary] logits. j is the first failure at tau_slm, never after the
    # first failure at a lower acceptance threshold, so its chunk is always computed.
    for c0 in range(0, Kmax + 1, chunk):
        if alive.numel() == 0:
            break
        c1 = min(c0 + chunk, Kmax + 1)
        logits = adapter.logits(h[alive, c0:c1])                               # [A, c1-c0, V]
        logits.masked_fill_(adapter.suppress_mask, float("-inf"))
        if c0 == 0 and adapter.begin_suppress_ids.numel():
            logits[:, 0, adapter.begin_suppress_ids] = float("-inf")
        logp = logits.log_softmax(-1)
        p = logp.gather(-1, targets[alive, c0:c1].unsqueeze(-1)).squeeze(-1).exp()
        Ka = K[alive]
        in_d = steps[c0:c1].unsqueeze(0) < Ka.unsqueeze(1)
        p = p.masked_fill(~in_d, 0.0)
        probs[alive, c0:c1] = p
        computed[alive, c0:c1] = True
        if greedy:
            # a token fails exactly where greedy AR would not have written it
            fails = (logits.argmax(-1) != targets[alive, c0:c1]) & in_d
            stops = fails.any(1)
        else:
            fails = (p <= tau_slm) & in_d
            stops = ((p <= acc_tau[alive].unsqueeze(1)) & in_d).any(1)
        rows = (fails.any(1) & ~j_found[alive]).nonzero().squeeze(-1)
        at = fails.float().argmax(1)
        first_fail[alive[rows]] = at[rows] + c0
        next_token[alive[rows]] = logits[rows, at[rows]].argmax(-1)
        j_found[alive[rows]] = True
        acc_failed[alive] |= stops
        ended = (Ka < c1) & ~stops
        rows = ended.nonzero().squeeze(-1)
        after[alive[rows]] = logits[rows, Ka[rows] - c0].argmax(-1)
        # Drafts that ended with no failure at tau_slm: j = K, the next token follows them.
        done = rows[~j_found[alive[rows]]]
        first_fail[alive[done]] = Ka[done]
        next_token[alive[done]] = after[alive[done]]
        j_found[alive[done]] = True
        alive = alive[~(stops | ended)]
    in_draft = steps[:Kmax].unsqueeze(0) < K.unsqueeze(1)
    probs = probs[:, :Kmax]
    accepted = ~acc_failed & (after == eot) & (K > 0)
    seen = in_draft & computed[:, :Kmax]
    min_prob = torch.where(seen, probs, torch.ones_like(probs)).min(1).values if Kmax else \
        torch.ones(B, device=device)
    return Verification(accepted=accepted, first_reject=first_fail, min_prob=min_prob, token_probs=probs,
                        next_token=next_token, cache=cache, lead=lead, prompt_end=P)
