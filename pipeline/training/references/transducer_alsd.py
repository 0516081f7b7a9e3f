"""The per-utterance ALSD baseline that "Pushing the Limits of Beam Search Decoding for
Transducer-based ASR models" measures ALSD++ against (its Table 2 "ALSD" rows: alignment-
length synchronous decoding, Saon et al. 2020, as ESPnet and NeMo's per-utterance
implementations run it), for the speed bench; no fusion.

One utterance at a time; hypotheses are Python objects. Each step expands every live
hypothesis alone: one joint call on its frame, its top-``beam`` tokens (x, for TDT, its
top-``beam`` durations), the same frame rules as the batched search (a blank, or the
``max_symbols``-th token at one frame, moves on; a TDT blank with duration 0 moves one
frame). Candidates with the same transcript, frame and tokens at that frame are merged
(the better score wins); the ``beam`` best survive, and each survivor that emitted a token
runs the predictor alone. A hypothesis that has read every frame is finished and kept
aside; the search ends when none is live. What ALSD++ adds over this, and what a speed
ratio against it measures, is batching: all hypotheses of all utterances in one tensor
per step, and the transcript kept as a hash instead of a tuple.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class _Hyp:
    tokens: tuple
    frames: tuple
    t: int
    sym: int
    score: float
    state: tuple            # predictor state (the parent's while ``pending`` is unread)
    pending: int | None = None   # a token the predictor reads once the hypothesis survives


def _advance(model, blank_taken: bool, duration: int | None, sym: int) -> tuple[int, int]:
    """(frames moved, tokens at the new frame)."""
    move = (1 if blank_taken else 0) if duration is None else duration
    if blank_taken and move == 0:
        move = 1
    sym = 0 if blank_taken else sym + 1
    if not blank_taken and move == 0 and sym >= model.max_symbols:
        move = 1
    return move, (0 if move > 0 else sym)


@torch.inference_mode()
def per_utterance_alsd(model, frames: torch.Tensor, length: int, beam: int) -> tuple[list[int], float]:
    """Best (tokens, score) for one utterance's encoder ``frames`` [T, H] with ``length``
    valid frames."""
    live = [_Hyp((), (), 0, 0, 0.0, model.predictor_init(1))]
    done: list[_Hyp] = []
    while live:
        candidates: dict[tuple, _Hyp] = {}
        for h in live:
            tok_lp, dur_lp = model.joint(frames[h.t][None], model.predictor_output(h.state))
            top_lp, top_tok = tok_lp[0].topk(min(beam, tok_lp.shape[-1]))
            if dur_lp is None:
                durations = [(None, 0.0)]
            else:
                d_lp, d_idx = dur_lp[0].topk(min(beam, dur_lp.shape[-1]))
                durations = [(model.durations[i], lp) for i, lp in zip(d_idx.tolist(), d_lp.tolist())]
            for k, lp in zip(top_tok.tolist(), top_lp.tolist()):
                blank = k == model.blank
                for d, dlp in durations:
                    move, sym = _advance(model, blank, d, h.sym)
                    tokens = h.tokens if blank else h.tokens + (k,)
                    c = _Hyp(tokens, h.frames if blank else h.frames + (h.t,), min(h.t + move, length), sym,
                             h.score + lp + dlp, h.state, None if blank else k)
                    key = (c.tokens, c.t, c.sym)
                    if key not in candidates or c.score > candidates[key].score:
                        candidates[key] = c
        kept = sorted(candidates.values(), key=lambda c: -c.score)[:beam]
        live = []
        for c in kept:
            if c.pending is not None:
                c.state = model.predictor_step(torch.tensor([c.pending], device=frames.device), c.state)
                c.pending = None
            (done if c.t >= length else live).append(c)
        if len(done) >= beam and live and max(h.score for h in live) < sorted(
                (h.score for h in done), reverse=True)[beam - 1]:
            break           # no live hypothesis can enter the best ``beam`` any more
    best = max(done, key=lambda h: h.score)
    return list(best.tokens), best.score
