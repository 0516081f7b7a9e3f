"""ALSD++ and AES++, the batched transducer beam searches of "Pushing the Limits of Beam
Search Decoding for Transducer-based ASR models" (§2.1-2.3), for RNN-T and (ALSD++) TDT.

Hypotheses (BatchedBeamHyps, §2.1): every utterance keeps exactly ``beam`` hypotheses in
[B, beam] tensors: score, current frame, tokens emitted at that frame, transcript key
(length x M + the rolling hash of eq. 1, ``h' = (h x P + token) mod M``), last token,
predictor state and fusion states. A dead slot has score -inf. Transcripts are a tree
(Fig. 1): each step stores only every slot's parent and the token it appended (or none),
and the best transcript is read back once at the end.

One step, for every hypothesis at once:

1. the joint of its frame and predictor output: token log-probs, for TDT also duration
   log-probs; LM / boosting fusion with eq. 2 or 3 (:mod:`.fusion`);
2. candidates: the top-``beam`` tokens of each hypothesis (after the LM for late pruning,
   before it for early pruning) x, for TDT, its top-``beam`` durations (a blank predicted
   with duration 0 advances one frame, as in greedy decoding, so it joins duration 1);
   a finished or frozen hypothesis offers one candidate, itself unchanged. Taking the
   top ``beam`` per hypothesis loses nothing: its ``beam`` better candidates are distinct;
3. the frame moves: RNN-T on a blank by 1, TDT by the duration; the ``max_symbols``-th
   token at one frame moves on by one frame as well (the greedy rule, so beam 1 = greedy);
4. recombination: candidates with equal transcript key, last token, frame and tokens at
   that frame have the same future, so only the best survives (Viterbi max); hashes are
   compared in constant time. The best ``beam`` x ``beam`` candidates are merged first (a
   hypothesis gives at most one candidate per group, so the best ``beam`` groups are
   among them), then the best ``beam`` survive;
5. the predictor reads the new tokens (one batched call over the hypotheses that emitted
   one; on a GPU over all, masked, so nothing is read back); fusion states advance likewise.

ALSD++ repeats the step until every hypothesis has read its valid frames (all
hypotheses have the same alignment length; frames may differ). AES++ is
frame-synchronous: per frame, up to ``max_symbols`` steps in which hypotheses that took a
blank wait for the next frame. Neither reads a tensor back to the host inside the loop
on a GPU (the end test is polled asynchronously); on a CPU, reading it is free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..ctc_beam.fusion import LookupCache, ShallowFusion, add_final_scores, initial_states
from ..ctc_beam.state import HASH_BASE, HASH_MOD, NEG_INF
from . import advance_predictor, beam_static
from .fusion import (BLANK_SCORINGS, PRUNINGS, blank_terms, full_rows,
                     lm_token_map)

if TYPE_CHECKING:
    from ...models.base import TransducerModel

ALGORITHMS = ("alsd", "aes")


@dataclass
class TransducerBeamResult:
    tokens: list[list[int]]        # best hypothesis per utterance (token ids, no blanks)
    frames: list[list[int]]        # the frame each token was emitted at
    scores: torch.Tensor           # [B] its score (fusion final scores included)


@dataclass
class _Hyps:
    score: torch.Tensor    # [B, K] float32
    t: torch.Tensor        # [B, K] int64 frame
    sym: torch.Tensor      # [B, K] int64 tokens emitted at frame t
    key: torch.Tensor      # [B, K] int64 length * HASH_MOD + hash
    last: torch.Tensor     # [B, K] int64 last token (-1: none)
    pred: tuple            # predictor state, rows = B * K
    fusion: list           # [B, K] lookup states per fusion model


class _EndFlag:
    """Whether every hypothesis has finished, without blocking on the device: on CUDA
    the flag is copied to pinned memory and read once its copy has landed (a few steps
    late; steps after the end change nothing); elsewhere it is read at once."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.event = None
        self.host = torch.zeros((), dtype=torch.bool, pin_memory=self.cuda)

    def __call__(self, finished: torch.Tensor) -> bool:
        if not self.cuda:
            return bool(finished.all())
        if self.event is not None and self.event.query():
            if bool(self.host):
                return True
            self.event = None
        if self.event is None:
            self.host.copy_(finished.all(), non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        return False


class TransducerBeamSearch:
    """Batched ALSD++ (RNN-T, TDT) / AES++ (RNN-T) with LM fusion and phrase boosting.

    Args:
        model: a :class:`pipeline.models.base.TransducerModel`.
        beam_size: hypotheses per utterance.
        algorithm: "alsd" or "aes".
        lm, alpha_lm: an NGPU-LM over the model's non-blank tokens and its weight lambda.
        boost, alpha_boost: a phrase-boosting tree (or one per call) and its weight.
        blank_scoring: "asr" (eq. 2) or "lm" (eq. 3).
        pruning: "late" (LM before the per-hypothesis top-k) or "early".
        max_symbols: tokens per frame (default: the model's).
        dense_fusion_max_bytes: fold small fusion models into dense tables (0: never).
        expansion_gamma: AES++ only: a hypothesis expands only into the tokens scoring
            within ``gamma`` of its best one (log-prob, fused as they are ranked): the
            expansion beam of mAES ("Accelerating RNN Transducer Inference via Adaptive
            Expansion Search", the paper's reference [7] for AES); None: every one of its
            top-``beam`` tokens.
        use_cuda_graphs: on CUDA, run the step over static buffers captured into a CUDA
            graph per bucket (:mod:`.beam_static`; eager where capture fails).
        loop: "auto" (CUDA graphs on CUDA when enabled, ``beam_static.CPU_LOOP`` on a
            CPU), or one of "eager", "static" (static buffers, no capture), "cuda_graph".
        masked: every hypothesis through the joint and the predictor, masked, as on a
            GPU (None: by the device); CPU tests set it to check the GPU's arithmetic.
        check_every: steps between reads of the end test in the static loops (default:
            8 on CUDA, else 1).

    ``last_loop`` names the loop that ran the last call.
    """

    def __init__(self, model: TransducerModel, beam_size: int, algorithm: str = "alsd", lm=None, alpha_lm: float = 0.0,
                 boost=None, alpha_boost: float = 0.0, blank_scoring: str = "lm", pruning: str = "late",
                 max_symbols: int | None = None, dense_fusion_max_bytes: int = 256 * 2 ** 20,
                 expansion_gamma: float | None = None, use_cuda_graphs: bool = True, loop: str = "auto",
                 masked: bool | None = None, check_every: int | None = None):
        if beam_size < 1:
            raise ValueError("beam_size must be >= 1")
        if algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}")
        if algorithm == "aes" and model.durations is not None:
            raise ValueError("AES++ is defined for RNN-T; use ALSD++ (algorithm='alsd') for TDT")
        if expansion_gamma is not None and (algorithm != "aes" or expansion_gamma < 0):
            raise ValueError("expansion_gamma is AES++'s (algorithm='aes') and must be >= 0")
        if blank_scoring not in BLANK_SCORINGS or pruning not in PRUNINGS:
            raise ValueError(f"blank_scoring in {BLANK_SCORINGS}, pruning in {PRUNINGS}")
        for fm in (lm, boost):
            if fm is not None and getattr(fm, "vocab_size", model.vocab_size - 1) != model.vocab_size - 1:
                raise ValueError(f"a fusion model over {fm.vocab_size} tokens; the transducer has "
                                 f"{model.vocab_size - 1} non-blank tokens (build the LM with "
                                 "`build-lm --tokenizer MODEL_DIR`)")
        self.model, self.beam_size, self.algorithm = model, beam_size, algorithm
        self.fusion = ShallowFusion(lm, alpha_lm, boost, alpha_boost, dense_fusion_max_bytes)
        self.lm, self.alpha_lm = self.fusion.lm, self.fusion.alpha_lm
        self.boost, self.alpha_boost = self.fusion.boost, self.fusion.alpha_boost
        self.blank_scoring, self.pruning = blank_scoring, pruning
        self.max_symbols = int(max_symbols or model.max_symbols)
        self.expansion_gamma = expansion_gamma
        if loop not in beam_static.LOOPS:
            raise ValueError(f"loop must be one of {beam_static.LOOPS}")
        self.use_cuda_graphs, self.loop, self.masked, self.check_every = use_cuda_graphs, loop, masked, check_every
        self._static = beam_static.StaticLoops(self)
        self.last_loop: str | None = None
        self._lookups = LookupCache()
        self._masks: dict = {}

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def __call__(self, frames: torch.Tensor, lengths: torch.Tensor, boost=None) -> TransducerBeamResult:
        b, t_max, _ = frames.shape
        device = frames.device
        k = self.beam_size
        lengths = lengths.to(device=device, dtype=torch.long)
        fusion = self.fusion.active(boost)
        lookups = self._lookups.lookups(fusion, 0.0, self.model.vocab_size - 1, device)
        hyps = self._initial(b, k, device, initial_states(fusion, lookups, b, k, device))
        self._setup(device)
        out = self._static.run(frames, lengths, fusion, lookups, hyps)
        if out is not None:
            return out
        self.last_loop = "eager"
        trie = []
        lim = lengths[:, None]
        if self.algorithm == "alsd":
            ended = _EndFlag(device)
            for _ in range(max(t_max, 1) * self.max_symbols + 1):
                if ended((hyps.t >= lim) | (hyps.score == NEG_INF)):
                    break
                hyps = self._step(hyps, frames, lengths, fusion, lookups, None, trie)
        else:
            cpu = device.type == "cpu"
            for f in range(t_max):
                for _ in range(self.max_symbols):
                    waiting = hyps.t > f
                    if cpu and not bool(((hyps.t == f) & (hyps.score > NEG_INF) & (hyps.t < lim)).any()):
                        break
                    hyps = self._step(hyps, frames, lengths, fusion, lookups, waiting, trie)
        return self._result(hyps, fusion, lookups, trie)

    # --------------------------------------------------------------- internals
    def _initial(self, b: int, k: int, device, fusion_states) -> _Hyps:
        score = torch.full((b, k), NEG_INF, device=device)
        score[:, 0] = 0.0
        zeros = torch.zeros((b, k), dtype=torch.long, device=device)
        return _Hyps(score, zeros, zeros.clone(), zeros.clone(), zeros - 1, self.model.predictor_init(b * k),
                     fusion_states)

    def _setup(self, device) -> None:
        # made once per device: a captured graph reads these tensors by address
        if getattr(self, "_setup_for", None) == str(device):
            return
        self._setup_for = str(device)
        m = self.model
        v = m.vocab_size
        self.lm_ids = lm_token_map(v, m.blank, device)
        if m.durations is None:
            self.dur_values = None
            return
        values = torch.tensor(m.durations, device=device)
        self.dur_values = values
        # a blank with duration 0 advances one frame (greedy's rule): it joins duration 1
        self.blank_adv = torch.where(values == 0, 1, values)
        zero = [i for i, d in enumerate(m.durations) if d == 0]
        one = [i for i, d in enumerate(m.durations) if d == 1]
        self.blank_merge = (zero[0], one[0]) if zero and one else None

    def _token_scores(self, hyps: _Hyps, tok_lp: torch.Tensor, fusion, lookups, kt: int):
        """Per hypothesis the ``kt`` best tokens: ids, fused scores and fusion handles."""
        m = self.model
        lam = self.alpha_lm if self.lm is not None else 0.0
        nb_term, blank_fused = blank_terms(tok_lp[..., m.blank], lam, self.blank_scoring)
        asr = tok_lp + nb_term.unsqueeze(2)
        asr[..., m.blank] = blank_fused
        if not lookups:
            scores, tokens = asr.topk(kt, dim=2)
            return tokens, scores, []
        if self.pruning == "late":
            total, rows = asr, []
            for lookup, states in zip(lookups, hyps.fusion):
                s, h = full_rows(lookup, states, m.blank)
                total = total + s
                rows.append(h)
            scores, tokens = total.topk(kt, dim=2)
            return tokens, scores, [h.gather(2, tokens) for h in rows]
        _, tokens = tok_lp.topk(kt, dim=2)   # early pruning: the ASR scores alone pick the tokens
        scores = asr.gather(2, tokens)
        lm_tok = self.lm_ids[tokens]
        handles = []
        for lookup, states in zip(lookups, hyps.fusion):
            s, h = lookup.candidates(states, lm_tok)
            scores = scores + s
            handles.append(h)
        return tokens, scores, handles

    def _step(self, hyps: _Hyps, frames, lengths, fusion, lookups, waiting, trie) -> _Hyps:
        m = self.model
        b, k = hyps.score.shape
        t_max = frames.shape[1]
        rows = torch.arange(b, device=frames.device)
        fr = frames[rows[:, None], hyps.t.clamp(max=t_max - 1)]                     # [B, K, H]
        # frozen hypotheses (finished, or waiting for the next frame in AES++) offer themselves
        frozen = (hyps.t >= lengths[:, None]) | (hyps.score == NEG_INF)
        if waiting is not None:
            frozen = frozen | waiting
        tok_lp, dur_lp = self._joint(fr.reshape(b * k, -1), m.predictor_output(hyps.pred), frozen.reshape(-1))
        tok_lp = tok_lp.view(b, k, -1).float()
        kt = min(k, m.vocab_size)
        tokens, tscore, handles = self._token_scores(hyps, tok_lp, fusion, lookups, kt)   # [B, K, kt]
        if self.expansion_gamma is not None:
            best = tscore.max(dim=2, keepdim=True).values
            tscore = tscore.masked_fill(tscore < best - self.expansion_gamma, NEG_INF)
        blank = tokens == m.blank
        if self.dur_values is None:
            kd = 1
            dscore = torch.zeros((b, k, kt, 1), device=tok_lp.device)
            adv = blank.long().unsqueeze(3)
        else:
            dur_lp = dur_lp.view(b, k, -1).float()
            blank_lp = dur_lp
            if self.blank_merge is not None:
                i0, i1 = self.blank_merge
                blank_lp = dur_lp.clone()
                blank_lp[..., i1] = torch.maximum(dur_lp[..., i0], dur_lp[..., i1])
                blank_lp[..., i0] = NEG_INF
            kd = min(k, dur_lp.shape[-1])
            nb_s, nb_i = dur_lp.topk(kd, dim=2)
            bl_s, bl_i = blank_lp.topk(kd, dim=2)
            bl4 = blank.unsqueeze(3)
            dscore = torch.where(bl4, bl_s.unsqueeze(2), nb_s.unsqueeze(2))
            adv = torch.where(bl4, self.blank_adv[bl_i].unsqueeze(2), self.dur_values[nb_i].unsqueeze(2))
        w = kt * kd
        score = (hyps.score[:, :, None, None] + tscore.unsqueeze(3) + dscore).reshape(b, k, w)
        tok = tokens.unsqueeze(3).expand(b, k, kt, kd).reshape(b, k, w)
        adv = adv.expand(b, k, kt, kd).reshape(b, k, w)
        emit = tok != m.blank
        sym = torch.where(emit, hyps.sym.unsqueeze(2) + 1, 0)
        adv = torch.where(emit & (adv == 0) & (sym >= self.max_symbols), 1, adv)
        sym = torch.where(adv > 0, 0, sym)
        t_new = hyps.t.unsqueeze(2) + adv
        h = hyps.key % HASH_MOD
        moved = (hyps.key - h + HASH_MOD).unsqueeze(2) + (h.unsqueeze(2) * HASH_BASE + tok).remainder(HASH_MOD)
        key = torch.where(emit, moved, hyps.key.unsqueeze(2))
        last = torch.where(emit, tok, hyps.last.unsqueeze(2))
        f3 = frozen.unsqueeze(2)
        score = torch.cat([score.masked_fill(f3, NEG_INF), hyps.score.masked_fill(~frozen, NEG_INF).unsqueeze(2)], 2)
        tok = torch.cat([tok, torch.full_like(hyps.t, -1).unsqueeze(2)], 2)
        t_new = torch.cat([t_new, hyps.t.unsqueeze(2)], 2)
        sym = torch.cat([sym, hyps.sym.unsqueeze(2)], 2)
        key = torch.cat([key, hyps.key.unsqueeze(2)], 2)
        last = torch.cat([last, hyps.last.unsqueeze(2)], 2)
        w1 = w + 1
        flat = lambda x: x.reshape(b, k * w1)  # noqa: E731
        score, tok, t_new, sym, key, last = map(flat, (score, tok, t_new, sym, key, last))
        mm = min(k * k, k * w1)
        top, idx = score.topk(mm, dim=1)
        g = lambda x: x.gather(1, idx)  # noqa: E731
        tk, tn, sy, ky, ls = g(tok), g(t_new), g(sym), g(key), g(last)
        same = ((ky.unsqueeze(2) == ky.unsqueeze(1)) & (tn.unsqueeze(2) == tn.unsqueeze(1))
                & (sy.unsqueeze(2) == sy.unsqueeze(1)) & (ls.unsqueeze(2) == ls.unsqueeze(1)))
        dup = (same & self._earlier(mm, score.device)).any(-1)
        top = top.masked_fill(dup, NEG_INF)
        top, keep = top.topk(k, dim=1)
        idx = idx.gather(1, keep)
        tk, tn, sy, ky, ls = (x.gather(1, keep) for x in (tk, tn, sy, ky, ls))
        parent = torch.div(idx, w1, rounding_mode="floor")
        col = idx - parent * w1
        emitted = (tk >= 0) & (tk != m.blank) & (top > NEG_INF)
        flat_parent = (parent + rows[:, None] * k).reshape(-1)
        pred = m.select_state(hyps.pred, flat_parent)
        pred = advance_predictor(m, pred, tk.clamp(min=0).reshape(-1), emitted.reshape(-1), masked=self.masked)
        states = []
        tcol = torch.div(col, kd, rounding_mode="floor").clamp(max=kt - 1)   # the noop column reads a dummy
        for lookup, old, hnd in zip(lookups, hyps.fusion, handles):
            par_state = old.gather(1, parent)
            hsel = hnd.reshape(b, k * kt).gather(1, parent * kt + tcol)
            states.append(torch.where(emitted, lookup.advance(hsel), par_state))
        trie.append((parent, torch.where(emitted, tk, -1), hyps.t.gather(1, parent)))
        return _Hyps(top, tn, sy, ky, ls, pred, states)

    def _joint(self, frames: torch.Tensor, pred_out: torch.Tensor, frozen: torch.Tensor):
        """The joint of every hypothesis; on a CPU only of those that expand (frozen ones
        offer only themselves, so their outputs are never read: they get a uniform row).
        On a GPU every row, so shapes stay static and nothing is read back."""
        masked = self.masked if self.masked is not None else frames.device.type != "cpu"
        if masked or not bool(frozen.any()) or bool(frozen.all()):
            return self.model.joint(frames, pred_out)
        live = (~frozen).nonzero().squeeze(1)
        n = frozen.shape[0]
        tok_live, dur_live = self.model.joint(frames.index_select(0, live), pred_out.index_select(0, live))

        def spread(x):
            if x is None:
                return None
            out = torch.full((n, x.shape[-1]), -math.log(x.shape[-1]), dtype=x.dtype)
            return out.index_copy_(0, live, x)
        return spread(tok_live), spread(dur_live)

    def _earlier(self, n: int, device) -> torch.Tensor:
        key = (n, str(device))
        if key not in self._masks:
            self._masks[key] = torch.ones(n, n, dtype=torch.bool, device=device).tril(-1)
        return self._masks[key]

    def _result(self, hyps: _Hyps, fusion, lookups, trie) -> TransducerBeamResult:
        scores = add_final_scores(hyps.score, fusion, lookups, hyps.fusion) if fusion else hyps.score
        best_score, best = scores.max(1)
        b = best.shape[0]
        if not trie:
            return TransducerBeamResult([[] for _ in range(b)], [[] for _ in range(b)], best_score)
        parents = torch.stack([p for p, _, _ in trie]).cpu().numpy()
        tokens = torch.stack([x for _, x, _ in trie]).cpu().numpy()
        frames = torch.stack([f for _, _, f in trie]).cpu().numpy()
        cur = best.cpu().numpy()
        rows = np.arange(b)
        out_t = [[] for _ in range(b)]
        out_f = [[] for _ in range(b)]
        for s in range(len(trie) - 1, -1, -1):
            tk, fr = tokens[s, rows, cur], frames[s, rows, cur]
            for i in np.nonzero(tk >= 0)[0]:
                out_t[i].append(int(tk[i]))
                out_f[i].append(int(fr[i]))
            cur = parents[s, rows, cur]
        return TransducerBeamResult([x[::-1] for x in out_t], [x[::-1] for x in out_f], best_score)
