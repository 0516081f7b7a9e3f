"""pipeline.decoding.ssd.pack_gate_policy: when the SSD packed gate pays, from the gate's pass rate."""
from __future__ import annotations

import pytest

from shardscribe.pipeline.decoding.ssd.pack_gate_policy import PackGatePolicy


def test_the_prior_packs_the_first_batch_and_a_batch_of_one_is_never_packed():
    policy = PackGatePolicy()
    assert policy.pass_rate() == pytest.approx(2 / 3)
    assert policy.should_pack(12, 2)
    assert not policy.should_pack(1, 1)
    # A single clip is not a decision: there is nothing to pack it with.
    assert (policy.packed_batches, policy.plain_batches) == (1, 0)


def test_packing_stops_below_the_break_even_and_resumes_above_it():
    policy = PackGatePolicy(half_life=1e9)  # no forgetting: the estimate is a plain Beta mean
    policy.observe(0, 16)
    assert policy.pass_rate() == pytest.approx(2 / 19)
    # 16 clips in 2 windows: packing pays above 2/16 = 0.125; 2/19 ~ 0.105 is below.
    assert not policy.should_pack(16, 2)
    # The same rate clears a batch whose clips fit 16 to a window (break-even 1/16).
    assert policy.should_pack(16, 1)
    policy.observe(8, 16)
    assert policy.pass_rate() == pytest.approx(10 / 35)
    assert policy.should_pack(16, 2)


def test_old_observations_fade_with_the_half_life():
    policy = PackGatePolicy(half_life=16)
    policy.observe(0, 16)
    policy.observe(16, 16)
    # The first batch now weighs half: (16 + 2) / (8 + 16 + 3).
    assert policy.pass_rate() == pytest.approx(18 / 27)
    policy.observe(0, 0)
    assert policy.pass_rate() == pytest.approx(18 / 27)


def test_a_probe_packs_one_batch_in_probe_every_unpacked_ones():
    policy = PackGatePolicy(probe_every=4, half_life=1e9)
    policy.observe(0, 1000)
    decisions = [policy.should_pack(16, 2) for _ in range(9)]
    assert decisions == [False, False, False, True, False, False, False, True, False]
    assert (policy.packed_batches, policy.plain_batches) == (2, 7)
    never = PackGatePolicy(probe_every=0, half_life=1e9)
    never.observe(0, 1000)
    assert not any(never.should_pack(16, 2) for _ in range(40))
