"""FlexCTC: fully batched CTC beam search over [B, beam, V+1] tensors (seed 002, Algorithm 1).

Hypothesis score (seed 002 eq. 1)::

    s = log P_CTC + alpha_LM * log P_LM + alpha_BT * log P_PB + beta * N

A hypothesis is a CTC prefix plus the label of its last frame (blank or its last token),
kept in [B, beam] tensors. Per frame:

1. candidate scores [B, beam, V+1] = accumulated score + frame log-prob; tokens that are
   *new* (non-blank and not a repeat of the hypothesis's last frame label) also get
   ``beta`` and the weighted LM / boosting scores of their fusion state;
2. a flat TopK over beam x vocab per utterance (``preselect x beam`` candidates);
3. pruning: scores below ``best - prune_threshold`` become -inf;
4. recombination of equal hypotheses, i.e. equal (rolling hash, length, last label);
   the merged score is the **max** (Viterbi, the default) or the **logsumexp** (prefix
   probability) of the group, ``merge="max"|"logsumexp"``; the survivor keeps the
   back-pointers of the best member; then the best ``beam`` survive. With
   ``preselect=1`` this is Algorithm 1 verbatim (duplicates can take beam slots); the
   default 2 merges before the final selection, which is what flashlight does, and
   matched flashlight-text's max-merge results exactly on the libri logits with an LM;
5. fusion states follow the parent, advancing only where a new token was emitted.

Storage is the trie of seed 004 §2.1: per frame one label and one back-pointer per
hypothesis ([T, B, beam] each), so a prefix is never copied; transcripts and emission
frames (for word timestamps) are read back once at the end. The rolling hash
``h' = (h * P + token) mod M`` (seed 004 eq. 1) changes only on new tokens.

FLToP (seed 003, ``flop_top_n``/``flop_ratio``): the expansion and the fusion lookups use
each frame's pruned token list, [B, beam, N] instead of [B, beam, V+1]. Off = exact search.

Finished utterances (t >= length) are frozen: their padded frames are replaced by a
frame where blank has log-prob 0 and every other token -inf, with no pruning, so scores,
fusion states and hypotheses stay as they were (NeMo adds padded-frame scores; we do
not). The LM end-of-sentence score (and the boosting tree's final score) is added after
the last frame, then hypotheses that differ only in their last label are merged.

The only Python loop in the search is over frames, with no host sync and no
data-dependent control flow inside it, so the frame step can be captured in a CUDA graph
(``pipeline.decoding.ctc_beam_graphs``); eager mode is the same step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from pipeline.decoding.flop import prune_frame
from pipeline.decoding.fusion_table import DenseFusionTable

HASH_BASE = 1_000_003
HASH_MOD = 2_147_483_647  # 2^31 - 1: hash * HASH_BASE + token stays far below 2^63
NEG_INF = float("-inf")


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


@dataclass
class BeamSearchResult:
    """Per utterance b: ``tokens[b]`` (CTC ids, collapsed, no blanks) of the best
    hypothesis, ``scores[b]`` its eq. 1 score, ``token_frames[b]`` the frame at which each
    token was emitted; the n-best lists are sorted best first (missing entries have score
    -inf and no tokens). ``alignments`` [B, n, T] are the frame labels of each n-best
    hypothesis's surviving alignment. ``avg_beams`` [B]: mean number of live hypotheses
    per valid frame (when ``track_beams``)."""

    tokens: list[list[int]]
    scores: torch.Tensor
    token_frames: list[list[int]]
    nbest_tokens: list[list[list[int]]]
    nbest_scores: torch.Tensor
    nbest_frames: list[list[list[int]]]
    alignments: torch.Tensor
    avg_beams: torch.Tensor | None = None

    def words(self, b: int, space_token: int, frame_shift_s: float = 1.0):
        """Word timestamps of utterance ``b``'s best hypothesis (see ``word_timestamps``)."""
        return word_timestamps(self.tokens[b], self.token_frames[b], space_token, frame_shift_s)


def word_timestamps(tokens: list[int], frames: list[int], space_token: int,
                    frame_shift_s: float = 1.0) -> list[tuple[list[int], float, float]]:
    """Split a token sequence at ``space_token`` into words: ``(word_tokens, start, end)``
    with start = first token's frame and end = last token's frame + 1, times
    ``frame_shift_s`` (Whisper encoder frames are 0.02 s)."""
    words, cur, start, end = [], [], 0, 0
    for tok, fr in zip(tokens, frames):
        if tok == space_token:
            if cur:
                words.append((cur, start * frame_shift_s, end * frame_shift_s))
            cur = []
            continue
        if not cur:
            start = fr
        cur.append(tok)
        end = fr + 1
    if cur:
        words.append((cur, start * frame_shift_s, end * frame_shift_s))
    return words


