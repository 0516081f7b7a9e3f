"""The frame loop of Algorithm 1 of "FlexCTC: GPU-powered CTC Beam Decoding with advanced
Contextual Abilities", eagerly: the per-frame torch step of
:mod:`pipeline.decoding.ctc_beam.step` once per frame, on any device. The only Python loop
is over frames, as in the paper; the CUDA-graph and native loops run the same step.
"""
from __future__ import annotations

import torch

from .state import NEG_INF, Beams, Frames
from .step import FrameStep


def eager_loop(step: FrameStep, frames: Frames, beams: Beams, lookups: list, track_beams: bool):
    """``(beams, choices [S, B, K], alive)`` after ``frames.steps`` frames from ``beams``;
    ``alive`` [B] sums the live hypotheses per frame, weighted by the frames a step stands
    for (None unless ``track_beams``)."""
    s = frames.steps
    b, k = beams.scores.shape
    dev = beams.scores.device
    choices = []
    alive = torch.zeros(b, device=dev) if track_beams else None
    values, thresholds = frames.values, frames.thresholds
    tokens, lm_tokens = frames.tokens, frames.lm_tokens
    for i in range(s):
        if tokens is None:
            beams, choice = step(beams, values[i], None, lm_tokens, thresholds[i], lookups)
        else:
            beams, choice = step(beams, values[i], tokens[i], lm_tokens[i], thresholds[i], lookups)
        choices.append(choice)
        if alive is not None:
            alive = alive + (beams.scores > NEG_INF).sum(1) * frames.weights[i]
    if s == 0:
        return beams, torch.zeros((0, b, k), dtype=torch.int64, device=dev), alive
    return beams, torch.stack(choices), alive
