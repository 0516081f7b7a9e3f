"""Gate verification (``ssd.gate_verify_tau``): drafts the gate accepts are verified too,
on packed windows (every clip of a window in one teacher-forced pass over that window) or
on their own. Checked against Whisper's own uncached forward on each window alone
(transformers' WhisperForConditionalGeneration) with the rule applied by brute force, and
through SSD's decoders on the bundled real clips."""
from __future__ import annotations

import pytest
import torch

from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.decoding.ssd.packed_verify import joined_transcript, verify_packed_drafts


@pytest.fixture(scope="module")
def adapter(model_cache):
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    torch.set_num_threads(1)
    return load_whisper_adapter("embedded", cache_dir=model_cache, ctc_head="embedded")


@pytest.fixture(scope="module")
def packed(adapter, sample_audio, sample_manifest):
    """Packed windows of the bundled clips, each window's clips in order, and drafts: the
    solo AR tokens (mostly accepted) for even clips, the packed CTC drafts for odd ones."""
    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode

    audios = [sample_audio[m["id"]] for m in sample_manifest]
    enc = adapter.encode_packed(audios, keep_windows=True)
    ctc = adapter.ctc_draft(enc).texts
    ar = greedy_decode(adapter, adapter.encode(audios).states)
    drafts = [ar[i] if i % 2 == 0 else adapter.tokenize(ctc[i]) for i in range(len(audios))]
    windows: dict[int, list[int]] = {}
    for i, p in sorted(enumerate(enc.placements), key=lambda x: (x[1].window, x[1].start)):
        windows.setdefault(p.window, []).append(i)
    assert max(len(c) for c in windows.values()) > 1
    return audios, enc, [windows[w] for w in sorted(windows)], drafts


def _reference(adapter, states, clips, drafts, tau):
    """Brute force on one window: Whisper's plain forward over the whole joined transcript
    (no cache, no mask, no gathering), then the rule clip by clip."""
    seq = list(adapter.prompt_ids)
    spans = []
    for i in clips:
        spans.append((i, len(seq), len(seq) + len(drafts[i])))
        seq += drafts[i]
    with torch.inference_mode():
        logits = adapter.model(encoder_outputs=(states.unsqueeze(0),),
                               decoder_input_ids=torch.tensor([seq])).logits[0].float()
    out = {}
    for i, first, end in spans:
        ps = []
        for c in range(first, end + 1):
            row = logits[c - 1].clone()
            row[adapter.suppress_mask] = float("-inf")
            if c - 1 == len(adapter.prompt_ids) - 1:
                row[adapter.begin_suppress_ids] = float("-inf")
            target = seq[c] if c < len(seq) else adapter.eot_id
            if c < end:
                ps.append(float(row.softmax(-1)[target]))
            else:
                complete = int(row.argmax()) == target
        ok = bool(ps) and all(p > tau for p in ps) and complete
        out[i] = (ok, min(ps) if ps else 1.0)
    return out


@pytest.mark.parametrize("tau", [1e-5, 0.3])
def test_packed_verification_equals_whispers_own_forward_window_by_window(adapter, packed, tau):
    _, enc, windows, drafts = packed
    got = verify_packed_drafts(adapter, enc.window_states, windows, drafts, tau)
    for w, clips in enumerate(windows):
        ref = _reference(adapter, enc.window_states[w], clips, drafts, tau)
        for i in clips:
            assert bool(got.accepted[i]) == ref[i][0], (i, float(got.min_prob[i]), ref[i])
            assert float(got.min_prob[i]) == pytest.approx(ref[i][1], abs=1e-5)
    assert got.scored.all()
    if tau == 1e-5:  # both outcomes occur, so the comparison above is not vacuous
        assert got.accepted.any() and not got.accepted.all()


def test_a_batch_of_windows_verifies_like_each_window_alone(adapter, packed):
    _, enc, windows, drafts = packed
    together = verify_packed_drafts(adapter, enc.window_states, windows, drafts, 1e-3)
    for w, clips in enumerate(windows):
        alone = verify_packed_drafts(adapter, enc.window_states[w:w + 1], [clips], drafts, 1e-3)
        assert together.accepted[clips].tolist() == alone.accepted[clips].tolist()
        assert together.min_prob[clips].tolist() == pytest.approx(alone.min_prob[clips].tolist(), abs=1e-5)


def test_a_dropped_last_token_fails_the_completeness_check(adapter, packed):
    _, enc, windows, drafts = packed
    full = verify_packed_drafts(adapter, enc.window_states, windows, drafts, 1e-5)
    i = next(i for i in range(len(drafts)) if bool(full.accepted[i]) and len(drafts[i]) > 1)
    cut = list(drafts)
    cut[i] = drafts[i][:-1]
    got = verify_packed_drafts(adapter, enc.window_states, windows, cut, 1e-5)
    assert not bool(got.accepted[i])
    assert float(got.min_prob[i]) >= float(full.min_prob[i])   # its tokens still all pass


def test_joined_transcript_leaves_out_the_clips_that_do_not_fit():
    drafts = [[1, 2], [3], [4, 5, 6], [7]]
    seq, span = joined_transcript([9, 9], [0, 1, 2, 3], drafts, max_positions=100)
    assert seq == [9, 9, 1, 2, 3, 4, 5, 6, 7]
    assert span == [(0, 2, 4), (1, 4, 5), (2, 5, 8), (3, 8, 9)]
    # 2 + 2 + 1 + 3 = 8 columns, plus one for the token after: clip 2 needs 9 > 8.
    seq, span = joined_transcript([9, 9], [0, 1, 2, 3], drafts, max_positions=8)
    assert seq == [9, 9, 1, 2, 3] and [s[0] for s in span] == [0, 1]


