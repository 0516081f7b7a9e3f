"""Batched greedy transducer decoding (RNN-T and TDT), the baseline of "Pushing the Limits
of Beam Search Decoding for Transducer-based ASR models" (its "Greedy" rows), with the
rules of transformers' Parakeet ``generate``:

- every step reads, for each utterance, the joint of its current frame and its predictor
  output, and takes the argmax token (and, for TDT, the argmax duration);
- RNN-T: a blank moves to the next frame, a token stays; the ``max_symbols``-th token at
  one frame moves on too;
- TDT: the frame advances by the predicted duration, and a blank predicted with duration 0
  advances by 1; the same ``max_symbols`` rule guards zero-duration tokens (``generate``
  has no guard there; NeMo's greedy TDT has one);
- the predictor advances only on emitted tokens.

All utterances step together in [B] tensors; the loop ends when every utterance has read
its valid frames.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from . import advance_predictor, greedy_choice

if TYPE_CHECKING:
    from ...models.base import TransducerModel


@dataclass
class GreedyResult:
    tokens: list[list[int]]        # emitted token ids per utterance (no blanks)
    frames: list[list[int]]        # the frame each token was emitted at
    scores: torch.Tensor           # [B] summed log-probs of the chosen path (tokens + durations)


@torch.inference_mode()
def transducer_greedy(model: TransducerModel, frames: torch.Tensor, lengths: torch.Tensor,
                      max_symbols: int | None = None) -> GreedyResult:
    """Greedy decoding of encoder ``frames`` [B, T, H] with valid ``lengths`` [B];
    ``max_symbols``: tokens per frame (default: the model's)."""
    max_symbols = int(max_symbols or model.max_symbols)
    b, t_max, _ = frames.shape
    device = frames.device
    lengths = lengths.to(device=device, dtype=torch.long)
    rows = torch.arange(b, device=device)
    durations = None if model.durations is None else torch.tensor(model.durations, device=device)
    state = model.predictor_init(b)
    t = torch.zeros(b, dtype=torch.long, device=device)
    symbols = torch.zeros_like(t)
    score = torch.zeros(b, dtype=torch.float32, device=device)
    done = t >= lengths
    emitted, at_frame, masks = [], [], []
    for _ in range(max(t_max, 1) * max_symbols + 1):
        if bool(done.all()):
            break
        frame = frames[rows, t.clamp(max=max(t_max - 1, 0))]
        tok_lp, dur_lp = model.joint(frame, model.predictor_output(state))
        token, blank, advance, step_lp, symbols = greedy_choice(tok_lp, dur_lp, model.blank, durations, symbols,
                                                               max_symbols)
        live = ~done
        emit = live & ~blank
        emitted.append(token)
        at_frame.append(t.clone())
        masks.append(emit)
        score = score + torch.where(live, step_lp, 0.0)
        state = advance_predictor(model, state, token, emit)
        t = torch.where(live, t + advance, t)
        done = t >= lengths
    if not masks:
        return GreedyResult([[] for _ in range(b)], [[] for _ in range(b)], score)
    tok = torch.stack(emitted, 1).cpu()
    fr = torch.stack(at_frame, 1).cpu()
    mask = torch.stack(masks, 1).cpu()
    return GreedyResult([tok[i][mask[i]].tolist() for i in range(b)],
                        [fr[i][mask[i]].tolist() for i in range(b)], score)
