"""Transducer decoding of "Pushing the Limits of Beam Search Decoding for Transducer-based
ASR models" (RNN-T and TDT): batched greedy decoding (:mod:`.greedy`) and the batched
beam searches ALSD++ and AES++ with n-gram LM fusion and phrase boosting (:mod:`.search`).

The searches see a model only through ``pipeline.models.base.TransducerModel`` (the
``transducer`` capability's Protocol), so they know no architecture:
pipeline.models.transducer adapts transformers' Parakeet RNN-T/TDT and the embedded TDT,
and the tests drive them with tiny random checkpoints.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ...models.base import TransducerModel


def advance_predictor(model: TransducerModel, state, tokens: torch.Tensor, emit: torch.Tensor,
                      masked: bool | None = None):
    """The predictor state after reading ``tokens`` [N] where ``emit`` [N], unchanged
    elsewhere. On a GPU every row is stepped and the mask applied (no host sync); on a CPU,
    where reading the mask back is free and the LSTM's arithmetic is the cost, only the
    emitting rows are stepped. ``masked`` forces one way (None: by the device); a captured
    CUDA graph needs the masked way, and CPU tests run it to check what a GPU runs."""
    if masked is None:
        masked = emit.device.type != "cpu"
    if masked:
        return model.where_state(emit, model.predictor_step(tokens, state), state)
    index = emit.nonzero().squeeze(1)
    if index.numel() == 0:
        return state
    if index.numel() == emit.numel():
        return model.predictor_step(tokens, state)
    rows = model.predictor_step(tokens.index_select(0, index), model.select_state(state, index))
    return model.put_state(state, index, rows)


def copy_state_(dst, src) -> None:
    """Write predictor state ``src`` into ``dst`` in place: a captured graph reads and
    writes fixed addresses, so a new state must land in the old one's tensors."""
    for d, x in zip(dst, src):
        d.copy_(x)


def clone_state(state):
    return tuple(x.clone() for x in state)


def greedy_choice(tok_lp: torch.Tensor, dur_lp, blank_id: int, durations, symbols: torch.Tensor,
                  max_symbols: int):
    """The greedy rule of one joint step (transducer.greedy's module docstring): the argmax
    token and, for TDT, the argmax duration; a blank with duration 0 moves one frame, and so
    does the ``max_symbols``-th label at one frame. Returns (token, blank, advance, step
    log-prob, the labels emitted at the frame so far)."""
    tok_best, token = tok_lp.max(-1)
    blank = token == blank_id
    if durations is None:
        advance = blank.long()
        step_lp = tok_best
    else:
        dur_best, d = dur_lp.max(-1)
        advance = durations[d]
        advance = torch.where(blank & (advance == 0), 1, advance)
        step_lp = tok_best + dur_best
    symbols = torch.where(blank, 0, symbols + 1)
    advance = torch.where((symbols >= max_symbols) & (advance == 0), 1, advance)
    return token, blank, advance, step_lp, torch.where(advance > 0, 0, symbols)
