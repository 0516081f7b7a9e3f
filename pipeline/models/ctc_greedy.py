"""Batched greedy CTC decoding (best path) and per-frame entropies (the SSD gate's inputs).

Greedy CTC (Graves et al. 2006): per-frame argmax, then collapse repeats and drop blanks.
The gate of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts" (eq. 3) needs the entropy of each frame's distribution and its maximum over
the *valid* frames. Frames at or past an utterance's length are ignored everywhere.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CTCGreedy:
    tokens: list[list[int]]      # collapsed ids per utterance (blank removed)
    frames: list[list[int]]      # frame index at which each token was emitted
    entropy: torch.Tensor        # [B, T] natural-log entropy per frame, 0 on padded frames
    max_entropy: torch.Tensor    # [B] max entropy over valid frames


def emitted_mask(frame_labels: torch.Tensor, blank: int = 0) -> torch.Tensor:
    """[..., T] bool: frames that emit a token under the CTC rule (non-blank, and not a
    repeat of the previous frame's label)."""
    prev = torch.nn.functional.pad(frame_labels[..., :-1], (1, 0), value=blank)
    return (frame_labels != blank) & (frame_labels != prev)


@torch.inference_mode()
def ctc_greedy(log_probs: torch.Tensor, lengths: torch.Tensor | None = None,
               blank: int = 0) -> CTCGreedy:
    """Greedy CTC over normalised ``log_probs`` [B, T, V+1] with valid ``lengths`` [B]."""
    b, t, _ = log_probs.shape
    if lengths is None:
        lengths = torch.full((b,), t, dtype=torch.long)
    lengths = lengths.to(log_probs.device)
    valid = torch.arange(t, device=log_probs.device)[None, :] < lengths[:, None]
    best = torch.where(valid, log_probs.argmax(dim=-1), torch.full((b, t), blank, device=log_probs.device))
    entropy = -(log_probs.exp() * log_probs).nan_to_num(0.0).sum(-1)
    entropy = torch.where(valid, entropy, torch.zeros_like(entropy))
    keep = emitted_mask(best, blank)
    tokens, frames = [], []
    for row, mask in zip(best.tolist(), keep.tolist()):
        idx = [i for i, m in enumerate(mask) if m]
        frames.append(idx)
        tokens.append([row[i] for i in idx])
    # a batch of clips too short for a single frame has nothing to take a maximum over
    max_entropy = entropy.amax(dim=1) if t else entropy.new_zeros(b)
    return CTCGreedy(tokens=tokens, frames=frames, entropy=entropy, max_entropy=max_entropy)
