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

Storage is the trie of seed 004 §2.1: per frame one chosen candidate per hypothesis
(parent x W + column, [T, B, beam]), so a prefix is never copied; labels, back-pointers,
transcripts and emission frames (for word timestamps) are read back once at the end. The
rolling hash ``h' = (h * P + token) mod M`` (seed 004 eq. 1) and the length change only
on new tokens; both live in one int64 prefix key (length x M + hash).

FLToP (seed 003, ``flop_top_n``/``flop_ratio``): the expansion and the fusion lookups use
each frame's pruned token list, [B, beam, N] instead of [B, beam, V+1]. Off = exact search.

Frame compression (with FLToP, ``compress_frames``): when a frame keeps a single token
and the frame before kept the same single token, the last label of every hypothesis is
already that token (blank included), so the frame only adds the same log-prob to every score: no new token,
no fusion step, no merge, and (max merge) no pruning. A run of such frames is searched as
ONE step whose score is the sum of the run's log-probs; a ``frame_map`` takes emitted
tokens back to their original frames (timestamps), and live-beam counts are weighted by
the frames a step stands for. With logsumexp merge the first step of a run can raise the
best score, so the second frame may still prune: runs keep their first two steps apart.
Results equal the frame-by-frame FLToP search up to float summation order. Steps are
left-aligned per utterance and the batched loop runs over the longest compressed
utterance; buffers keep the uncompressed shape (static for CUDA graphs).

Fusion lookups: a model with a dense table (``pipeline.decoding.fusion_table``) is folded
into [states, V+1] tables of alpha * score (+ beta) and next state with an identity column
V that blanks and repeats use, so scoring all candidates is one ``take`` and advancing the
kept ones another.

