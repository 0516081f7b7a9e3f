"""pipeline.decoding.ssd.verify_policy: when SSD's draft and verification pay for themselves, and what a
batch that skips them decodes (plain greedy AR, checked against an uncached reference)."""
from __future__ import annotations

import json

import pytest
import torch

from ar_reference import uncached_greedy
from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.decoding.ssd.verify_policy import VerifyPolicy


def test_the_prior_drafts_the_first_batch():
    policy = VerifyPolicy()
    assert policy.gain() > policy.cost()
    assert policy.should_draft()
    assert (policy.drafted_batches, policy.skipped_batches) == (1, 0)


def test_drafting_stops_below_the_break_even_and_resumes_above_it():
    policy = VerifyPolicy(half_life=1e9, probe_every=0)  # no forgetting, no probes
    # 20 segments: 10 tokens decided in 0.4 s beyond the encoder (20 ms a segment) ...
    policy.observe_first_pass(20, 10, 0.4)
    # ... while the fallback decodes a token in 4 ms: the first pass costs 5 tokens a
    # segment (with the prior's 6 for 4 segments: 124 / 24) and decides (10 + 64) / 24.
    policy.observe_fallback(20, 300, 1.2)
    assert policy.cost() == pytest.approx(124 / 24)
    assert policy.gain() == pytest.approx(74 / 24)
    assert not policy.should_draft()
    # The same first pass where a token costs the fallback 40 ms: 0.5 tokens, it pays.
    policy.observe_fallback(20, 30, 1.2e3)
    assert policy.cost() < policy.gain()
    assert policy.should_draft()


def test_one_small_batch_does_not_decide_alone():
    """A first batch of one clip: 1 token decided for 100 ms of first pass, 5 ms a fallback
    token, i.e. 20 tokens of cost. Its priors keep the next (full) batch drafted, and that
    batch's own figures then switch drafting off."""
    policy = VerifyPolicy(half_life=1e9, probe_every=0)
    policy.observe_first_pass(1, 1, 0.1)
    policy.observe_fallback(1, 10, 0.05)
    assert policy.gain() == pytest.approx(65 / 5) and policy.cost() == pytest.approx(44 / 5)
    assert policy.should_draft()
    policy.observe_first_pass(16, 10, 0.4)      # 25 ms a segment: 5 tokens
    assert policy.cost() == pytest.approx((20 + 80 + 24) / 21)
    assert not policy.should_draft()


def test_the_prior_cost_stands_until_the_fallback_reports():
    policy = VerifyPolicy(half_life=1e9, probe_every=0)
    policy.observe_first_pass(20, 20 * 2, 0.4)
    # gain (40 + 64) / 24 ~ 4.3 against the prior 6: no fallback has reported yet.
    assert policy.cost() == policy.prior_cost
    assert not policy.should_draft()
    policy.observe_fallback(20, 200, 2.0)   # 10 ms a token: the first pass costs 2 tokens
    assert policy.should_draft()


def test_a_probe_drafts_one_batch_in_probe_every_skipped_ones():
    policy = VerifyPolicy(probe_every=4)
    policy.observe_first_pass(100, 0, 10.0)
    policy.observe_fallback(100, 100, 1.0)
    decisions = [policy.should_draft() for _ in range(12)]
    assert decisions == [False, False, False, True] * 3
    assert (policy.drafted_batches, policy.skipped_batches) == (3, 9)


def test_old_observations_fade_with_the_half_life():
    policy = VerifyPolicy(half_life=10.0, prior_weight=0.0)
    policy.observe_first_pass(10, 0, 1.0)
    policy.observe_first_pass(10, 100, 1.0)
    # the first batch now weighs half: (0 * 0.5 + 100) / (10 * 0.5 + 10)
    assert policy.gain() == pytest.approx(100 / 15)


def test_a_fixed_break_even_ignores_the_timings():
    policy = VerifyPolicy(half_life=1e9, probe_every=0, break_even=2.0)
    policy.observe_first_pass(10, 25, 100.0)     # a first pass that took ages ...
    policy.observe_fallback(10, 10, 1e-3)        # ... against a nearly free fallback
    assert policy.cost() == 2.0 and policy.should_draft()   # (25 + 64) / 14 > 2
    policy.observe_first_pass(100, 0, 1e-6)
    assert not policy.should_draft()              # (25 + 64) / 114 < 2, however cheap