def _decode(adapter, audios, tau_ctc, gate_verify_tau, pack_gate=True):
    from shardscribe.pipeline.kinds.ssd.stages import SSDFallback, SSDFirstPassDecoder

    dec = SSDFirstPassDecoder(adapter, tau_ctc, 0.1, pack_gate=pack_gate, gate_verify_tau=gate_verify_tau)
    fallback = SSDFallback(dec.ssd, dec.share_seeds())
    res = dec.decode(audios)
    pending = [r for r in res if r.stage == "pending"]
    if pending:
        fallback.finish(pending)
    return res


@pytest.mark.parametrize("pack_gate", [True, False])
def test_unit_tau_rejects_every_draft_so_rows_decode_as_with_a_closed_gate(adapter, packed, pack_gate):
    audios = packed[0]
    got = _decode(adapter, audios, float("inf"), 1.0, pack_gate)
    closed = _decode(adapter, audios, 0.0, None, pack_gate)
    assert "ctc_gate" not in [r.stage for r in got]
    assert [r.text for r in got] == [r.text for r in closed]
    assert [r.stage for r in got] == [r.stage for r in closed]


def test_the_packed_pipeline_accepts_exactly_the_drafts_packed_verification_accepts(adapter, packed):
    audios, enc, windows, _ = packed
    tau = 1e-5
    # The gate drafts on shared windows (decoder.pack_windows isolates clips instead).
    ctc = [t.strip() for t in adapter.ctc_draft(enc).texts]
    drafts = [adapter.tokenize(t) if t else [] for t in ctc]
    ref = verify_packed_drafts(adapter, enc.window_states, windows, drafts, tau)
    got = _decode(adapter, audios, float("inf"), tau)
    assert [r.stage == "ctc_gate" for r in got] == ref.accepted.tolist()
    for r, c, p, ok in zip(got, ctc, ref.min_prob.tolist(), ref.accepted.tolist()):
        if ok:   # the packed draft is the text, with the packed evidence
            assert r.text == c and r.min_prob == pytest.approx(p, abs=1e-6)
    assert any(ref.accepted.tolist())


def test_unpacked_gate_verification_is_eq5_at_its_tau_then_the_usual_ssd(adapter, packed):
    """Without packing, a gated draft stays final exactly when eq. 5 at gate_verify_tau
    accepts it (on its own window); every other row is decoded as the plain SSD decoder
    decodes a row its gate rejected."""
    from shardscribe.pipeline.decoding.ssd.decoder import SelfSpeculativeDecoder
    from shardscribe.pipeline.decoding.ssd.verify import verify_drafts

    audios = packed[0]
    enc = adapter.encode(audios)
    texts = adapter.ctc_draft(enc).texts
    ref = verify_drafts(adapter, enc.states, [adapter.tokenize(t) for t in texts], 1e-5)
    got = SelfSpeculativeDecoder(adapter, float("inf"), 0.1, gate_verify_tau=1e-5).decode(
        enc.states, texts, torch.zeros(len(audios)))
    closed = SelfSpeculativeDecoder(adapter, 0.0, 0.1).decode(enc.states, texts, torch.zeros(len(audios)))
    accepted = ref.accepted.tolist()
    assert any(accepted) and not all(accepted)
    assert [r.stage == "ctc_gate" for r in got] == accepted
    for g, c, t, ok, p in zip(got, closed, texts, accepted, ref.min_prob.tolist()):
        if ok:
            assert g.text == t.strip() and g.min_prob == pytest.approx(p, abs=1e-6)
        else:
            assert (g.stage, g.text, g.tokens, g.prefix) == (c.stage, c.text, c.tokens, c.prefix)


def test_config_reads_the_preset_and_names_the_key_on_bad_values():
    cfg = load_config("ssd", ["ssd.preset=high_rtfx"])
    assert cfg.ssd.gate_verify_threshold() == pytest.approx(3e-5)
    assert load_config("ssd", ["ssd.preset=high_accuracy"]).ssd.gate_verify_threshold() is None
    assert load_config("ssd", ["ssd.preset=high_rtfx", "ssd.gate_verify_tau=0.01"]).ssd.gate_verify_threshold() == 0.01
    assert load_config("ssd", ["ssd.preset=high_accuracy", "ssd.gate_verify_tau=0.01"]).ssd.gate_verify_threshold() == 0.01
    # A shipped preset's gate verification can be switched off by an override.
    off = load_config("ssd", ["ssd.preset=high_rtfx", "ssd.presets.high_rtfx.gate_verify_tau=null",
                              "ssd.pack_gate=true"])
    assert off.ssd.gate_verify_threshold() is None and off.ssd.packs_gate()
    with pytest.raises(ConfigError, match=r"ssd\.gate_verify_tau"):
        load_config("ssd", ["ssd.preset=high_rtfx", "ssd.gate_verify_tau=1.5"])
    with pytest.raises(ConfigError, match=r"ssd\.presets\.x\.gate_verify_tau"):
        load_config("ssd", ["ssd.presets.x={tau_ctc: 1, tau_slm: 0.1, gate_verify_tau: high}"])
