"""SSD's packed gate (``ssd.pack_gate``): drafts and the gate read packed encoder windows,
and only the rows the gate rejects are encoded alone for the decoder. Checked against the
packed CTC decoder, full AR and the unpacked SSD decoder on the bundled real clips."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.models.whisper.adapter import WhisperAdapter


@pytest.fixture(scope="module")
def adapter(ssd_adapter):
    torch.set_num_threads(1)
    return ssd_adapter


@pytest.fixture(scope="module")
def audios(sample_audio, sample_manifest):
    clips = [sample_audio[m["id"]] for m in sample_manifest]
    # Some clips share a window and at least one is alone in its own: both paths run.
    per_window = {}
    for p in WhisperAdapter.plan_packing([len(a) for a in clips]):
        per_window[p.window] = per_window.get(p.window, 0) + 1
    assert max(per_window.values()) > 1 and min(per_window.values()) == 1, per_window
    return clips


def _decoder(adapter, tau_ctc, tau_slm, pack_gate=True):
    from shardscribe.pipeline.kinds.ssd.stages import SSDFirstPassDecoder

    return SSDFirstPassDecoder(adapter, tau_ctc, tau_slm, pack_gate=pack_gate)


def _finish(dec, results):
    from shardscribe.pipeline.kinds.ssd.stages import SSDFallback

    pending = [r for r in results if r.stage == "pending"]
    if pending:
        SSDFallback(dec.ssd, dec.share_seeds()).finish(pending)
    return results


def shared_window_drafts(adapter, audios) -> tuple[list[str], list[float]]:
    """Greedy CTC texts and max entropies on shared 30-s windows, the gate's layout
    (decoder.pack_windows isolates clips instead)."""
    draft = adapter.ctc_draft(adapter.encode_packed(audios, keep_windows=True))
    return [t.strip() for t in draft.texts], draft.max_entropy.tolist()


def test_infinite_tau_ctc_gives_the_packed_ctc_greedy_text(adapter, audios):
    texts, entropy = shared_window_drafts(adapter, audios)
    got = _decoder(adapter, float("inf"), 0.1).decode(audios)
    assert [r.stage for r in got] == ["ctc_gate"] * len(audios)
    assert [r.text for r in got] == texts
    assert [r.max_entropy for r in got] == pytest.approx(entropy)
    # The unpacked gate reads other drafts: the packed gate is not a no-op here.
    solo = _decoder(adapter, float("inf"), 0.1, pack_gate=False).decode(audios)
    assert [r.max_entropy for r in solo] != pytest.approx([r.max_entropy for r in got])


def test_zero_tau_ctc_and_unit_tau_slm_give_full_ar(adapter, audios):
    from shardscribe.pipeline.kinds.ar.stage import ARSegmentDecoder

    ar = ARSegmentDecoder(adapter).decode(audios)
    dec = _decoder(adapter, 0.0, 1.0)
    got = _finish(dec, dec.decode(audios))
    assert [r.stage for r in got] == ["ar_fallback"] * len(audios)
    assert [r.text for r in got] == [r.text for r in ar]
    assert [r.tokens for r in got] == [r.tokens for r in ar]


def test_rows_the_packed_gate_rejects_are_decoded_as_unpacked_ssd_decodes_them(adapter, audios):
    from shardscribe.pipeline.decoding.ssd.decoder import SelfSpeculativeDecoder

    packed_entropy = [r.max_entropy for r in _decoder(adapter, float("inf"), 0.1).decode(audios)]
    tau_ctc = sorted(packed_entropy)[len(audios) // 2]   # gates the clips below the median
    tau_slm = 0.3
    dec = _decoder(adapter, tau_ctc, tau_slm)
    got = _finish(dec, dec.decode(audios))
    gated = [h < tau_ctc for h in packed_entropy]
    assert 0 < sum(gated) < len(audios)
    assert [r.stage == "ctc_gate" for r in got] == gated
    assert [r.max_entropy for r in got] == pytest.approx(packed_entropy)
    # The rest: exactly what unpacked SSD gives from solo states and solo drafts, every
    # row verified (they were gated already).
    rest = [i for i, g in enumerate(gated) if not g]
    enc = adapter.encode([audios[i] for i in rest])
    draft = adapter.ctc_draft(enc)
    expected = SelfSpeculativeDecoder(adapter, 0.0, tau_slm).decode(enc.states, draft.texts, draft.max_entropy)
    assert [got[i].text for i in rest] == [r.text for r in expected]
    assert [got[i].stage for i in rest] == [r.stage for r in expected]
    assert [got[i].prefix_len for i in rest] == [r.prefix_len for r in expected]


def test_clips_longer_than_a_third_of_the_window_skip_the_packed_gate(adapter, audios):
    from shardscribe.pipeline.kinds.ar.stage import ARSegmentDecoder
    from shardscribe.pipeline.kinds.ctc_greedy.stage import CTCGreedySegmentDecoder
    from shardscribe.pipeline.kinds.ssd.stages import SSDFirstPassDecoder

    gap = np.zeros(8000, np.float32)
    long_clip = np.concatenate([audios[0], gap, audios[1], gap, audios[2]])
    assert len(long_clip) > adapter.window_samples // SSDFirstPassDecoder.PACK_GATE_WINDOW_DIVISOR
    mixed = [audios[3], long_clip, audios[4], audios[5]]
    short = [0, 2, 3]
    got = _decoder(adapter, float("inf"), 0.1).decode(mixed)
    packed, _ = shared_window_drafts(adapter, [mixed[i] for i in short])
    alone = CTCGreedySegmentDecoder(adapter).decode([long_clip])
    assert [got[i].text for i in short] == packed
    assert got[1].text == alone[0].text and got[1].max_entropy == pytest.approx(alone[0].max_entropy)
    dec = _decoder(adapter, 0.0, 1.0)
    full = _finish(dec, dec.decode(mixed))
    assert [r.text for r in full] == [r.text for r in ARSegmentDecoder(adapter).decode(mixed)]


def test_pending_rows_carry_their_solo_window_states(adapter, audios):
    dec = _decoder(adapter, 0.0, 1.0)   # no shared seeds: a fallback pool in another process
    got = dec.decode(audios)
    solo = adapter.encode(audios).states.numpy()
    for res, states in zip(got, solo):
        assert res.stage == "pending" and res.pending.states.shape == states.shape
        torch.testing.assert_close(torch.from_numpy(res.pending.states), torch.from_numpy(states),
                                   atol=1e-4, rtol=1e-4)


def test_pack_gate_config_comes_from_the_preset_and_is_validated():
    assert load_config("ssd", ["ssd.preset=high_rtfx"]).ssd.packs_gate() is False   # determinism
    assert load_config("ssd", ["ssd.preset=high_rtfx", "ssd.presets.high_rtfx.pack_gate=true"]).ssd.packs_gate() is True
    assert load_config("ssd", ["ssd.preset=high_accuracy"]).ssd.packs_gate() is False
    assert load_config("ssd", ["ssd.preset=high_rtfx", "ssd.pack_gate=false"]).ssd.packs_gate() is False
    with pytest.raises(ConfigError, match="ssd.pack_gate"):
        load_config("ssd", ["ssd.pack_gate=3"])
    with pytest.raises(ConfigError, match="ssd.presets.fast"):
        load_config("ssd", ["ssd.presets.fast={tau_ctc: 1.0, tau_slm: 0.1, pack: true}"])


def test_the_registry_builds_the_adaptive_policy_only_where_the_gate_packs(adapter):
    from shardscribe.pipeline.kinds import decoder_kind

    def policy(*overrides):
        return decoder_kind("ssd").build_first_stage(adapter, load_config("ssd", list(overrides))).pack_policy

    assert policy("ssd.preset=high_rtfx", "ssd.pack_gate=true") is not None
    assert policy("ssd.preset=high_rtfx", "ssd.pack_gate=true", "ssd.adaptive_pack_gate=false") is None
    assert policy("ssd.preset=high_rtfx") is None
    assert policy("ssd.preset=high_accuracy") is None
    with pytest.raises(ConfigError, match="ssd.adaptive_pack_gate"):
        load_config("ssd", ["ssd.adaptive_pack_gate=often"])


def test_pack_gate_needs_an_adapter_that_packs():
    from shardscribe.pipeline.kinds.ssd.stages import SSDFirstPassDecoder

    class NoPacking:
        capabilities = frozenset({"ctc", "attention_decoder"})

    with pytest.raises(ValueError, match="ssd.pack_gate"):
        SSDFirstPassDecoder(NoPacking(), 1.0, 0.1, pack_gate=True)


def _count_packed_encodes(adapter, monkeypatch) -> list[int]:
    """Clips per ``encode_packed`` call, recorded into the returned list."""
    calls = []
    packed = adapter.encode_packed

    def counted(*a, **k):
        calls.append(len(a[0]))
        return packed(*a, **k)

    monkeypatch.setattr(adapter, "encode_packed", counted)
    return calls


def test_the_adaptive_packed_gate_stops_packing_when_nothing_passes(adapter, audios, monkeypatch):
    from shardscribe.pipeline.decoding.ssd.pack_gate_policy import PackGatePolicy

    calls = _count_packed_encodes(adapter, monkeypatch)
    windows = 1 + max(p.window for p in adapter.plan_packing([len(a) for a in audios]))
    # tau_ctc = 0 rejects every draft at the gate, and tau_slm = 0 then accepts the complete
    # ones in verification (llm_verify, which needs the clip's solo encode, so it is no pass
    # of the gate): after the optimistic first batch the estimate is 2 / (n + 3), below the
    # break-even W / n of these clips.
    assert 2 / (len(audios) + 3) < windows / len(audios)
    dec = _decoder(adapter, 0.0, 0.0)
    dec.pack_policy = PackGatePolicy(half_life=1e9)
    first = _finish(dec, dec.decode(audios))
    assert "llm_verify" in [r.stage for r in first] and "ctc_gate" not in [r.stage for r in first]
    second = _finish(dec, dec.decode(audios))
    assert calls == [len(audios)]
    assert (dec.pack_policy.packed_batches, dec.pack_policy.plain_batches) == (1, 1)
    assert dec.pack_policy.seen == pytest.approx(2 * len(audios)) and dec.pack_policy.passed == 0
    # With nothing gated, packed and plain first passes decode every row alike.
    assert [(r.stage, r.text) for r in second] == [(r.stage, r.text) for r in first]


def test_the_adaptive_packed_gate_keeps_packing_while_drafts_pass(adapter, audios, monkeypatch):
    from shardscribe.pipeline.decoding.ssd.pack_gate_policy import PackGatePolicy

    calls = _count_packed_encodes(adapter, monkeypatch)
    dec = _decoder(adapter, float("inf"), 0.1)
    dec.pack_policy = PackGatePolicy(half_life=1e9)
    for _ in range(3):
        assert [r.stage for r in dec.decode(audios)] == ["ctc_gate"] * len(audios)
    assert calls == [len(audios)] * 3
    assert dec.pack_policy.passed == pytest.approx(3 * len(audios))
