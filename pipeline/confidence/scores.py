"""Token distributions behind a decoder's final tokens, as confidence measures
(pipeline.confidence.measures), one dict of [N] arrays per segment:

- attention decoder (ar, and every ssd stage): one teacher-forced pass over prompt + final
  tokens, the distribution that predicted each token, with greedy decoding's suppress
  masks (as SSD's verification, eq. 5 of "Self-Speculative Decoding for LLM-based ASR with
  CTC Encoder Drafts", scores a draft); a single parallel pass, whatever produced the tokens;
- CTC (ctc_greedy, ctc_beam): the frames of the chosen path that emit or repeat a token
  (blank frames excluded, as the paper's CTC word confidence does), each measured against
  the path's label at that frame; a token is one value per frame of its run, aggregated
  with its word;
- transducer (greedy and beam): the joint's token distribution at the frame each token was
  emitted, with the predictor fed the tokens before it (teacher-forced).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .measures import token_measures
from ..models.teacher_forcing import teacher_forced_logprobs

if TYPE_CHECKING:
    from ..models.base import ARDecoderModel, TransducerModel


def _numpy(measures: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().astype(np.float64) for k, v in measures.items()}


@torch.inference_mode()
def decoder_token_scores(adapter: ARDecoderModel, encoder_states: torch.Tensor, tokens: list[list[int]],
                         prompts: list[list[int]] | None = None,
                         cross_kv: list | None = None) -> list[dict[str, np.ndarray]]:
    """Measures of each row's ``tokens`` under the attention decoder
    (:func:`teacher_forced_logprobs`'s pass and arguments)."""
    empty = {k: np.zeros(0) for k in ("prob", "max_prob", "gibbs", "tsallis", "renyi")}
    return [dict(empty) if row is None else _numpy(token_measures(*row))
            for row in teacher_forced_logprobs(adapter, encoder_states, tokens, prompts, cross_kv)]


def ctc_token_frames(path: list[int], blank: int) -> list[list[int]]:
    """The frames of each emitted token's run in a CTC frame path."""
    runs, prev = [], blank
    for f, label in enumerate(path):
        if label != blank and label == prev:
            runs[-1].append(f)
        elif label != blank:
            runs.append([f])
        prev = label
    return runs


def ctc_token_scores(log_probs: torch.Tensor, path: list[int], blank: int) -> tuple[dict[str, np.ndarray], list[list[int]]]:
    """Per emitted token of the frame ``path`` over ``log_probs`` [T, C]: the measures of
    its frames averaged (``prob``: the path label's probability), and each token's frames."""
    runs = ctc_token_frames(path, blank)
    if not runs:
        return {k: np.zeros(0) for k in ("prob", "max_prob", "gibbs", "tsallis", "renyi")}, runs
    frames = torch.tensor([f for r in runs for f in r], dtype=torch.long)
    lp = log_probs[frames].float()
    per_frame = _numpy(token_measures(lp, torch.tensor([path[f] for f in frames.tolist()])))
    sizes = np.array([len(r) for r in runs])
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    token = {k: np.array([v[bounds[j]:bounds[j + 1]].mean() for j in range(len(runs))]) for k, v in per_frame.items()}
    return token, runs


@torch.inference_mode()
def transducer_token_scores(model: TransducerModel, frames: torch.Tensor, tokens: list[int],
                            token_frames: list[int]) -> dict[str, np.ndarray]:
    """Measures of one utterance's ``tokens`` emitted at ``token_frames`` over its encoder
    ``frames`` [T, H] (a model of pipeline.models.base.TransducerModel)."""
    if not tokens:
        return {k: np.zeros(0) for k in ("prob", "max_prob", "gibbs", "tsallis", "renyi")}
    state = model.predictor_init(1)
    outs = []
    for tok in tokens:
        outs.append(model.predictor_output(state))
        state = model.predictor_step(torch.tensor([tok], device=frames.device), state)
    pred = torch.cat(outs, 0)                                                   # [N, H']
    at = frames[torch.tensor(token_frames, device=frames.device).clamp(max=frames.shape[0] - 1)]
    tok_lp, _ = model.joint(at, pred)
    return _numpy(token_measures(tok_lp, torch.tensor(tokens, device=frames.device)))
