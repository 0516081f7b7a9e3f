"""Frame-level token pruning of "FLToP CTC: Frame-Level Token Pruning via Relative Threshold
for Efficient and Memory-Saving Decoding on Diverse Platforms" (Algorithm 1).

Per frame, keep the top-N tokens of the acoustic distribution (lines 5 and 8), then only
those whose probability is at least R times the frame's best (lines 10-12). Pruning looks
at the frame alone, not at the hypotheses, so it is computed once per utterance and frame
and shared by every beam; the beam search then expands a gathered [B, beam, N] instead
of [B, beam, V+1] (including the LM/boosting lookups), which is where the speed comes from.

Pruned slots keep a fixed shape (N columns) with score -inf so the search has no
data-dependent shapes (CUDA-graph friendly).
"""
from __future__ import annotations

import math

import torch


def prune_frame(frame_log_probs: torch.Tensor, top_n: int, ratio: float | None):
    """Keep the top-``top_n`` tokens of each row of ``frame_log_probs`` [B, V+1] whose
    probability is >= ``ratio`` x the row's best.

    Returns ``(log_probs [B, N], tokens [B, N])``, sorted by score, pruned slots at -inf.
    """
    n = min(top_n, frame_log_probs.shape[-1])
    values, tokens = frame_log_probs.topk(n, dim=-1)
    if ratio is not None and ratio > 0.0:
        # p >= R * p_best  <=>  log p >= log p_best + log R
        keep = values >= values[:, :1] + math.log(ratio)
        values = values.masked_fill(~keep, float("-inf"))
    return values, tokens


def surviving_tokens(log_probs: torch.Tensor, lengths: torch.Tensor, top_n: int,
                     ratio: float | None) -> torch.Tensor:
    """Average number of tokens kept per valid frame (the FLToP paper's §4.3 statistic), [B]."""
    b, t, _ = log_probs.shape
    values, _ = prune_frame(log_probs.reshape(b * t, -1), top_n, ratio)
    kept = torch.isfinite(values).sum(-1).reshape(b, t).float()
    valid = torch.arange(t, device=log_probs.device)[None, :] < lengths.to(log_probs.device)[:, None]
    return (kept * valid).sum(1) / lengths.clamp(min=1).to(kept)
