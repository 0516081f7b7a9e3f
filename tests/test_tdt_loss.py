"""The frame-synchronous TDT loss (pipeline.training.tdt_loss) against two
independent references: transformers' anti-diagonal ``tdt_loss`` (values and gradients, on
random lattices with ragged lengths, blank first or last), and a brute-force sum over every
alignment of a tiny lattice."""
from __future__ import annotations

import math

import pytest
import torch

from shardscribe.pipeline.training.tdt_loss import tdt_loss


@pytest.mark.parametrize("blank,durations", [(0, [0, 1, 2, 3, 4]), (0, [0, 1, 2]), (6, [0, 1, 2, 3]), (6, [0, 2, 4])])
def test_equals_transformers_tdt_loss_values_and_gradients(blank, durations):
    from transformers.loss.loss_tdt import tdt_loss as reference

    gen = torch.Generator().manual_seed(len(durations) + blank)
    b, t, u, v = 3, 9, 5, 7
    tok = torch.randn(b, t, u + 1, v, generator=gen, dtype=torch.float64, requires_grad=True)
    dur = torch.randn(b, t, u + 1, len(durations), generator=gen, dtype=torch.float64, requires_grad=True)
    low, high = (1, v) if blank == 0 else (0, v - 1)
    targets = torch.randint(low, high, (b, u), generator=gen)
    # even durations reach even frame counts only
    lengths = torch.tensor([8, 6, 4]) if 1 not in durations else torch.tensor([9, 6, 3])
    target_lengths = torch.tensor([5, 2, 0])
    want = reference(tok, dur, targets, lengths, target_lengths, blank_token_id=blank, durations=durations,
                     reduction="none")
    got = tdt_loss(tok, dur, targets, lengths, target_lengths, blank, durations)
    assert torch.allclose(got.double(), want.double(), atol=1e-4)
    g_want = torch.autograd.grad(want.sum(), (tok, dur))
    g_got = torch.autograd.grad(got.sum(), (tok, dur))
    for a, w in zip(g_got, g_want):
        # Without duration 1 the reference's gradient is NaN on cells no path reaches
        # (its -inf alphas); this loss gives them finite values, and equal ones elsewhere.
        known = ~torch.isnan(w)
        assert bool(torch.isfinite(a).all()) and known.float().mean() > 0.5
        assert torch.allclose(a.double()[known], w.double()[known], atol=1e-5)


def _brute_force(tok_lp, dur_lp, target, t_len, blank, durations):
    """log of the summed probability of every path (token or blank, duration) that reads
    ``target`` and ends exactly at frame ``t_len`` with a blank (the lattice's last arc)."""
    total = []

    def walk(t, u, score):
        if t == t_len and u == len(target):
            return
        for i, d in enumerate(durations):
            if u < len(target) and t + d <= t_len and not (t + d == t_len):
                # a token cannot be the last arc (the path must end with a blank at u = U)
                walk(t + d, u + 1, score + tok_lp[t, u, target[u]] + dur_lp[t, u, i])
            if d > 0 and t + d <= t_len:
                s = score + tok_lp[t, u, blank] + dur_lp[t, u, i]
                if t + d == t_len and u == len(target):
                    total.append(s)
                elif t + d < t_len:
                    walk(t + d, u, s)

    walk(0, 0, 0.0)
    return -float(torch.logsumexp(torch.tensor(total, dtype=torch.float64), 0))


def test_equals_a_brute_force_sum_over_alignments():
    gen = torch.Generator().manual_seed(3)
    durations, blank, t_len = [0, 1, 2], 0, 4
    for target in ([1], [2, 1], [1, 1, 2]):
        tok = torch.randn(1, t_len, len(target) + 1, 4, generator=gen)
        dur = torch.randn(1, t_len, len(target) + 1, len(durations), generator=gen)
        got = tdt_loss(tok, dur, torch.tensor([target]), torch.tensor([t_len]), torch.tensor([len(target)]),
                       blank, durations)
        want = _brute_force(tok[0].log_softmax(-1), dur[0].log_softmax(-1), target, t_len, blank, durations)
        assert math.isclose(float(got[0]), want, abs_tol=1e-4), (target, float(got[0]), want)


def test_an_unreachable_utterance_costs_a_huge_finite_loss_with_finite_gradients():
    """Even durations cannot end at an odd frame count: the reference says inf, this loss a
    large finite number (so one such row cannot turn a batch's gradients into NaN)."""
    tok = torch.randn(2, 5, 3, 4, requires_grad=True)
    dur = torch.randn(2, 5, 3, 2, requires_grad=True)
    loss = tdt_loss(tok, dur, torch.tensor([[1, 2], [2, 3]]), torch.tensor([5, 4]), torch.tensor([2, 2]), 0, [0, 2])
    assert loss[0] > 1e8 and loss[1] < 100
    grads = torch.autograd.grad(loss[1], (tok, dur))
    assert all(bool(torch.isfinite(g).all()) for g in grads)


def _rnnt_brute_force(tok_lp, target, t_len, blank):
    """RNN-T: a token stays on its frame, a blank moves to the next; the last arc is the
    blank at the last frame."""
    total = []

    def walk(t, u, score):
        if u < len(target):
            walk(t, u + 1, score + tok_lp[t, u, target[u]])
        if t == t_len - 1:
            if u == len(target):
                total.append(score + tok_lp[t, u, blank])
            return
        walk(t + 1, u, score + tok_lp[t, u, blank])

    walk(0, 0, 0.0)
    return -float(torch.logsumexp(torch.tensor(total, dtype=torch.float64), 0))


def test_without_durations_it_is_the_rnnt_loss_of_a_brute_force_sum():
    gen = torch.Generator().manual_seed(5)
    for target, t_len in (([1], 3), ([2, 1], 4), ([1, 3, 2], 2)):
        tok = torch.randn(1, t_len + 2, len(target) + 2, 4, generator=gen)   # padded past the lengths
        got = tdt_loss(tok, None, torch.tensor([target + [0]]), torch.tensor([t_len]), torch.tensor([len(target)]),
                       0, None)
        want = _rnnt_brute_force(tok[0].log_softmax(-1), target, t_len, 0)
        assert math.isclose(float(got[0]), want, abs_tol=1e-4), (target, float(got[0]), want)
