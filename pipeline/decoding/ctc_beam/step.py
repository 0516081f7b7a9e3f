"""One frame of Algorithm 1 of "FlexCTC: GPU-powered CTC Beam Decoding with advanced
Contextual Abilities" for the whole batch, as torch ops.

Hypothesis score (eq. 1)::

    s = log P_CTC + alpha_LM * log P_LM + alpha_BT * log P_PB + beta * N

Per frame:

1. candidate scores [B, beam, W] = accumulated score + frame log-prob; tokens that are
   *new* (non-blank and not a repeat of the hypothesis's last frame label) also get
   ``beta`` and the weighted LM / boosting scores of their fusion state (the lookups of
   :mod:`pipeline.decoding.ctc_beam.fusion`; blanks and repeats use their identity column);
2. a flat TopK over beam x vocab per utterance (``preselect x beam`` candidates);
3. pruning: scores below ``best - theta`` become -inf;
4. recombination of equal hypotheses, i.e. equal (rolling hash, length, last label) --
   the hash of "Pushing the Limits of Beam Search Decoding for Transducer-based ASR
   models" (eq. 1); the merged score is the **max** (Viterbi) or the **logsumexp** (prefix
   probability) of the group; the survivor keeps the back-pointers of the best member;
   then the best ``beam`` survive. With ``preselect=1`` this is Algorithm 1 verbatim
   (duplicates can take beam slots); 2 merges before the final selection, as flashlight
   does, so that duplicates do not crowd distinct hypotheses out of the beam;
5. fusion states follow the parent, advancing only where a new token was emitted.

The step has no host sync and no data-dependent control flow, so the same function runs
eagerly and inside a captured CUDA graph.
"""
from __future__ import annotations

import torch

from .fusion import DenseLookup
from .state import HASH_BASE, HASH_MOD, NEG_INF, Beams


