"""Shallow fusion for transducer beam search, "Pushing the Limits of Beam Search Decoding
for Transducer-based ASR models" §2.3: an n-gram LM (NGPU-LM) and a phrase-boosting tree
over the model's non-blank tokens, with the two blank scorings and the two pruning points.

Per hypothesis and token k (p: the transducer's token distribution, lambda: the LM weight):

- eq. 2 (``blank_scoring="asr"``): ``ln p[k] + lambda ln p_LM[k]`` for k in V, ``ln p[blank]``
  for the blank;
- eq. 3 (``blank_scoring="lm"``): ``ln p[k] + lambda ln((1 - p[blank]) p_LM[k])`` for k in V,
  ``(1 + lambda) ln p[blank]`` for the blank;
- boosting adds ``alpha_boost`` x the tree's bonus to non-blank tokens (no blank term);
- late pruning scores every token with the LM before the per-hypothesis top-k; early
  pruning takes the top-k tokens by the ASR score first and looks up only those.

The LM and tree lookups are the CTC beam search's (pipeline.decoding.ctc_beam.fusion:
dense tables where the model is small, the model's own ``advance`` otherwise); LM token id
= model token id below the blank, id - 1 above it (pipeline.text.ctc_vocabulary.lm_index),
and the blank maps to the lookups' identity column (no token, state unchanged).
"""
from __future__ import annotations

import torch

from ..ctc_beam.fusion import DenseLookup, GenericLookup

BLANK_SCORINGS = ("asr", "lm")
PRUNINGS = ("early", "late")


def lm_token_map(vocab_size: int, blank: int, device) -> torch.Tensor:
    """[V] LM id of every model token; the blank gets V - 1, the identity column."""
    ids = torch.arange(vocab_size, device=device)
    lm = torch.where(ids > blank, ids - 1, ids)
    return torch.where(ids == blank, vocab_size - 1, lm)


def blank_terms(blank_lp: torch.Tensor, lam: float, blank_scoring: str):
    """(added to every non-blank token, the blank's fused log-prob) of eqs. 2 / 3."""
    if blank_scoring == "asr" or lam == 0.0:
        return torch.zeros_like(blank_lp), blank_lp
    # ln(1 - p[blank]), kept finite where the blank takes all the mass
    rest = torch.log(-torch.expm1(blank_lp.clamp(max=-1e-7)))
    return lam * rest, (1.0 + lam) * blank_lp


def full_rows(lookup, states: torch.Tensor, blank: int):
    """Every model token's weighted fusion score [B, K, V] (0 for the blank) and its
    handle for ``lookup.advance`` (a placeholder for the blank, which never advances)."""
    b, k = states.shape
    if isinstance(lookup, DenseLookup):
        v = lookup.width - 1
        scores = lookup.rows(states, identity_first=False)[..., :v]
        handles = states.unsqueeze(2) + torch.arange(v, device=states.device)
    elif isinstance(lookup, GenericLookup):
        raw, nxt = lookup.model.advance(states.reshape(-1))
        scores = raw.view(b, k, -1).to(torch.float32) * lookup.alpha
        handles = nxt.view(b, k, -1)
        if lookup.beta:
            scores = scores + lookup.beta
    else:
        raise TypeError(f"no full-vocabulary rows for {type(lookup).__name__}")
    pad = torch.zeros((b, k, 1), dtype=scores.dtype, device=scores.device)
    scores = torch.cat([scores[..., :blank], pad, scores[..., blank:]], 2)
    handles = torch.cat([handles[..., :blank], handles[..., :1], handles[..., blank:]], 2)
    return scores, handles