Finished utterances (t >= length) are frozen: their padded frames are replaced by a
frame where blank has log-prob 0 and every other token -inf, with no pruning, so scores,
fusion states and hypotheses stay as they were (NeMo adds padded-frame scores; we do
not). The LM end-of-sentence score (and the boosting tree's final score) is added after
the last frame, then hypotheses that differ only in their last label are merged.

The only Python loop in the search is over frames, with no host sync and no
data-dependent control flow inside it, so the frame step can be captured in a CUDA graph
(``pipeline.decoding.ctc_beam_graphs``); eager mode is the same step. On a CPU there is no
graph to replay and the step's ~50 tensor ops cost their dispatch, not their arithmetic,
so ``native=True`` (the default) runs the frame loop, FLToP pruning, frame compression and
back-tracking as single calls into ``pipeline.decoding.ctc_beam_native`` (C, the same
step; identical results), falling back to the torch step where that does not apply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from pipeline.decoding.flop import prune_frame
from pipeline.decoding.fusion_table import DenseFusionTable

HASH_BASE = 1_000_003
HASH_MOD = 2_147_483_647  # 2^31 - 1: hash * HASH_BASE + token stays far below 2^63
# a candidate's recombination key is (length x HASH_MOD + hash) x (V+1) + label: exact in
# int64 for prefixes under 2^32 / (V+1) tokens (44 million at V = 96)
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
    key: torch.Tensor         # int64 prefix identity: length * HASH_MOD + rolling hash
    fusion: list[torch.Tensor]  # int64 states, one per fusion model (lookup-specific form)


@dataclass
class _Frames:
    """The search's input, frame-major. ``values`` [S, B, W]: frame log-probs (blank in
    column 0), or with FLToP each frame's N surviving scores, whose ids are ``tokens``
    [S, B, N] (None: column = token id); ``lm_tokens``: LM ids of those columns, V for
    blank (the fusion lookups' identity column); ``thresholds`` [S, B]: theta (inf = no
    pruning); ``weights`` [S, B]: original frames each step stands for (0 = padding).
    ``steps`` frames are searched; ``frame_map`` [B, T] maps every original frame to its
    step (None: the identity), ``steps`` for padded frames."""

    values: torch.Tensor
    tokens: torch.Tensor | None
    lm_tokens: torch.Tensor
    thresholds: torch.Tensor
    weights: torch.Tensor
    steps: int
    frame_map: torch.Tensor | None
    num_frames: int


class _DenseLookup:
    """A :class:`DenseFusionTable` folded for the search: tables [S, V+1] of
    ``alpha * score (+ beta)`` and next state, with an identity column V (score 0, same
    state) that blanks and repeats use, and states kept as row offsets (state x (V+1)).
    One ``take`` scores every candidate; one more gives the kept candidates' next states."""

    def __init__(self, table: DenseFusionTable, alpha: float, beta: float):
        s, v = table.scores.shape
        self.model, self.width = table, v + 1
        zeros = torch.zeros((s, 1), dtype=table.scores.dtype, device=table.scores.device)
        self.scores = torch.cat([table.scores * alpha + beta, zeros], 1).contiguous()
        ids = torch.arange(s, dtype=torch.int64, device=table.scores.device)
        self.next = (torch.cat([table.next.long(), ids[:, None]], 1) * self.width).contiguous()

    def init(self, states: torch.Tensor) -> torch.Tensor:
        return states * self.width

    def states(self, offsets: torch.Tensor) -> torch.Tensor:
        return torch.div(offsets, self.width, rounding_mode="floor")

    def candidates(self, offsets, lm_cols):
        """[B, beam, W] scores and per-candidate handles (flat table indices)."""
        flat = offsets.unsqueeze(2) + lm_cols
        return self.scores.take(flat), flat

    def advance(self, handles):
        return self.next.take(handles)

    def rows(self, offsets, last):
        """Unpruned frames: [B, beam, V+1] scores in CTC column order (blank and the
        repeat column score 0); rows are copied whole (cheaper than per-element takes)."""
        if self.rows_table is None:
            self.rows_table = torch.nn.functional.pad(self.scores[:, :-1], (1, 0)).contiguous()
        b, k = offsets.shape
        rows = self.rows_table.index_select(0, self.states(offsets).view(-1)).view(b, k, -1)
        return rows.scatter_(2, last.unsqueeze(2), 0.0)

    rows_table = None


class _GenericLookup:
    """Any :class:`FusionModel`: scores and next states of every candidate from
    ``advance_labels`` (or ``advance`` + gather), blank/repeat columns masked."""

    def __init__(self, model, alpha: float, beta: float, vocab: int):
        self.model, self.alpha, self.beta, self.vocab = model, alpha, beta, vocab

    def init(self, states):
        return states

    def states(self, states):
        return states

    def candidates(self, states, lm_cols):
        b, k, w = lm_cols.shape
        new = lm_cols != self.vocab
        labels = lm_cols.clamp(max=self.vocab - 1)
        if hasattr(self.model, "advance_labels"):
            scores, nxt = self.model.advance_labels(states.unsqueeze(2).expand(b, k, w).reshape(-1), labels.reshape(-1))
            scores, nxt = scores.view(b, k, w), nxt.view(b, k, w)
        else:
            scores, nxt = self.model.advance(states.reshape(-1))
            scores = scores.view(b, k, -1).gather(2, labels)
            nxt = nxt.view(b, k, -1).gather(2, labels)
        scores = torch.where(new, scores.to(torch.float32) * self.alpha + self.beta, 0.0)
        return scores, torch.where(new, nxt, states.unsqueeze(2))

    def advance(self, handles):
        return handles


class _BetaOnly:
    """No fusion model, only the insertion bonus on new tokens."""

    def __init__(self, beta: float, vocab: int):
        self.beta, self.vocab = beta, vocab

    def candidates(self, states, lm_cols):
        return torch.where(lm_cols != self.vocab, self.beta, 0.0), None


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
        compress_frames: with FLToP, search a run of frames that all keep one and the
            same token as one frame (see the module docstring; exact). Ignored without
            FLToP.
        native: on CPU, run the frame loop and the back-tracking in one native call each
            (``pipeline.decoding.ctc_beam_native``: the same step without per-op
            dispatch); falls back to the torch step where it does not apply (logsumexp
            merge, fusion models without dense tables, no C compiler).

    ``__call__(log_probs [B, T, V+1], lengths [B]) -> BeamSearchResult``; log_probs must be
    normalised log-probabilities (log_softmax).
    """

    def __init__(self, beam_size: int, blank: int = 0, beta: float = 0.0, lm: FusionModel | None = None,
                 alpha_lm: float = 0.0, boost: FusionModel | None = None, alpha_boost: float = 0.0,
                 prune_threshold: float | None = None, flop_top_n: int | None = None,
                 flop_ratio: float | None = None, nbest: int | None = None, merge: str = "max",
                 track_beams: bool = False, use_cuda_graphs: bool = True,
                 dense_fusion_max_bytes: int = 256 * 2 ** 20, preselect: int = 2,
                 compress_frames: bool = True, native: bool = True):
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
        self.compress_frames = compress_frames
        self.nbest = nbest or beam_size
        self.merge = merge
        self.track_beams = track_beams
        self.use_cuda_graphs = use_cuda_graphs
        self.native = native
        self._graphs: dict = {}  # input shape -> GraphedFrameLoop
        self._masks: dict = {}
        self._lookups: dict = {}  # (id(model), alpha, beta, device) -> (model, lookup)
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
        frames = self._frames(log_probs, lengths)
        self._set_vocab(v1, device)
        lookups = self._lookups_for(fusion, v1 - 1, device)
        beams = self._init_beams(b, device, fusion, lookups)
        native = self._native(device)
        out = native.run_loop(self, frames, beams, lookups) if native else None
        if out is None:
            loop = self.eager_loop
            if self.use_cuda_graphs and device.type == "cuda":
                graphs = self._graphed_loop(frames, fusion, lookups)
                if graphs.ok:
                    loop = graphs.run
            out = loop(frames, beams, lookups)
        beams, choices, alive = out
        return self._finish(beams, choices, alive, fusion, lookups, frames, lengths)

    def _native(self, device):
        """``pipeline.decoding.ctc_beam_native`` when this search runs natively on
        ``device`` (a CPU, ``native=True``), else None; each of its calls may still
        return None for a configuration it does not cover."""
        if not self.native or torch.device(device).type != "cpu":
            return None
        from pipeline.decoding import ctc_beam_native

        return ctc_beam_native

    def _set_vocab(self, v1: int, device) -> None:
        """V (the fusion lookups' identity column) and the column ids of an unpruned frame."""
        if getattr(self, "_ids", None) is None or self._ids.shape[1] != v1 or self._ids.device != device:
            self._ids = torch.arange(v1, device=device)[None, :]
        self._vocab = v1 - 1

    def _graphed_loop(self, frames, fusion, lookups):
        from pipeline.decoding.ctc_beam_graphs import GraphedFrameLoop

        key = (tuple(frames.values.shape), str(frames.values.device))
        graphs = self._graphs.get(key)
        if graphs is None or not graphs.matches(frames, fusion, lookups):
            graphs = self._graphs[key] = GraphedFrameLoop(self, frames, fusion, lookups)
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

    def _lookups_for(self, fusion, vocab: int, device):
        """One lookup per fusion model (beta folded into the first), cached per model."""
        if not fusion:
            return [_BetaOnly(self.beta, vocab)] if self.beta != 0.0 else []
        out = []
        for i, (model, alpha) in enumerate(fusion):
            beta = self.beta if i == 0 else 0.0
            key = (id(model), alpha, beta, str(device))
            hit = self._lookups.get(key)
            if hit is None or hit[0] is not model:
                if isinstance(model, DenseFusionTable):
                    lookup = _DenseLookup(model, alpha, beta)
                else:
                    lookup = _GenericLookup(model, alpha, beta, vocab)
                hit = self._lookups[key] = (model, lookup)
            out.append(hit[1])
        return out

    def _frames(self, log_probs, lengths) -> _Frames:
        """Frames [T, B, V+1] with blank moved to column 0 and padded frames frozen (blank
        0, others -inf, no pruning); with FLToP every frame pruned up front (the pruning
        does not depend on the hypotheses) and, with ``compress_frames``, runs of frames
        that keep one and the same token folded into one step."""
        b, t, v1 = log_probs.shape
        dev = log_probs.device
        valid = torch.arange(t, device=dev)[:, None] < lengths[None, :]       # [T, B]
        theta = float("inf") if self.prune_threshold is None else float(self.prune_threshold)
        inf = torch.tensor(float("inf"), device=dev)
        thresholds = torch.where(valid, torch.tensor(theta, device=dev), inf)
        native = self._native(dev)
        pruned = None
        if self.flop_top_n is not None and native:
            pruned = native.flop_prune(log_probs, lengths, self.blank, self.flop_top_n, self.flop_ratio)
        if pruned is None:
            lp = log_probs.float()
            if self.blank != 0:
                blank = self.blank
                lp = torch.cat([lp[..., blank:blank + 1], lp[..., :blank], lp[..., blank + 1:]], dim=-1)
            frozen = torch.full((v1,), NEG_INF, device=dev)
            frozen[0] = 0.0
            frames = torch.where(valid[:, :, None], lp.transpose(0, 1), frozen)
            if self.flop_top_n is None:
                ids = torch.arange(v1, device=dev)
                lm_tokens = torch.where(ids == 0, v1 - 1, ids - 1)[None, :]
                return _Frames(frames.contiguous(), None, lm_tokens, thresholds.contiguous(), valid.float(),
                               t, None, t)
            pruned = prune_frame(frames.view(t * b, v1), self.flop_top_n, self.flop_ratio)
        values, tokens = pruned
        values, tokens = values.view(t, b, -1), tokens.view(t, b, -1)
        frame_map, weights, steps = None, valid.float(), t
        if self.compress_frames and t > 0 and self.merge == "max" and native:
            done = native.flop_compress(values, tokens, lengths, theta, v1)
            if done is not None:
                return _Frames(*done, t)
        if self.compress_frames and t > 0:
            values, tokens, thresholds, weights, frame_map, steps = self._compress(
                values, tokens, valid, lengths, theta)
        lm_tokens = torch.where(tokens == 0, v1 - 1, tokens - 1)
        return _Frames(values.contiguous(), tokens.contiguous(), lm_tokens.contiguous(),
                       thresholds.contiguous(), weights.contiguous(), steps, frame_map, t)

    def _compress(self, values, tokens, valid, lengths, theta):
        """Fold runs of single-token frames (see the module docstring). Returns the
        step inputs (still [T, B, ...], steps and padding after them frozen), the weights,
        the frame map [B, T] and the number of steps."""
        t, b, n = values.shape
        dev = values.device
        single = valid & (torch.isinf(values[..., 1]) if n > 1 else torch.ones_like(valid))
        tok = torch.where(single, tokens[..., 0], -1)
        cont = single.clone()
        cont[0] = False
        cont[1:] &= tok[1:] == tok[:-1]
        if self.merge == "logsumexp":
            # the run's first frame merges, the second prunes against the merged best,
            # the rest only add: keep the first two steps apart
            second = torch.zeros_like(cont)
            second[1:] = cont[1:] & ~cont[:-1]
            cont &= ~second
        starts = valid & ~cont
        step_of = starts.long().cumsum(0) - 1                              # [T, B]
        counts = starts.sum(0)                                             # [B]
        steps = int(counts.max()) if b else 0
        cols = torch.arange(b, device=dev)
        dump = t * b  # padded frames scatter into a discarded row
        dest = torch.where(valid, step_of * b + cols, dump).reshape(-1)
        frozen_v = torch.full((n,), NEG_INF, device=dev)
        frozen_v[0] = 0.0
        out_v = frozen_v.expand(t * b + 1, n).clone()
        out_t = torch.zeros((t * b + 1, n), dtype=tokens.dtype, device=dev)
        src = torch.where(starts.reshape(-1), torch.arange(t * b, device=dev), dump)
        first = torch.full((t * b + 1,), dump, dtype=torch.int64, device=dev)
        first.index_copy_(0, torch.where(starts.reshape(-1), dest, dump), src)
        out_v[:dump] = values.reshape(t * b, n).index_select(0, first[:dump].clamp(max=dump - 1))
        out_t[:dump] = tokens.reshape(t * b, n).index_select(0, first[:dump].clamp(max=dump - 1))
        # a run's step scores the sum of its frames' log-probs of the one token it keeps
        total = torch.zeros(t * b + 1, device=dev).index_add_(0, dest, values[..., 0].reshape(-1).masked_fill(
            ~valid.reshape(-1), 0.0))
        live = torch.arange(t, device=dev)[:, None] < counts[None, :]      # [T, B] steps in use
        out_v = out_v[:dump].view(t, b, n)
        out_v[..., 0] = torch.where(live, total[:dump].view(t, b), 0.0)
        out_v = torch.where(live[:, :, None], out_v, frozen_v)
        out_t = torch.where(live[:, :, None], out_t[:dump].view(t, b, n), 0)
        weights = torch.zeros(t * b + 1, device=dev).index_add_(0, dest, valid.reshape(-1).float())[:dump].view(t, b)
        thresholds = torch.where(live, torch.tensor(theta, device=dev), torch.tensor(float("inf"), device=dev))
        frame_map = torch.where(valid, step_of, steps).transpose(0, 1).contiguous()
        return out_v, out_t, thresholds, weights, frame_map, steps

    def _init_beams(self, b, device, fusion, lookups) -> _Beams:
        k = self.beam_size
        scores = torch.full((b, k), NEG_INF, device=device)
        scores[:, 0] = 0.0
        zeros = torch.zeros((b, k), dtype=torch.int64, device=device)
        states = [lookup.init(model.init_states(b * k, bos=True).to(device).view(b, k))
                  for (model, _), lookup in zip(fusion, lookups)]
        return _Beams(scores, zeros.clone(), zeros.clone(), states)

    def eager_loop(self, frames: _Frames, beams: _Beams, lookups):
        s = frames.steps
        b = beams.scores.shape[0]
        dev = beams.scores.device
        choices = []
        alive = torch.zeros(b, device=dev) if self.track_beams else None
        values, thresholds = frames.values, frames.thresholds
        tokens, lm_tokens = frames.tokens, frames.lm_tokens
        for i in range(s):
            if tokens is None:
                beams, choice = self.step(beams, values[i], None, lm_tokens, thresholds[i], lookups)
            else:
                beams, choice = self.step(beams, values[i], tokens[i], lm_tokens[i], thresholds[i], lookups)
            choices.append(choice)
            if alive is not None:
                alive = alive + (beams.scores > NEG_INF).sum(1) * frames.weights[i]
        if s == 0:
            return beams, torch.zeros((0, b, self.beam_size), dtype=torch.int64, device=dev), alive
        return beams, torch.stack(choices), alive

    def step(self, beams: _Beams, values: torch.Tensor, tokens: torch.Tensor | None,
             lm_tokens: torch.Tensor, threshold: torch.Tensor, lookups):
        """One frame of Algorithm 1 for the whole batch. ``values`` [B, W]: the frame's
        log-probs (blank at 0), or with FLToP its surviving scores with ids ``tokens``
        [B, N]; ``lm_tokens`` their LM ids, V for blank ([1, V+1] without FLToP);
        ``threshold`` [B]. Returns the new beams and the chosen candidates [B, beam]
        (parent * W + column)."""
        if tokens is None:
            return self._step_full(beams, values, lm_tokens, threshold, lookups)
        b, k = beams.scores.shape
        w = values.shape[-1]
        vocab = self._vocab  # V: the identity column of the fusion lookups
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
        # rolling hash (seed 004 eq. 1) and the length move only on new tokens
        key = beams.key
        h = key % HASH_MOD
        moved = (h * HASH_BASE).unsqueeze(2).add(tok).remainder_(HASH_MOD).add_((key - h + HASH_MOD).unsqueeze(2))
        cand_key = torch.where(lm_cols != vocab, moved, key.unsqueeze(2)).mul_(vocab + 1).add_(tok)
        m = min(k * self.preselect, k * w)
        scores, idx = cand.view(b, k * w).topk(m, dim=1)
        rkey = cand_key.view(b, k * w).gather(1, idx)
        scores = self._prune_and_recombine(scores, rkey, threshold)
        if m > k:  # merged first, then the best ``beam`` distinct hypotheses
            scores, keep = scores.topk(k, dim=1)
            idx, rkey = idx.gather(1, keep), rkey.gather(1, keep)
        states = [lookup.advance(handle.view(b, k * w).gather(1, idx))
                  for lookup, handle in zip(lookups, handles) if handle is not None]
        return _Beams(scores, rkey % (vocab + 1), torch.div(rkey, vocab + 1, rounding_mode="floor"), states), idx

    def _step_full(self, beams: _Beams, values, lm_tokens, threshold, lookups):
        """``step`` over the whole vocabulary: [B, beam, V+1] candidates are many, so the
        recombination keys and fusion next states are computed after the TopK, for the
        ``preselect x beam`` candidates only."""
        b, k = beams.scores.shape
        w = values.shape[-1]
        vocab = w - 1
        last = beams.last
        cand = beams.scores.unsqueeze(2) + values.unsqueeze(1)
        lm_cols, handles = None, []
        for lookup, states in zip(lookups, beams.fusion or [None]):
            if isinstance(lookup, _DenseLookup):
                cand = cand + lookup.rows(states, last)
                handles.append(None)
                continue
            if lm_cols is None:
                lm_cols = torch.where(self._ids.unsqueeze(1) != last.unsqueeze(2), lm_tokens.unsqueeze(1), vocab)
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
        scores = self._prune_and_recombine(scores, rkey, threshold)
        if m > k:
            scores, keep = scores.topk(k, dim=1)
            idx, rkey = idx.gather(1, keep), rkey.gather(1, keep)
            parent, col, new = parent.gather(1, keep), col.gather(1, keep), new.gather(1, keep)
        states = []
        lm_sel = None
        for lookup, old, handle in zip(lookups, beams.fusion or [None], handles):
            if isinstance(lookup, _DenseLookup):
                if lm_sel is None:
                    lm_sel = torch.where(new, col - 1, vocab)
                states.append(lookup.advance(old.gather(1, parent) + lm_sel))
            elif handle is not None:
                states.append(lookup.advance(handle.view(b, k * w).gather(1, idx)))
        return _Beams(scores, rkey % w, torch.div(rkey, w, rounding_mode="floor"), states), idx

    def _prune_and_recombine(self, scores, key, threshold):
        """Theta pruning against the best candidate, then recombination of equal keys
        into the first (best-scored: TopK output is sorted) member of each group; the
        others become -inf. With max merge both are masks and are applied together."""
        same = key.unsqueeze(2) == key.unsqueeze(1)
        duplicate = (same & self._earlier(scores.shape[1], scores.device)).any(-1)
        if self.prune_threshold is not None:
            pruned = scores < scores[:, :1] - threshold.unsqueeze(1)
            if self.merge == "logsumexp":
                scores = scores.masked_fill(pruned, NEG_INF)
            else:
                duplicate = duplicate | pruned
        if self.merge == "logsumexp":
            scores = torch.logsumexp(scores.unsqueeze(1).masked_fill(~same, NEG_INF), dim=-1)
        return scores.masked_fill(duplicate, NEG_INF)

    def _recombine(self, scores, key):
        """Merge equal keys into the first (best) member of each group (no pruning)."""
        same = key.unsqueeze(2) == key.unsqueeze(1)
        duplicate = (same & self._earlier(scores.shape[1], scores.device)).any(-1)
        if self.merge == "logsumexp":
            scores = torch.logsumexp(scores.unsqueeze(1).masked_fill(~same, NEG_INF), dim=-1)
        return scores.masked_fill(duplicate, NEG_INF)

    def _earlier(self, k: int, device) -> torch.Tensor:
        """[k, k] mask of j < i (constant per shape; cached outside CUDA-graph capture)."""
        key = (k, str(device))
        if key not in self._masks:
            self._masks[key] = torch.ones(k, k, dtype=torch.bool, device=device).tril(-1)
        return self._masks[key]

    # ------------------------------------------------------------------ the end
    def _finish(self, beams: _Beams, choices, alive, fusion, lookups, frames: _Frames,
                lengths) -> BeamSearchResult:
        b, k = beams.scores.shape
        scores = beams.scores
        fused = [lk for lk in lookups if not isinstance(lk, _BetaOnly)]
        for (model, alpha), lookup, states in zip(fusion, fused, beams.fusion):
            final = model.final(lookup.states(states).reshape(-1)).view(b, k).to(scores)
            scores = scores + alpha * final
        # hypotheses that differ only in the last frame label are one transcript
        scores, order = scores.sort(dim=1, descending=True)
        scores = self._recombine(scores, beams.key.gather(1, order))
        n = min(self.nbest, k)
        nbest_scores, pos = scores.topk(n, dim=1)
        slots = order.gather(1, pos)
        s, w = choices.shape[0], frames.values.shape[-1]
        native = self._native(choices.device)
        emitted = None
        if native:
            emitted = native.alignments(choices, frames.tokens, slots, w, frames.frame_map,
                                        frames.num_frames, self.blank, torch.isfinite(nbest_scores))
        if emitted is not None:
            align, counts, flat_tokens, flat_frames = emitted
        else:
            parents = torch.div(choices, w, rounding_mode="floor")
            labels = choices - parents * w
            if frames.tokens is not None:
                labels = frames.tokens[:s].gather(2, labels)
            align = self._backtrack(labels, parents, slots)                 # [B, n, S]
            if frames.frame_map is not None:  # steps back to frames; padding maps to a blank
                align = torch.nn.functional.pad(align, (0, 1), value=0)
                align = align.gather(2, frames.frame_map.unsqueeze(1).expand(b, n, frames.num_frames))
            align = self._external_ids(align)
            prev = torch.nn.functional.pad(align[..., :-1], (1, 0), value=self.blank)
            emit = (align != self.blank) & (align != prev) & torch.isfinite(nbest_scores)[:, :, None]
            counts = emit.sum(-1).view(-1).tolist()
            flat_frames = emit.nonzero()[:, 2].tolist()
            flat_tokens = align[emit].tolist()
        nbest_tokens, nbest_frames, at = [], [], 0
        for i in range(b):
            toks_b, frames_b = [], []
            for c in counts[i * n:(i + 1) * n]:
                toks_b.append(flat_tokens[at:at + c])
                frames_b.append(flat_frames[at:at + c])
                at += c
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
