"""Shallow-fusion lookups of "FlexCTC: GPU-powered CTC Beam Decoding with advanced
Contextual Abilities" (§III-B, eq. 1): the ``alpha_LM log P_LM + alpha_BT log P_PB +
beta N`` part of a hypothesis score, from an NGPU-LM, a GPU-PB boosting tree or the
insertion bonus alone.

A lookup takes the fusion states of hypotheses [B, K] and candidate LM tokens [B, K, W]
and returns every candidate's weighted score plus handles that :meth:`advance` turns into
the next states of the candidates the search keeps. Token id ``vocab`` (V) is the
identity column: no new token, score 0, state unchanged. The caller decides which
candidates emit no token (for CTC blanks and repeats, for a transducer blanks), so the
lookups know nothing about frames or blanks and serve any label-synchronous or
frame-synchronous beam search.

A model with a dense table (:class:`pipeline.decoding.ctc_beam.fusion_table.DenseFusionTable`) is
folded into [states, V+1] tables of ``alpha * score (+ beta)`` and next state with the
identity column V, so scoring all candidates is one ``take`` and advancing the kept ones
another (:class:`DenseLookup`). The insertion bonus is folded into the first lookup.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from .fusion_table import DenseFusionTable


@runtime_checkable
class FusionModel(Protocol):
    """Shallow-fusion model (NGPU-LM, GPU-PB boosting tree) over the LM vocabulary: the V
    non-blank CTC tokens in order (LM index = CTC id - 1 when blank is 0). Scores are
    natural logs (boosting bonuses for the tree). Optionally also
    ``advance_labels(states[M], labels[M]) -> (scores[M], next_states[M])``, which the
    FLToP path uses to look up only the surviving tokens."""

    def init_states(self, batch_size: int, bos: bool = True) -> torch.Tensor: ...

    def advance(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def final(self, states: torch.Tensor) -> torch.Tensor: ...


class DenseLookup:
    """A :class:`DenseFusionTable` folded for the search: tables [S, V+1] of
    ``alpha * score (+ beta)`` and next state, with the identity column V (score 0, same
    state), and states kept as row offsets (state x (V+1)). One ``take`` scores every
    candidate; one more gives the kept candidates' next states."""

    def __init__(self, table: DenseFusionTable, alpha: float, beta: float):
        s, v = table.scores.shape
        self.model, self.width = table, v + 1
        zeros = torch.zeros((s, 1), dtype=table.scores.dtype, device=table.scores.device)
        self.scores = torch.cat([table.scores * alpha + beta, zeros], 1).contiguous()
        ids = torch.arange(s, dtype=torch.int64, device=table.scores.device)
        self.next = (torch.cat([table.next.long(), ids[:, None]], 1) * self.width).contiguous()
        self.identity_first_table = None

    def from_model_states(self, states: torch.Tensor) -> torch.Tensor:
        return states * self.width

    def model_states(self, offsets: torch.Tensor) -> torch.Tensor:
        return torch.div(offsets, self.width, rounding_mode="floor")

    def candidates(self, offsets: torch.Tensor, tokens: torch.Tensor):
        """[B, K, W] scores of ``tokens`` [B, K, W] and their handles (flat table indices)."""
        flat = offsets.unsqueeze(2) + tokens
        return self.scores.take(flat), flat

    def advance(self, handles: torch.Tensor) -> torch.Tensor:
        return self.next.take(handles)

    def advance_tokens(self, offsets: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Next states of hypotheses ``offsets`` after ``tokens`` (same shape), without
        scoring them first."""
        return self.next.take(offsets + tokens)

    def rows(self, offsets: torch.Tensor, identity_first: bool = True) -> torch.Tensor:
        """Every token's score for every hypothesis, [B, K, V+1], the identity column
        first (layouts with blank at column 0) or last (the table's own order). Rows are
        copied whole, which is cheaper than per-element takes over the full vocabulary."""
        if identity_first:
            if self.identity_first_table is None:
                self.identity_first_table = torch.nn.functional.pad(self.scores[:, :-1], (1, 0)).contiguous()
            table = self.identity_first_table
        else:
            table = self.scores
        b, k = offsets.shape
        return table.index_select(0, self.model_states(offsets).view(-1)).view(b, k, -1)


class GenericLookup:
    """Any :class:`FusionModel`: scores and next states of every candidate from
    ``advance_labels`` (or ``advance`` + gather), identity-column candidates masked."""

    def __init__(self, model, alpha: float, beta: float, vocab: int):
        self.model, self.alpha, self.beta, self.vocab = model, alpha, beta, vocab

    def from_model_states(self, states: torch.Tensor) -> torch.Tensor:
        return states

    def model_states(self, states: torch.Tensor) -> torch.Tensor:
        return states

    def candidates(self, states: torch.Tensor, tokens: torch.Tensor):
        b, k, w = tokens.shape
        new = tokens != self.vocab
        labels = tokens.clamp(max=self.vocab - 1)
        if hasattr(self.model, "advance_labels"):
            scores, nxt = self.model.advance_labels(states.unsqueeze(2).expand(b, k, w).reshape(-1), labels.reshape(-1))
            scores, nxt = scores.view(b, k, w), nxt.view(b, k, w)
        else:
            scores, nxt = self.model.advance(states.reshape(-1))
            scores = scores.view(b, k, -1).gather(2, labels)
            nxt = nxt.view(b, k, -1).gather(2, labels)
        scores = torch.where(new, scores.to(torch.float32) * self.alpha + self.beta, 0.0)
        return scores, torch.where(new, nxt, states.unsqueeze(2))

    def advance(self, handles: torch.Tensor) -> torch.Tensor:
        return handles


class BetaOnly:
    """No fusion model, only the insertion bonus on new tokens; it has no states, so its
    handles are None."""

    def __init__(self, beta: float, vocab: int):
        self.beta, self.vocab = beta, vocab

    def candidates(self, states, tokens: torch.Tensor):
        return torch.where(tokens != self.vocab, self.beta, 0.0), None


def fold_dense(model, max_bytes: int):
    """``model`` as an exact dense table when it reports its size and fits in
    ``max_bytes`` (0 disables), else ``model`` itself."""
    if model is None or max_bytes <= 0:
        return model
    return DenseFusionTable.maybe(model, max_bytes)


class ShallowFusion:
    """The LM and boosting tree a beam search fuses, each folded into a dense table where it
    is small. A tree passed per call (per-batch key phrases) is folded once and kept while
    the same tree comes back, so lookups and CUDA graphs built over it stay valid."""

    def __init__(self, lm, alpha_lm: float, boost, alpha_boost: float, max_bytes: int):
        self.lm, self.alpha_lm = fold_dense(lm, max_bytes), float(alpha_lm)
        self.boost, self.alpha_boost = fold_dense(boost, max_bytes), float(alpha_boost)
        self.max_bytes = max_bytes
        self._call_boost = None  # (tree given to the call, its dense table)

    def active(self, boost=None) -> list:
        """[(model, alpha)] of the models to fuse; ``boost`` replaces the search's own tree."""
        out = [(self.lm, self.alpha_lm)] if self.lm is not None else []
        if boost is None:
            boost = self.boost
        else:
            if self._call_boost is None or self._call_boost[0] is not boost:
                self._call_boost = (boost, fold_dense(boost, self.max_bytes))
            boost = self._call_boost[1]
        if boost is not None:
            out.append((boost, self.alpha_boost))
        return out


class LookupCache:
    """One lookup per fusion model, kept while the same model comes back, so folded
    tables are built once and CUDA graphs captured over them stay valid."""

    def __init__(self):
        self.entries: dict = {}  # (id(model), alpha, beta, device) -> (model, lookup)

    def lookups(self, fusion: list, beta: float, vocab: int, device) -> list:
        """Lookups for ``fusion`` [(model, alpha)], beta folded into the first; with no
        model, a :class:`BetaOnly` when beta is non-zero."""
        if not fusion:
            return [BetaOnly(beta, vocab)] if beta != 0.0 else []
        out = []
        for i, (model, alpha) in enumerate(fusion):
            b = beta if i == 0 else 0.0
            key = (id(model), alpha, b, str(device))
            hit = self.entries.get(key)
            if hit is None or hit[0] is not model:
                if isinstance(model, DenseFusionTable):
                    lookup = DenseLookup(model, alpha, b)
                else:
                    lookup = GenericLookup(model, alpha, b, vocab)
                hit = self.entries[key] = (model, lookup)
            out.append(hit[1])
        return out


def initial_states(fusion: list, lookups: list, batch: int, beam: int, device) -> list[torch.Tensor]:
    """[batch, beam] start states (after BOS) of every fusion model, in lookup form."""
    return [lookup.from_model_states(model.init_states(batch * beam, bos=True).to(device).view(batch, beam))
            for (model, _), lookup in zip(fusion, lookups)]


def add_final_scores(scores: torch.Tensor, fusion: list, lookups: list, states: list[torch.Tensor]) -> torch.Tensor:
    """``scores`` [B, K] plus ``alpha * final`` of every fusion model (the LM's
    end-of-sentence score, the boosting tree's final score)."""
    b, k = scores.shape
    fused = [lk for lk in lookups if not isinstance(lk, BetaOnly)]
    for (model, alpha), lookup, st in zip(fusion, fused, states):
        final = model.final(lookup.model_states(st).reshape(-1)).view(b, k).to(scores)
        scores = scores + alpha * final
    return scores