@dataclass
class _Beams:
    """Search state of every hypothesis, [B, beam] each."""

    scores: torch.Tensor      # float32, -inf = dead slot
    last: torch.Tensor        # int64 label of the last frame (internal ids, 0 = blank)
    hash: torch.Tensor        # int64 rolling hash of the prefix
    length: torch.Tensor      # int64 prefix length N
    fusion: list[torch.Tensor]  # int64 states, one per fusion model


class CTCBeamSearch:
    """Batched CTC beam search with shallow fusion and FLToP (see module docstring).

    Args:
        beam_size: hypotheses kept per utterance (K).
        blank: CTC blank id in the input's last dimension.
        beta: insertion bonus per new token (eq. 1's beta).
        lm, alpha_lm: an n-gram LM implementing :class:`FusionModel` and its weight.
        boost, alpha_boost: a phrase-boosting tree (same protocol) and its weight; a
            per-batch tree (per-utterance phrase lists) can be given to ``__call__``.
        prune_threshold: theta; hypotheses below best - theta are dropped (None = off).
        flop_top_n, flop_ratio: FLToP's N and R (None = exact search over all tokens).
        nbest: how many hypotheses to return per utterance (default: beam_size).
        merge: "max" (Viterbi recombination) or "logsumexp" (prefix probability).
        track_beams: also report the mean number of live hypotheses per frame.
        use_cuda_graphs: on CUDA, replay a captured frame step (falls back to eager
            when capture fails); ignored on CPU.
        preselect: the flat TopK keeps ``preselect * beam_size`` candidates, recombines
            them, then keeps the best ``beam_size``; 1 = Algorithm 1 (recombine after
            TopK, duplicates may occupy beam slots), 2-3 = merge before selection, as
            flashlight does.
        dense_fusion_max_bytes: fusion models that report their state count and fit
            are replaced by exact dense [states, V] lookup tables
            (``pipeline.decoding.fusion_table``); 0 disables.

    ``__call__(log_probs [B, T, V+1], lengths [B]) -> BeamSearchResult``; log_probs must be
    normalised log-probabilities (log_softmax).
    """

    def __init__(self, beam_size: int, blank: int = 0, beta: float = 0.0, lm: FusionModel | None = None,
                 alpha_lm: float = 0.0, boost: FusionModel | None = None, alpha_boost: float = 0.0,
                 prune_threshold: float | None = None, flop_top_n: int | None = None,
                 flop_ratio: float | None = None, nbest: int | None = None, merge: str = "max",
                 track_beams: bool = False, use_cuda_graphs: bool = True,
                 dense_fusion_max_bytes: int = 256 * 2 ** 20, preselect: int = 2):
        if beam_size < 1:
            raise ValueError("beam_size must be >= 1")
        if blank < 0:
            raise ValueError("blank must be a non-negative index")
        if merge not in ("max", "logsumexp"):
            raise ValueError("merge must be 'max' or 'logsumexp'")
        if flop_top_n is None and flop_ratio is not None:
            raise ValueError("flop_ratio needs flop_top_n")
        self.beam_size = beam_size
        self.blank = blank
        self.beta = float(beta)
        self.dense_fusion_max_bytes = dense_fusion_max_bytes
        if preselect < 1:
            raise ValueError("preselect must be >= 1")
        self.preselect = preselect
        self.lm, self.alpha_lm = self._dense(lm), float(alpha_lm)
        self.boost, self.alpha_boost = self._dense(boost), float(alpha_boost)
        self.prune_threshold = prune_threshold
        self.flop_top_n, self.flop_ratio = flop_top_n, flop_ratio
        self.nbest = nbest or beam_size
        self.merge = merge
        self.track_beams = track_beams
        self.use_cuda_graphs = use_cuda_graphs
        self._graphs: dict = {}  # input shape -> GraphedFrameLoop
        self._masks: dict = {}
        self._call_boost = None  # (tree given to __call__, its dense table)

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor | None = None,
                 boost: FusionModel | None = None) -> BeamSearchResult:
        b, t, v1 = log_probs.shape
        device = log_probs.device
        if lengths is None:
            lengths = torch.full((b,), t, dtype=torch.int64)
        lengths = lengths.to(device=device, dtype=torch.int64)
        fusion = self._fusion(boost)
        frames, tokens, theta = self._frames(log_probs, lengths)
        beams = self._init_beams(b, device, fusion)
        loop = self.eager_loop
        if self.use_cuda_graphs and device.type == "cuda":
            graphs = self._graphed_loop(frames, tokens, fusion)
            if graphs.ok:
                loop = graphs.run
        beams, labels, parents, alive = loop(frames, tokens, theta, beams, fusion, lengths)
        return self._finish(beams, labels, parents, alive, fusion, lengths)

    def _graphed_loop(self, frames, tokens, fusion):
        from pipeline.decoding.ctc_beam_graphs import GraphedFrameLoop

        key = (tuple(frames.shape), str(frames.device))
        graphs = self._graphs.get(key)
        if graphs is None or not graphs.matches(frames, fusion):
            graphs = self._graphs[key] = GraphedFrameLoop(self, frames, tokens, fusion)
        return graphs

    # --------------------------------------------------------------- the search
    def _fusion(self, boost):
        """[(model, alpha)] of the active fusion models."""
        out = []
        if self.lm is not None:
            out.append((self.lm, self.alpha_lm))
        if boost is None:
            boost = self.boost
        else:  # per-batch tree: keep its table while the same tree comes back (graph reuse)
            if self._call_boost is None or self._call_boost[0] is not boost:
                self._call_boost = (boost, self._dense(boost))
            boost = self._call_boost[1]
        if boost is not None:
            out.append((boost, self.alpha_boost))
        return out

    def _dense(self, model):
        if model is None or self.dense_fusion_max_bytes <= 0:
            return model
        return DenseFusionTable.maybe(model, self.dense_fusion_max_bytes)

    def _frames(self, log_probs, lengths):
        """Frames [T, B, V+1] with blank moved to column 0 and padded frames frozen (blank
        0, others -inf); with FLToP, every frame pruned up front (the pruning does not
        depend on the hypotheses): scores and token ids [T, B, N]; tokens are None
        otherwise. Plus per-frame pruning thresholds [T, B] (inf = none)."""
        b, t, v1 = log_probs.shape
        lp = log_probs.float()
        if self.blank != 0:
            blank = self.blank
            lp = torch.cat([lp[..., blank:blank + 1], lp[..., :blank], lp[..., blank + 1:]], dim=-1)
        valid = torch.arange(t, device=lp.device)[:, None] < lengths[None, :]       # [T, B]
        frozen = torch.full((v1,), NEG_INF, device=lp.device)
        frozen[0] = 0.0
        frames = torch.where(valid[:, :, None], lp.transpose(0, 1), frozen)
        theta = float("inf") if self.prune_threshold is None else float(self.prune_threshold)
        thresholds = torch.where(valid, torch.tensor(theta, device=lp.device),
                                 torch.tensor(float("inf"), device=lp.device))
        tokens = None
        if self.flop_top_n is not None:
            values, tokens = prune_frame(frames.view(t * b, v1), self.flop_top_n, self.flop_ratio)
            frames, tokens = values.view(t, b, -1), tokens.view(t, b, -1).contiguous()
        return frames.contiguous(), tokens, thresholds.contiguous()

    def _init_beams(self, b, device, fusion) -> _Beams:
        k = self.beam_size
        scores = torch.full((b, k), NEG_INF, device=device)
        scores[:, 0] = 0.0
        zeros = torch.zeros((b, k), dtype=torch.int64, device=device)
        states = [model.init_states(b * k, bos=True).to(device).view(b, k) for model, _ in fusion]
        return _Beams(scores, zeros.clone(), zeros.clone(), zeros.clone(), states)

    def eager_loop(self, frames, tokens, thresholds, beams, fusion, lengths):
        t, b, _ = frames.shape
        labels, parents = [], []
        alive = torch.zeros(b, device=frames.device) if self.track_beams else None
        valid = (torch.arange(t, device=frames.device)[:, None] < lengths[None, :]).float()
        for i in range(t):
            beams, label, parent = self.step(beams, frames[i], None if tokens is None else tokens[i],
                                             thresholds[i], fusion)
            labels.append(label)
            parents.append(parent)
            if alive is not None:
                alive = alive + (beams.scores > NEG_INF).sum(1) * valid[i]
        if t == 0:
            empty = torch.zeros((0, b, self.beam_size), dtype=torch.int64, device=frames.device)
            return beams, empty, empty, alive
        return beams, torch.stack(labels), torch.stack(parents), alive

    def step(self, beams: _Beams, frame: torch.Tensor, tokens: torch.Tensor | None,
             threshold: torch.Tensor, fusion):
        """One frame of Algorithm 1 for the whole batch. ``frame`` [B, V+1] (blank at 0), or
        with FLToP the frame's surviving scores and ``tokens`` [B, N]; ``threshold`` [B].
        Returns the new beams, the chosen labels and parents [B, beam]."""
        b, k = beams.scores.shape
        if tokens is not None:
            cand, cand_labels, next_states = self._expand_pruned(beams, frame, tokens, fusion)
        else:
            cand, cand_labels, next_states = self._expand_full(beams, frame, fusion)
        width = cand.shape[-1]
        m = min(k * self.preselect, k * width)
        scores, idx = cand.view(b, k * width).topk(m, dim=1)
        if self.prune_threshold is not None:
            scores = scores.masked_fill(scores < scores[:, :1] - threshold[:, None], NEG_INF)
        parent = torch.div(idx, width, rounding_mode="floor")
        label = idx - parent * width if cand_labels is None else cand_labels.gather(1, idx - parent * width)
        last_parent = beams.last.gather(1, parent)
        is_new = (label != 0) & (label != last_parent)
        hash_parent = beams.hash.gather(1, parent)
        new_hash = torch.where(is_new, (hash_parent * HASH_BASE + label) % HASH_MOD, hash_parent)
        length = beams.length.gather(1, parent) + is_new.long()
        # a non-blank last label is always the prefix's last token, so (hash, length) plus
        # "ends in blank" identifies (prefix, last label)
        scores = self._recombine(scores, (length * HASH_MOD + new_hash) * 2 + (label == 0).long())
        if m > k:  # merged first, then the best ``beam`` distinct hypotheses
            scores, keep = scores.topk(k, dim=1)
            idx, parent, label = idx.gather(1, keep), parent.gather(1, keep), label.gather(1, keep)
            new_hash, length, is_new = new_hash.gather(1, keep), length.gather(1, keep), is_new.gather(1, keep)
        states = []
        for (model, _), old, nxt in zip(fusion, beams.fusion, next_states):
            if nxt is not None:
                states.append(nxt.view(b, -1).gather(1, idx))
            else:  # look the next state up only for the kept (parent, token) pairs
                prev = old.gather(1, parent)
                moved = model.advance_labels(prev, (label - 1).clamp(min=0))[1]
                states.append(torch.where(is_new, moved, prev))
        return _Beams(scores, label, new_hash, length, states), label, parent

    def _expand_full(self, beams: _Beams, frame, fusion):
        """Candidates over the whole vocabulary: [B, beam, V+1]."""
        b, k = beams.scores.shape
        cand = beams.scores[:, :, None] + frame[:, None, :]
        if not fusion and self.beta == 0.0:
            return cand, None, []
        bonus = None  # beta + sum of alpha * fusion scores over the V non-blank tokens
        next_states = []
        for (model, alpha), states in zip(fusion, beams.fusion):
            if hasattr(model, "advance_labels"):  # next states later, for kept tokens only
                if hasattr(model, "scores_only"):
                    scores = model.scores_only(states)
                else:
                    scores = model.advance(states.reshape(-1))[0]
                next_states.append(None)
            else:
                scores, nxt = model.advance(states.reshape(-1))
                # blank and repeat columns keep the current state
                nxt = torch.cat([states[:, :, None], nxt.view(b, k, -1)], dim=2)
                next_states.append(nxt.scatter_(2, beams.last[:, :, None], states[:, :, None]))
            scores = scores.view(b, k, -1)
            bonus = scores.mul(alpha).add_(self.beta) if bonus is None else bonus.add_(scores, alpha=alpha)
        if bonus is None:
            bonus = torch.full((b, k, frame.shape[-1] - 1), self.beta, device=frame.device)
        # column 0 is blank; the repeat column (last label) gets nothing either
        bonus = torch.nn.functional.pad(bonus, (1, 0)).scatter_(2, beams.last[:, :, None], 0.0)
        return cand.add_(bonus), None, next_states

    def _expand_pruned(self, beams: _Beams, values, tokens, fusion):
        """FLToP candidates: only each frame's surviving tokens, [B, beam, N]."""
        b, k = beams.scores.shape
        n = tokens.shape[1]
        cand = beams.scores[:, :, None] + values[:, None, :]
        if not fusion and self.beta == 0.0:
            return cand, tokens, []
        is_new = (tokens[:, None, :] != 0) & (tokens[:, None, :] != beams.last[:, :, None])
        lm_tokens = (tokens - 1).clamp(min=0)
        bonus = torch.full((b, k, n), self.beta, device=values.device)
        next_states = []
        for (model, alpha), states in zip(fusion, beams.fusion):
            if hasattr(model, "advance_labels"):
                flat_states = states[:, :, None].expand(b, k, n).reshape(-1)
                scores, nxt = model.advance_labels(flat_states, lm_tokens[:, None, :].expand(b, k, n).reshape(-1))
                scores, nxt = scores.view(b, k, n), nxt.view(b, k, n)
            else:
                scores, nxt = model.advance(states.reshape(-1))
                index = lm_tokens[:, None, :].expand(b, k, n)
                scores = scores.view(b, k, -1).gather(2, index)
                nxt = nxt.view(b, k, -1).gather(2, index)
            bonus = bonus + alpha * scores
            next_states.append(torch.where(is_new, nxt, states[:, :, None]))
        return cand + torch.where(is_new, bonus, 0.0), tokens, next_states

    def _recombine(self, scores, key):
        """Merge hypotheses with equal keys into the first (best-scored: TopK output is
        sorted) member of each group; the others become -inf."""
        same = key[:, :, None] == key[:, None, :]
        duplicate = (same & self._earlier(scores.shape[1], scores.device)).any(-1)
        if self.merge == "logsumexp":
            scores = torch.logsumexp(scores[:, None, :].masked_fill(~same, NEG_INF), dim=-1)
        return scores.masked_fill(duplicate, NEG_INF)

    def _earlier(self, k: int, device) -> torch.Tensor:
        """[k, k] mask of j < i (constant per shape; cached outside CUDA-graph capture)."""
        key = (k, str(device))
        if key not in self._masks:
            self._masks[key] = torch.ones(k, k, dtype=torch.bool, device=device).tril(-1)
        return self._masks[key]

    # ------------------------------------------------------------------ the end
    def _finish(self, beams: _Beams, labels, parents, alive, fusion, lengths) -> BeamSearchResult:
        b, k = beams.scores.shape
        scores = beams.scores
        for (model, alpha), states in zip(fusion, beams.fusion):
            final = model.final(states.reshape(-1)).view(b, k).to(scores)
            scores = scores + alpha * final
        # hypotheses that differ only in the last frame label are one transcript
        scores, order = scores.sort(dim=1, descending=True)
        key = (beams.length * HASH_MOD + beams.hash).gather(1, order)
        scores = self._recombine(scores, key)
        n = min(self.nbest, k)
        nbest_scores, pos = scores.topk(n, dim=1)
        slots = order.gather(1, pos)
        align = self._backtrack(labels, parents, slots)                     # [B, n, T]
        align = self._external_ids(align)
        prev = torch.nn.functional.pad(align[..., :-1], (1, 0), value=self.blank)
        emit = (align != self.blank) & (align != prev) & torch.isfinite(nbest_scores)[:, :, None]
        nbest_tokens, nbest_frames = [], []
        for rows, masks in zip(align.tolist(), emit.tolist()):
            toks_b, frames_b = [], []
            for row, mask in zip(rows, masks):
                idx = [i for i, m in enumerate(mask) if m]
                frames_b.append(idx)
                toks_b.append([row[i] for i in idx])
            nbest_tokens.append(toks_b)
            nbest_frames.append(frames_b)
        avg = None
        if alive is not None:
            avg = alive / lengths.clamp(min=1).to(alive)
        return BeamSearchResult(
            tokens=[x[0] for x in nbest_tokens], scores=nbest_scores[:, 0],
            token_frames=[x[0] for x in nbest_frames], nbest_tokens=nbest_tokens,
            nbest_scores=nbest_scores, nbest_frames=nbest_frames, alignments=align, avg_beams=avg)

    @staticmethod
    def _backtrack(labels, parents, slots):
        """Follow the back-pointers (seed 004 §2.1) from the final slots: [B, n, T]."""
        t = labels.shape[0]
        out = torch.empty((t,) + slots.shape, dtype=torch.int64, device=slots.device)
        cur = slots
        for i in range(t - 1, -1, -1):
            out[i] = labels[i].gather(1, cur)
            cur = parents[i].gather(1, cur)
        return out.permute(1, 2, 0)

    def _external_ids(self, internal):
        """Undo the blank-to-column-0 permutation of ``_frames``."""
        if self.blank == 0:
            return internal
        shifted = torch.where(internal <= self.blank, internal - 1, internal)
        return torch.where(internal == 0, torch.full_like(internal, self.blank), shifted)