def test_adaptive_verify_is_on_unless_set_off():
    assert load_config("ssd").ssd.verifies_adaptively() and load_config(None).ssd.verifies_adaptively()
    assert load_config("ssd", ["ssd.max_draft_error=0.05"]).ssd.verifies_adaptively()
    assert not load_config("ssd", ["ssd.max_draft_error=0.05", "ssd.adaptive_verify=false"]).ssd.verifies_adaptively()
    assert not load_config("ssd", ["ssd.adaptive_verify=false"]).ssd.verifies_adaptively()
    with pytest.raises(ConfigError, match="ssd.verify_break_even"):
        load_config("ssd", ["ssd.verify_break_even=-1"])


@pytest.fixture(scope="module")
def audios(sample_audio, sample_manifest):
    return sorted((sample_audio[m["id"]] for m in sample_manifest), key=len)[:4]


@pytest.mark.parametrize("local", [False, True], ids=["fallback-pool", "same-process"])
def test_a_skipped_batch_is_plain_greedy_ar_without_a_draft(ssd_adapter, audios, monkeypatch, local):
    """A batch the policy skips is never drafted nor verified, and is decoded from an empty
    prefix: exactly an uncached greedy decoder's tokens. For a fallback pool it leaves the
    first pass pending; with the fallback in the same process it leaves it final. Its
    segments say so (stage ``ar``, no entropy) and their words get no draft agreement."""
    from shardscribe.pipeline.kinds.ssd.stages import SSDFallback, SSDFirstPassDecoder

    adapter = ssd_adapter
    dec = SSDFirstPassDecoder(adapter, 0.6, 0.1, adaptive_verify=True, confidence=True)
    dec.verify_policy.prior_gain, dec.verify_policy.probe_every = 0.0, 0
    fallback = SSDFallback(dec.ssd, dec.share_seeds(), confidence=True, verify_policy=dec.verify_policy)
    if local:
        dec.local_fallback = fallback
    drafts = []
    real_draft = adapter.ctc_draft
    monkeypatch.setattr(adapter, "ctc_draft", lambda enc: drafts.append(1) or real_draft(enc))
    res = dec.decode(audios)
    assert not drafts
    if local:
        assert all(r.pending is None for r in res)
    else:
        assert [r.stage for r in res] == ["pending"] * len(audios)
        for r in res:  # through Arrow to the fallback pool, as the two-pool plan ships it
            r.pending = type(r.pending).from_bytes(r.pending.to_bytes())
        assert all(r.max_entropy is None and r.pending.undrafted and r.pending.draft_text is None for r in res)
        fallback.finish(res)
    states = adapter.encode(audios).states
    for i, r in enumerate(res):
        ref = uncached_greedy(adapter, states[i:i + 1], [])
        assert r.stage == "ar" and r.prefix_len == 0 and r.generated == len(ref) and r.max_entropy is None
        assert r.text == adapter.text(ref)
        assert r.word_features and all("agree" not in f for f in r.word_features)
    assert dec.verify_policy.ar_tokens == sum(r.generated for r in res)
    assert dec.verify_policy.ar_seconds > 0 and dec.verify_policy.rows == 0


def test_a_first_pool_samples_skipped_batches_to_learn_the_fallback_cost(ssd_adapter, audios):
    """The kind's first stage as a Ray first pool builds it (no second stage in its
    process): the first skipped batch is decoded right there, final, equal to an uncached
    greedy reference, and tells the policy what a fallback token costs (before, a two-pool
    job kept the prior). Later skipped batches go to the fallback pool (decoding them all
    here would serialise what that pool does beside this one) but for one in
    ``probe_every``. No verification cache is kept for a fallback that is not here. The
    in-process runner's second stage decodes every skipped batch in place."""
    from shardscribe.pipeline.kinds import decoder_kind

    cfg = load_config("ssd", ["ssd.preset=high_rtfx", "ssd.max_draft_error=0.05"])
    kind = decoder_kind("ssd")
    first = kind.build_first_stage(ssd_adapter, cfg)
    policy = first.verify_policy
    assert policy is not None and first.cost_sampler is not None and first.local_fallback is None
    policy.prior_gain, policy.probe_every = 0.0, 3
    prior_cost = policy.cost()
    res = first.decode(audios)
    assert all(r.pending is None and r.stage == "ar" for r in res)
    assert first.seeds is None
    assert policy.ar_tokens == sum(r.generated for r in res) > 0 and policy.ar_seconds > 0
    states = ssd_adapter.encode(audios).states
    for i, r in enumerate(res):
        assert r.text == ssd_adapter.text(uncached_greedy(ssd_adapter, states[i:i + 1], []))
    # Calls 2-7 (probe_every 3): skipped 2 goes pending undrafted, a probe drafts (3 in a
    # row), skipped 3 pending, skipped 4 sampled here (4 % 3 == 1), a probe, skipped 5.
    stages = []
    for _ in range(6):
        out = first.decode(audios[:1])
        stages.append("ar" if out[0].stage == "ar" else "undrafted" if out[0].pending and out[0].pending.undrafted
                      else "drafted")
    assert stages == ["undrafted", "drafted", "undrafted", "ar", "drafted", "undrafted"]
    assert policy.drafted_batches == 2 and policy.cost() != prior_cost
    second = kind.build_second_stage(cfg, first)
    assert first.local_fallback is second and second.seeds is first.seeds is not None
    # Without the policy (ssd.adaptive_verify=false) nothing is decoded in the first pass.
    assert kind.build_first_stage(ssd_adapter, load_config("ssd", ["ssd.adaptive_verify=false"])).cost_sampler is None