class FrameStep:
    """The frame step of one search configuration.

    Args:
        preselect: the flat TopK keeps ``preselect * beam`` candidates, recombines them,
            then keeps the best ``beam``.
        merge: "max" or "logsumexp" recombination.
        prune: whether theta pruning is on (the per-frame theta comes with the frames).
    """

    def __init__(self, preselect: int, merge: str, prune: bool):
        self.preselect, self.merge, self.prune = preselect, merge, prune
        self.vocab = None  # V: the fusion lookups' identity column
        self.ids = None    # [1, V+1] column ids of an unpruned frame
        self.masks: dict = {}

    def set_vocab(self, v1: int, device) -> None:
        """Set V from the input's V+1 columns (kept while it does not change)."""
        if self.ids is None or self.ids.shape[1] != v1 or self.ids.device != device:
            self.ids = torch.arange(v1, device=device)[None, :]
        self.vocab = v1 - 1

    def __call__(self, beams: Beams, values: torch.Tensor, tokens: torch.Tensor | None,
                 lm_tokens: torch.Tensor, threshold: torch.Tensor, lookups: list):
        """One frame for the whole batch. ``values`` [B, W]: the frame's log-probs (blank
        at 0), or with FLToP its surviving scores with ids ``tokens`` [B, N]; ``lm_tokens``
        their LM ids, V for blank ([1, V+1] without FLToP); ``threshold`` [B]. Returns the
        new beams and the chosen candidates [B, beam] (parent * W + column)."""
        if tokens is None:
            return self.full(beams, values, lm_tokens, threshold, lookups)
        b, k = beams.scores.shape
        w = values.shape[-1]
        vocab = self.vocab
        tok = tokens.unsqueeze(1)
        # fusion column of each candidate: its LM token when new (not blank, not the
        # last label), else the identity column V; blank's LM id is V already
        lm_cols = torch.where(tok != beams.last.unsqueeze(2), lm_tokens.unsqueeze(1), vocab)
        cand = beams.scores.unsqueeze(2) + values.unsqueeze(1)
        handles = []
        for lookup, states in zip(lookups, beams.fusion or [None]):
            bonus, handle = lookup.candidates(states, lm_cols)
            cand = cand + bonus
            handles.append(handle)
        # each candidate's recombination key: prefix key x (V+1) + last label; the
        # rolling hash and the length move only on new tokens
        key = beams.key
        h = key % HASH_MOD
        moved = (h * HASH_BASE).unsqueeze(2).add(tok).remainder_(HASH_MOD).add_((key - h + HASH_MOD).unsqueeze(2))
        cand_key = torch.where(lm_cols != vocab, moved, key.unsqueeze(2)).mul_(vocab + 1).add_(tok)
        m = min(k * self.preselect, k * w)
        scores, idx = cand.view(b, k * w).topk(m, dim=1)
        rkey = cand_key.view(b, k * w).gather(1, idx)
        scores = self.prune_and_recombine(scores, rkey, threshold)
        if m > k:  # merged first, then the best ``beam`` distinct hypotheses
            scores, keep = scores.topk(k, dim=1)
            idx, rkey = idx.gather(1, keep), rkey.gather(1, keep)
        states = [lookup.advance(handle.view(b, k * w).gather(1, idx))
                  for lookup, handle in zip(lookups, handles) if handle is not None]
        return Beams(scores, rkey % (vocab + 1), torch.div(rkey, vocab + 1, rounding_mode="floor"), states), idx

    def full(self, beams: Beams, values, lm_tokens, threshold, lookups: list):
        """The step over the whole vocabulary: [B, beam, V+1] candidates are many, so the
        recombination keys and fusion next states are computed after the TopK, for the
        ``preselect x beam`` candidates only."""
        b, k = beams.scores.shape
        w = values.shape[-1]
        vocab = w - 1
        last = beams.last
        cand = beams.scores.unsqueeze(2) + values.unsqueeze(1)
        lm_cols, handles = None, []
        for lookup, states in zip(lookups, beams.fusion or [None]):
            if isinstance(lookup, DenseLookup):
                # a repeat of the last label is no new token: it scores like blank
                cand = cand + lookup.rows(states, identity_first=True).scatter_(2, last.unsqueeze(2), 0.0)
                handles.append(None)
                continue
            if lm_cols is None:
                lm_cols = torch.where(self.ids.unsqueeze(1) != last.unsqueeze(2), lm_tokens.unsqueeze(1), vocab)
            bonus, handle = lookup.candidates(states, lm_cols)
            cand = cand + bonus
            handles.append(handle)
        m = min(k * self.preselect, k * w)
        scores, idx = cand.view(b, k * w).topk(m, dim=1)
        parent = torch.div(idx, w, rounding_mode="floor")
        col = idx - parent * w
        new = (col != 0) & (col != last.gather(1, parent))
        kp = beams.key.gather(1, parent)
        h = kp % HASH_MOD
        moved = (h * HASH_BASE).add_(col).remainder_(HASH_MOD).add_(kp - h + HASH_MOD)
        rkey = torch.where(new, moved, kp).mul_(w).add_(col)
        scores = self.prune_and_recombine(scores, rkey, threshold)
        if m > k:
            scores, keep = scores.topk(k, dim=1)
            idx, rkey = idx.gather(1, keep), rkey.gather(1, keep)
            parent, col, new = parent.gather(1, keep), col.gather(1, keep), new.gather(1, keep)
        states = []
        lm_sel = None
        for lookup, old, handle in zip(lookups, beams.fusion or [None], handles):
            if isinstance(lookup, DenseLookup):
                if lm_sel is None:
                    lm_sel = torch.where(new, col - 1, vocab)
                states.append(lookup.advance_tokens(old.gather(1, parent), lm_sel))
            elif handle is not None:
                states.append(lookup.advance(handle.view(b, k * w).gather(1, idx)))
        return Beams(scores, rkey % w, torch.div(rkey, w, rounding_mode="floor"), states), idx

    def prune_and_recombine(self, scores, key, threshold):
        """Theta pruning against the best candidate, then recombination of equal keys
        into the first (best-scored: TopK output is sorted) member of each group; the
        others become -inf. With max merge both are masks and are applied together."""
        same = key.unsqueeze(2) == key.unsqueeze(1)
        duplicate = (same & self.earlier(scores.shape[1], scores.device)).any(-1)
        if self.prune:
            pruned = scores < scores[:, :1] - threshold.unsqueeze(1)
            if self.merge == "logsumexp":
                scores = scores.masked_fill(pruned, NEG_INF)
            else:
                duplicate = duplicate | pruned
        if self.merge == "logsumexp":
            scores = torch.logsumexp(scores.unsqueeze(1).masked_fill(~same, NEG_INF), dim=-1)
        return scores.masked_fill(duplicate, NEG_INF)

    def recombine(self, scores, key):
        """Merge equal keys into the first (best) member of each group (no pruning)."""
        same = key.unsqueeze(2) == key.unsqueeze(1)
        duplicate = (same & self.earlier(scores.shape[1], scores.device)).any(-1)
        if self.merge == "logsumexp":
            scores = torch.logsumexp(scores.unsqueeze(1).masked_fill(~same, NEG_INF), dim=-1)
        return scores.masked_fill(duplicate, NEG_INF)

    def earlier(self, k: int, device) -> torch.Tensor:
        """[k, k] mask of j < i, constant per shape: cached so that no frame rebuilds it,
        and a captured CUDA graph reads the one built during its warm-up."""
        key = (k, str(device))
        if key not in self.masks:
            self.masks[key] = torch.ones(k, k, dtype=torch.bool, device=device).tril(-1)
        return self.masks[key]
