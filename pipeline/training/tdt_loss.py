"""The TDT loss (and, as its special case, the RNN-T loss) of "Efficient Sequence Transduction by Jointly Predicting Tokens and
Durations" (Xu et al. 2023, §3.2: the forward variable alpha(t, u) summed over token arcs
of every duration d, including 0, and blank arcs of d >= 1), frame-synchronous.

transformers' ``tdt_loss`` walks the lattice's anti-diagonals and writes each into one
alpha tensor in place; its backward then copies that whole tensor once per diagonal, which
made it 6x its forward and most of a training step here. This version steps over frames
instead and keeps each frame's alpha as its own [B, U + 1] tensor. Within a frame, the
duration-0 token arcs chain u-1 -> u; that linear recursion in log space,
``a[u] = logaddexp(c[u], a[u-1] + w[u-1])``, is closed form:
``a[u] = W[u] + logcumsumexp_k(c[k] - W[k])`` with ``W[u] = sum_{j<u} w[j]``. Unreachable
cells hold a large negative finite number instead of -inf, so no gradient is NaN.
"""
from __future__ import annotations

import torch

UNREACHABLE = -1e9


def tdt_loss(token_logits: torch.Tensor, duration_logits: torch.Tensor | None, targets: torch.Tensor,
             logit_lengths: torch.Tensor, target_lengths: torch.Tensor, blank: int,
             durations: list[int] | None) -> torch.Tensor:
    """Per-utterance negative log-likelihood [B] of ``targets`` [B, U] given joint logits
    ``token_logits`` [B, T, U + 1, V] and ``duration_logits`` [B, T, U + 1, D].

    ``duration_logits=None``: the RNN-T loss (Graves 2012, eq. 16), a TDT whose tokens
    take duration 0 and whose blanks take duration 1, with certainty."""
    b, t_max, u1, _ = token_logits.shape
    tok = token_logits.float().log_softmax(-1)
    if duration_logits is None:
        durations = [0, 1]
        certain = torch.zeros((b, t_max, u1, 1), device=tok.device)
        never = torch.full_like(certain, UNREACHABLE)
        tok_dur, blank_dur = torch.cat([certain, never], 3), torch.cat([never, certain], 3)
    else:
        tok_dur = blank_dur = duration_logits.float().log_softmax(-1)
    blank_lp = tok[..., blank]                                              # [B, T, U+1]
    label_lp = torch.full_like(blank_lp, UNREACHABLE)
    if u1 > 1:
        label_lp = torch.cat([tok[:, :, :u1 - 1].gather(3, targets[:, None, :u1 - 1, None].expand(b, t_max, u1 - 1, 1))
                              .squeeze(3), label_lp[:, :, :1]], 2)              # [B, T, U+1], last column unused
    d_index = {d: i for i, d in enumerate(durations)}
    pad = torch.full((b, 1), UNREACHABLE, device=tok.device)
    start = torch.cat([torch.zeros((b, 1), device=tok.device), pad.expand(b, u1 - 1)], 1)
    alphas = []
    for t in range(t_max):
        parts = [start] if t == 0 else []
        for d in durations:
            if d == 0 or t - d < 0:
                continue
            a, i = alphas[t - d], d_index[d]
            parts.append(a + blank_lp[:, t - d] + blank_dur[:, t - d, :, i])
            shifted = a[:, :-1] + label_lp[:, t - d, :-1] + tok_dur[:, t - d, :-1, i]
            parts.append(torch.cat([pad, shifted], 1))
        if not parts:       # no arc reaches this frame (durations without 1)
            parts = [pad.expand(b, u1)]
        c = torch.logsumexp(torch.stack(parts), 0) if len(parts) > 1 else parts[0]
        if 0 in d_index and u1 > 1:
            w = label_lp[:, t, :-1] + tok_dur[:, t, :-1, d_index[0]]
            big_w = torch.cat([torch.zeros((b, 1), device=tok.device), w.cumsum(1)], 1)
            c = big_w + torch.logcumsumexp(c - big_w, 1)
        alphas.append(c)
    alpha = torch.stack(alphas, 1)                                          # [B, T, U+1]
    rows = torch.arange(b, device=tok.device)
    u_end = target_lengths.long()
    ends = []
    for d in durations:
        if d == 0:
            continue
        t_end = logit_lengths.long() - d
        t_safe = t_end.clamp(min=0)
        term = alpha[rows, t_safe, u_end] + blank_lp[rows, t_safe, u_end] + blank_dur[rows, t_safe, u_end, d_index[d]]
        ends.append(torch.where(t_end >= 0, term, torch.full_like(term, UNREACHABLE)))
    return -torch.logsumexp(torch.stack(ends), 0)
