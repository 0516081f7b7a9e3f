"""SSD's self-calibrating gate (``ssd.max_draft_error``): tau_ctc learnt from verification
outcomes. Checked on simulated draft streams against the threshold an oracle that knows
P(wrong | entropy) would pick, and on the embedded model with real clips, where the labels
come from the decoder's own verification."""
from __future__ import annotations

import math

import numpy as np
import pytest

from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.decoding.ssd.gate_calibration import GateCalibration


def p_wrong(h):
    return 1.0 / (1.0 + np.exp(-(h - 1.5) * 6.0))


def oracle_tau(target: float, hi: float = 3.0) -> float:
    """The largest t with E[wrong | h < t] <= target for h ~ U(0, hi), by quadrature."""
    grid = np.linspace(0.0, hi, 30001)[1:]
    mean_below = np.cumsum(p_wrong(grid)) / np.arange(1, len(grid) + 1)
    return float(grid[np.flatnonzero(mean_below <= target)[-1]])


def stream(cal: GateCalibration, n_batches: int, rng, wrong_fn=p_wrong, batch: int = 16):
    """Feeds drafts with h ~ U(0, 3); returns (accepted-and-wrong, accepted) per batch."""
    out = []
    for _ in range(n_batches):
        h = rng.uniform(0.0, 3.0, batch)
        wrong = rng.random(batch) < wrong_fn(h)
        gated, probes = cal.decide(h, np.ones(batch, bool))
        checked = ~gated | probes
        cal.observe(h[checked], wrong[checked])
        accepted = gated & ~probes
        out.append((int((accepted & wrong).sum()), int(accepted.sum())))
    return out


@pytest.mark.parametrize("target", [0.02, 0.05, 0.1])
def test_the_learnt_threshold_holds_the_target_error_rate(target):
    rng = np.random.default_rng(0)
    cal = GateCalibration(target, cap=3.0)
    results = stream(cal, 1500, rng)
    wrong, accepted = map(sum, zip(*results[500:]))
    assert accepted > 0.3 * 1000 * 16 * oracle_tau(target) / 3.0
    assert wrong / accepted <= 1.25 * target
    assert abs(cal.tau - oracle_tau(target)) <= 0.15, (cal.tau, oracle_tau(target))


def test_drafts_that_are_never_right_are_never_gated_nor_probed():
    cal = GateCalibration(0.05, cap=3.0)
    results = stream(cal, 300, np.random.default_rng(1), wrong_fn=lambda h: np.ones_like(h))
    assert sum(a for _, a in results) == 0 and cal.tau == 0.0 and cal.gated_count == 0


def test_the_gate_closes_when_the_corpus_turns_against_its_drafts():
    rng = np.random.default_rng(2)
    cal = GateCalibration(0.05, cap=3.0)
    stream(cal, 400, rng, wrong_fn=lambda h: np.where(h < 2.0, 0.0, 1.0))
    # E[wrong | h < t] = (t - 2) / t: the target 0.05 allows t up to 2.105.
    assert 2.0 <= cal.tau <= 2.15
    # Only probes see the gated bins now: one accepted draft in eight.
    after = stream(cal, 150, rng, wrong_fn=lambda h: np.ones_like(h))
    assert cal.tau < 0.5
    assert sum(a for _, a in after[-20:]) == 0


def test_max_draft_error_is_a_validated_preset_key():
    cfg = load_config("ssd", ["ssd.preset=high_rtfx", "ssd.max_draft_error=0.05"])
    assert cfg.ssd.draft_error_target() == 0.05
    assert load_config("ssd").ssd.draft_error_target() is None
    for bad in ("0", "1.5"):
        with pytest.raises(ConfigError, match="max_draft_error"):
            load_config("ssd", [f"ssd.max_draft_error={bad}"])


@pytest.fixture(scope="module")
def audios(sample_audio, sample_manifest):
    # The four shortest clips: enough entropies to fill bins, and the AR fallback stays cheap.
    return sorted((sample_audio[m["id"]] for m in sample_manifest), key=len)[:4]


@pytest.mark.slow      # eight SSD passes over real clips with the AR fallback: 20 s on one thread
def test_on_real_clips_the_gate_learns_from_verification(ssd_adapter, audios):
    """The embedded head's drafts of the bundled real clips fail verification at tau_slm
    0.1 (docs/ssd.md): the calibrated gate must stay shut and decode exactly as a gate
    that accepts nothing. With tau_slm 0 verification accepts every draft: the gate must
    open on that evidence, and what it accepts is the CTC draft."""
    from shardscribe.pipeline.kinds.ssd.stages import SSDFallback, SSDFirstPassDecoder

    adapter = ssd_adapter

    def decode(dec):
        res = dec.decode(audios)
        pending = [r for r in res if r.stage == "pending"]
        if pending:
            SSDFallback(dec.ssd, dec.share_seeds()).finish(pending)
        return res

    shut = SSDFirstPassDecoder(adapter, 4.0, 0.1, max_draft_error=0.05)
    fixed = decode(SSDFirstPassDecoder(adapter, 0.0, 0.1))
    for _ in range(2):
        got = decode(shut)
        assert [r.text for r in got] == [r.text for r in fixed]
        assert "ctc_gate" not in [r.stage for r in got]
    assert shut.ssd.gate_calibration.tau == 0.0

    drafts = adapter.ctc_draft(adapter.encode(audios))
    lenient = SSDFirstPassDecoder(adapter, 4.0, 0.0, max_draft_error=0.05)
    rounds = [decode(lenient) for _ in range(6)]
    assert "ctc_gate" not in [r.stage for r in rounds[0]]
    last = rounds[-1]
    gated = [i for i, r in enumerate(last) if r.stage == "ctc_gate"]
    assert len(gated) >= len(audios) // 2
    assert all(last[i].text == drafts.texts[i].strip() for i in gated)
    assert lenient.ssd.gate_calibration.tau > max(drafts.max_entropy[i].item() for i in gated)
    assert math.isfinite(lenient.ssd.gate_calibration.tau)