def test_a_drafted_batch_reports_the_tokens_it_decided(ssd_adapter, audios):
    """With tau_slm 0 verification accepts every non-empty draft whole: the first pass
    decides every draft token, and the policy is told exactly that many."""
    from shardscribe.pipeline.kinds.ssd.stages import SSDFirstPassDecoder

    dec = SSDFirstPassDecoder(ssd_adapter, 0.0, 0.0, adaptive_verify=True)
    res = dec.decode(audios)
    assert dec.verify_policy.drafted_batches == 1
    final = [r for r in res if r.stage == "llm_verify"]
    assert final, [r.stage for r in res]
    expected = sum(r.tokens for r in final) + sum(r.pending.prefix.__len__() for r in res if r.pending)
    assert dec.verify_policy.decided == expected and dec.verify_policy.rows == len(audios)
    assert dec.verify_policy.seconds > 0


def test_skipped_segments_take_the_ar_kind_calibration():
    from shardscribe.pipeline.confidence.apply import ConfidenceScorer
    from shardscribe.pipeline.confidence.calibration import Calibration, EMBEDDED_PATH
    from shardscribe.pipeline.kinds import decoder_kind

    cal = Calibration.load(EMBEDDED_PATH)
    feats = [{"prob_mean": 0.9, "prob_min": 0.8, "n_tokens": 1}, {"prob_mean": 0.2, "prob_min": 0.1, "n_tokens": 2}]
    ssd, ar = ConfidenceScorer(cal, decoder_kind("ssd")), ConfidenceScorer(cal, decoder_kind("ar"))
    assert ssd.words("ar", feats) == ar.words("ar", feats)
    assert ssd.words("ar", feats) != ssd.words("ar_fallback", feats)
    assert torch.tensor(ssd.words("ar", feats)).ge(0).all()


@pytest.mark.slow
def test_a_job_whose_drafts_never_pay_stops_drafting_early(tmp_path, samples_dir, sample_manifest, model_cache):
    """The default config, one recording a batch, on drafts that decide nothing (tau_ctc 0:
    the gate passes none; tau_slm 1: verification accepts no token) at a fixed break-even of
    4 tokens a segment: the optimistic prior (16 tokens for 4 segments) carries the first
    batches, then drafting stops, so the summary counts the first rows as SSD's fallback
    and the rest as plain AR, one probe in ``probe_every`` batches aside."""
    from conftest import transcribe_in_process

    rounds = 4
    manifest = tmp_path / "clips.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"{m['id']}-{k}", "audio": str(samples_dir / m["audio"])}) + "\n"
                                for k in range(rounds) for m in sample_manifest))
    summary, rows = transcribe_in_process(
        tmp_path / "out", "--input", str(manifest), "--runner", "local", "--set", f"model.cache_dir={model_cache}",
        "--set", "ssd.tau_ctc=0.0", "--set", "ssd.tau_slm=1.0", "--set", "ssd.verify_break_even=4",
        "--set", "batching.recordings_per_batch=1", "--set", "batching.first_batch=1",
        "--set", "batching.max_joined_blocks=1")
    total = rounds * len(sample_manifest)
    assert summary["rows_out"] == total and summary["errors"] == 0
    policy = VerifyPolicy()
    # drafted segments before the prior's gain, alone, falls to the break-even
    drafted = next(n for n in range(1, total) if policy.prior_gain * policy.prior_weight / (n + policy.prior_weight) <= 4)
    probes = (total - drafted) // policy.probe_every
    assert summary["stages"] == {"ar_fallback": drafted + probes, "ar": total - drafted - probes}, summary["stages"]
