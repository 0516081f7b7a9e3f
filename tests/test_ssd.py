"""Self-speculative decoding invariants, exact, on real audio and the real model."""
from __future__ import annotations

import math

import pytest
import torch

from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
from shardscribe.pipeline.decoding.ssd.decoder import AR_FALLBACK, CTC_GATE, LLM_VERIFY, SelfSpeculativeDecoder
from ar_reference import next_token_probs, uncached_greedy
from shardscribe.pipeline.kinds.ctc_greedy.stage import CTCGreedySegmentDecoder
from shardscribe.pipeline.kinds.ssd.stages import SSDFirstPassDecoder
from shardscribe.pipeline.decoding.ssd.verify import verify_drafts


@pytest.fixture(scope="module")
def encoded(whisper_adapter, sample_audio):
    audios = [sample_audio[k] for k in sorted(sample_audio)]
    enc = whisper_adapter.encode(audios)
    full = greedy_decode(whisper_adapter, enc.states)
    return enc, full


@pytest.fixture(scope="module")
def uncached(whisper_adapter, encoded):
    """``uncached_greedy`` on row ``i`` of ``encoded``, each question answered once: the
    reference costs a pass over the whole sequence per token, and several tests and
    parameters ask it the same one (the same prefix of the same row)."""
    enc, _ = encoded
    memo = {}

    def reference(i: int, prefix: list[int], max_new_tokens: int) -> list[int]:
        key = (i, tuple(prefix), max_new_tokens)
        if key not in memo:
            memo[key] = uncached_greedy(whisper_adapter, enc.states[i:i + 1], prefix, max_new_tokens)
        return list(memo[key])

    return reference


def _reference_token_probs(adapter, states, tokens):
    """Token probabilities by plain incremental decoding, one row at a time (no padding)."""
    probs = []
    seq = list(adapter.prompt_ids)
    for k, tok in enumerate(tokens + [adapter.eot_id]):
        hidden, _ = adapter.decoder_hidden(torch.tensor([seq]), states, None, None, None)
        logits = adapter.logits(hidden[:, -1])[0]
        logits[adapter.suppress_mask] = -math.inf
        if k == 0:
            logits[adapter.begin_suppress_ids] = -math.inf
        probs.append(logits.softmax(-1)[tok].item())
        seq.append(tok)
    return probs


def test_verification_matches_incremental_decoding(whisper_adapter, encoded):
    enc, full = encoded
    ver = verify_drafts(whisper_adapter, enc.states, full, tau_slm=0.0)
    assert ver.accepted.all()  # the AR output is the decoder's own greedy choice
    for i in (0, 3):
        ref = _reference_token_probs(whisper_adapter, enc.states[i:i + 1], full[i])
        got = ver.token_probs[i, :len(full[i])].tolist()
        assert got == pytest.approx(ref[:-1], abs=1e-4)


def test_batch_verification_equals_rows_alone(whisper_adapter, encoded):
    enc, full = encoded
    drafts = [f[:max(1, len(f) - i)] for i, f in enumerate(full)]  # ragged, some incomplete
    batch = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm=0.3)
    for i, d in enumerate(drafts):
        one = verify_drafts(whisper_adapter, enc.states[i:i + 1], [d], tau_slm=0.3)
        assert bool(one.accepted[0]) == bool(batch.accepted[i])
        assert int(one.first_reject[0]) == int(batch.first_reject[i])
        assert one.token_probs[0, :len(d)].tolist() == pytest.approx(batch.token_probs[i, :len(d)].tolist(), abs=1e-5)


def test_incomplete_draft_is_not_accepted(whisper_adapter, encoded):
    enc, full = encoded
    drafts = [f[:-2] for f in full]
    ver = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm=0.0)
    assert not ver.accepted.any()
    assert ver.first_reject.tolist() == [len(d) for d in drafts]


def _texts(adapter, full):
    return [adapter.text(f) for f in full]


@pytest.fixture(scope="module")
def ctc_adapter(model_cache):
    """Whisper with the embedded CTC head (the drafts come from it)."""
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    return load_whisper_adapter("embedded", cache_dir=model_cache, ctc_head="embedded")


def test_tau_ctc_infinite_is_the_ctc_greedy_decoder(ctc_adapter, sample_audio, monkeypatch):
    """DESIGN invariant: with tau_CTC = +inf the gate accepts every non-empty draft, so
    SSD (unpacked first pass) returns exactly what the ctc_greedy decoder returns on the
    same real audio, and never runs the Whisper decoder. A gate that compared the wrong
    way, re-verified gated drafts, or reported another text/entropy than the draft's
    would fail."""
    audios = [sample_audio[k] for k in sorted(sample_audio)]
    ctc = CTCGreedySegmentDecoder(ctc_adapter).decode(audios)
    assert all(r.text for r in ctc)              # non-empty drafts: the gate's domain
    assert len({r.max_entropy for r in ctc}) > 1

    def no_decoder(*args, **kwargs):
        raise AssertionError("tau_ctc = inf must not run the decoder")

    monkeypatch.setattr(ctc_adapter, "decoder_hidden", no_decoder)
    ssd = SSDFirstPassDecoder(ctc_adapter, tau_ctc=math.inf, tau_slm=0.5, pack_gate=False).decode(audios)
    assert [r.text for r in ssd] == [r.text for r in ctc]
    assert all(r.stage == CTC_GATE and r.generated == 0 and r.prefix_len is None for r in ssd)
    assert [r.max_entropy for r in ssd] == pytest.approx([r.max_entropy for r in ctc], abs=1e-6)


def test_tau_zero_and_slm_one_is_exactly_full_ar(whisper_adapter, encoded):
    enc, full = encoded
    drafts = _texts(whisper_adapter, full)  # even perfect drafts must be re-decoded
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=1.0)
    rows = ssd.decode(enc.states, drafts, torch.zeros(len(drafts)))
    assert all(r.stage == AR_FALLBACK and r.prefix == [] for r in rows)
    assert [r.tokens for r in rows] == full


def test_fallback_resumes_from_the_verified_prefix(whisper_adapter, encoded):
    enc, full = encoded
    # Corrupt one token of each AR transcript: verification must stop there, and the
    # fallback must reproduce AR forced with the verified prefix (here: AR itself).
    js = [min(2, len(f) - 1) for f in full]
    bad_tok = whisper_adapter.tokenize("zebra")[0]
    corrupted = [f[:j] + [bad_tok] + f[j + 1:] for f, j in zip(full, js)]
    drafts = [whisper_adapter.text(c) for c in corrupted]
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=0.01)
    rows = ssd.decode(enc.states, drafts, torch.zeros(len(drafts)))
    for row, f, c in zip(rows, full, corrupted):
        assert row.stage == AR_FALLBACK
        j = len(row.prefix)
        assert row.draft_tokens[:j] == row.prefix
        forced = greedy_decode(whisper_adapter, enc.states[rows.index(row):rows.index(row) + 1],
                               prefixes=[row.prefix])[0]
        assert row.tokens == row.prefix + forced
    assert [r.tokens for r in rows] == full


def _disagreeing_drafts(adapter, enc, full, tau_slm):
    """Per row, draft tokens whose verified prefix is NOT what greedy AR decodes: AR's
    first token, then the most probable other token that verification still accepts
    (probability above tau_slm, by the uncached reference), then a token it rejects,
    then the rest of the AR transcript (material for the lookahead's draft sync)."""
    bad = adapter.tokenize("zebra")[0]
    drafts = []
    for i, f in enumerate(full):
        probs = next_token_probs(adapter, enc.states[i:i + 1], f[:1]).clone()
        probs[[f[1], adapter.eot_id]] = 0.0
        alt = int(probs.argmax())
        assert float(probs[alt]) > 2 * tau_slm, (i, float(probs[alt]))
        drafts.append(adapter.text(f[:1] + [alt, bad] + f[2:]))
    return drafts


@pytest.mark.parametrize("reuse_kv,lookahead", [(False, 0), (True, 0), (True, 3)])
def test_fallback_from_a_prefix_that_disagrees_with_ar_equals_uncached_greedy(whisper_adapter, encoded, uncached,
                                                                              reuse_kv, lookahead):
    """The verified prefix takes a token greedy AR would not (eq. 5 accepts any token
    above tau_slm): the fallback must continue from THAT prefix, exactly as an uncached
    decoder run over prompt + prefix + tokens so far does, and count what it generated.
    A fallback that dropped the prefix, restarted from scratch, resumed from a stale
    cache, or (lookahead, greedy rule) kept a draft guess that is not the argmax would differ."""
    enc, full = encoded
    tau_slm = 1e-3
    drafts = _disagreeing_drafts(whisper_adapter, enc, full, tau_slm)
    # 48 new tokens at most: the uncached reference costs a pass over the whole sequence
    # per token, and a forced wrong token can make the decoder run on to the limit (the
    # limit itself is then checked too)
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=tau_slm, reuse_kv=reuse_kv,
                                 max_new_tokens=48, lookahead=lookahead)
    rows = ssd.first_pass(enc.states, drafts, torch.zeros(len(drafts)))
    assert all(r.stage is None for r in rows)
    assert [r.seed is not None for r in rows] == [reuse_kv] * len(rows)
    ssd.fallback(enc.states, rows)
    changed = 0
    for i, (row, f) in enumerate(zip(rows, full)):
        j = len(row.prefix)
        assert row.stage == AR_FALLBACK and j >= 2 and row.draft_tokens[:j] == row.prefix
        assert row.prefix != f[:j]                   # the prefix disagrees with greedy AR
        # the budget counts the prefix, as plain greedy AR's does
        ref = uncached(i, row.prefix, ssd.max_new_tokens - j)
        assert row.tokens == row.prefix + ref
        assert row.generated == len(ref) > 0
        assert row.text == whisper_adapter.text(row.prefix + ref)
        changed += row.tokens != f
    assert changed == len(rows)


def test_greedy_verify_rule_keeps_greedy_ars_text_where_eq5_takes_a_near_miss(whisper_adapter, encoded, uncached):
    """A draft equal to AR's transcript but for one token that the decoder finds likely
    (above tau_slm) and not its argmax: eq. 5 accepts the whole draft (a text greedy AR
    would not write), and an open gate would not even verify it. ``verify_rule`` greedy
    verifies every draft, stops at the near miss and finishes the row as the uncached
    greedy reference does."""
    enc, full = encoded
    tau_slm = 1e-3
    near = []
    for i, f in enumerate(full):
        probs = next_token_probs(whisper_adapter, enc.states[i:i + 1], f[:1]).clone()
        probs[[f[1], whisper_adapter.eot_id]] = 0.0
        near.append(f[:1] + [int(probs.argmax())] + f[2:])
    drafts = [whisper_adapter.text(d) for d in near]
    eq5 = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=tau_slm, max_new_tokens=48)
    taken = [r for r, f in zip(eq5.decode(enc.states, drafts, torch.zeros(len(full))), full)
             if r.stage == LLM_VERIFY and r.tokens != f[:48]]
    assert taken, "no near miss was accepted at tau_slm: the input cannot tell the rules apart"
    # the gate would take every draft (entropy 0 < inf): greedy verification ignores it
    exact = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=math.inf, tau_slm=tau_slm, max_new_tokens=48,
                                   verify_rule="greedy")
    rows = exact.decode(enc.states, drafts, torch.zeros(len(full)))
    for i, row in enumerate(rows):
        assert row.stage == AR_FALLBACK and len(row.prefix) == 1, (i, row.stage, len(row.prefix))
        assert row.tokens == uncached(i, [], 48)
    right = exact.decode(enc.states, _texts(whisper_adapter, full), torch.zeros(len(full)))
    assert [r.stage for r in right] == [LLM_VERIFY] * len(full) and [r.tokens for r in right] == full


def test_greedy_verify_rule_accepts_ars_own_text_whatever_its_probabilities(whisper_adapter, encoded, uncached):
    """Under ``verify_rule`` greedy a token passes where it is the decoder's argmax, at any
    probability: AR's own transcript verifies whole even at a tau_slm that eq. 5 fails on
    (the reference is the uncached greedy decode), so a draft equal to AR's text never
    pays for a fallback."""
    enc, full = encoded
    tau_slm = 0.999
    drafts = _texts(whisper_adapter, full)
    eq5 = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=tau_slm, max_new_tokens=48)
    assert any(r.stage != LLM_VERIFY for r in eq5.first_pass(enc.states, drafts, torch.full((len(full),), 9.0))), \
        "every token of AR's text is above tau_slm: the input cannot tell the rules apart"
    exact = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=tau_slm, max_new_tokens=48,
                                   verify_rule="greedy")
    rows = exact.decode(enc.states, drafts, torch.zeros(len(full)))
    assert [r.stage for r in rows] == [LLM_VERIFY] * len(full)
    for i, row in enumerate(rows):
        assert row.tokens == uncached(i, [], 48)


def test_greedy_verify_rule_refuses_gates_that_accept_other_text():
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.config_values import ConfigError

    assert load_config(None, ["ssd.verify_rule=greedy"]).ssd.verify_rule == "greedy"
    for extra in ("ssd.max_draft_error=0.1", "ssd.pack_gate=true", "ssd.lookahead_rule=tau_slm"):
        with pytest.raises(ConfigError, match=r"ssd\.verify_rule: greedy .* " + extra.split("=")[0].replace(".", r"\.")):
            load_config(None, ["ssd.verify_rule=greedy", extra])


def test_drafts_longer_than_ar_can_write_end_where_ar_ends(whisper_adapter, encoded):
    """Greedy AR stops after max_new_tokens and before the decoder's last position. A
    right draft longer than that budget is not AR's output (a verifier that took it whole
    returns more than AR); one past the position table (a looping draft head on a long
    window) made verification index positions the model lacks (a device-side assert on
    CUDA that poisoned every later batch)."""
    enc, full = encoded
    budget = 5
    ar = greedy_decode(whisper_adapter, enc.states, max_new_tokens=budget)
    assert any(len(f) > budget for f in full)
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=0.3, max_new_tokens=budget)
    rows = ssd.decode(enc.states, _texts(whisper_adapter, full), torch.zeros(len(full)))
    assert [r.tokens for r in rows] == ar
    # a draft longer than the position table: the right transcript repeated past 448 tokens
    i = max(range(len(full)), key=lambda k: len(full[k]))
    looping = full[i] * (whisper_adapter.max_positions // len(full[i]) + 2)
    assert len(looping) > whisper_adapter.max_positions
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=0.3, max_new_tokens=1000)
    row = ssd.decode(enc.states[i:i + 1], [whisper_adapter.text(looping)], torch.zeros(1))[0]
    assert row.tokens == full[i]


def test_good_drafts_are_verified_not_regenerated(whisper_adapter, encoded):
    enc, full = encoded
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=0.0)
    rows = ssd.decode(enc.states, _texts(whisper_adapter, full), torch.zeros(len(full)))
    assert all(r.stage == LLM_VERIFY and r.generated == 0 for r in rows)
    assert [r.tokens for r in rows] == full


def _corrupted_drafts(adapter, full, js):
    bad = adapter.tokenize("zebra")[0]
    return [adapter.text(f[:j] + [bad] + f[j + 1:]) for f, j in zip(full, js)]


def _fallback_rows(adapter, enc, drafts, reuse_kv, drop_cross=False):
    ssd = SelfSpeculativeDecoder(adapter, tau_ctc=0.0, tau_slm=0.01, reuse_kv=reuse_kv)
    rows = ssd.first_pass(enc.states, drafts, torch.zeros(len(drafts)))
    pending = [i for i, r in enumerate(rows) if r.stage is None]
    seeded = [rows[i].seed is not None for i in pending]
    if drop_cross:
        for i in pending:
            rows[i].seed.cross_source = None
    ssd.fallback(enc.states[pending], [rows[i] for i in pending])
    return rows, seeded


def test_verification_seed_equals_prefill_over_prompt_and_prefix(whisper_adapter, encoded):
    """The cropped verification cache is the cache a prefill over prompt + prefix builds,
    and its next token is the one greedy decoding picks first after that prefix."""
    from shardscribe.pipeline.decoding.ar.greedy import seeds_from_cache

    enc, full = encoded
    drafts = [f[:min(len(f), 4)] + [whisper_adapter.tokenize("zebra")[0]] for f in full]
    ver = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm=0.01)
    js = ver.first_reject.tolist()
    assert set(js) - {0}, js  # at least one non-empty prefix
    # Seeds for a subset of rows, out of order: each must come from its own batch row.
    rows = list(range(len(drafts)))[::-2]
    seeds = seeds_from_cache(ver.cache, rows, [int(ver.lead[i]) for i in rows],
                             [ver.prompt_end + js[i] for i in rows], ver.next_token[rows].tolist())
    for i, seed in zip(rows, seeds):
        d, j = drafts[i], js[i]
        seq = list(whisper_adapter.prompt_ids) + d[:j]
        _, cache = whisper_adapter.decoder_hidden(torch.tensor([seq]), enc.states[i:i + 1])
        assert seed.length == len(seq)
        for (k, v), layer in zip(seed.self_kv, cache.self_attention_cache.layers):
            torch.testing.assert_close(k, layer.keys[0], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(v, layer.values[0], atol=1e-4, rtol=1e-4)
        for (k, v), layer in zip(seed.cross_kv, cache.cross_attention_cache.layers):
            torch.testing.assert_close(k, layer.keys[0], atol=1e-4, rtol=1e-4)
        forced = greedy_decode(whisper_adapter, enc.states[i:i + 1], prefixes=[d[:j]], max_new_tokens=1)[0]
        assert seed.next_token == (forced[0] if forced else whisper_adapter.eot_id)


@pytest.mark.parametrize("single", [False, True])
def test_fallback_from_reused_cache_is_exact(whisper_adapter, encoded, single):
    """Eqs. 6-7 with the verification KV cache: the same tokens as the fallback with its own
    prefill, and as full AR forced with the prefix; batched (ragged prefixes j = 0..3) and
    one row at a time; with the cross-attention K/V reused (in-process) or recomputed."""
    enc, full = encoded
    js = [min(i % 4, len(f) - 1) for i, f in enumerate(full)]
    drafts = _corrupted_drafts(whisper_adapter, full, js)
    # Rows 1 and 4 carry their AR transcript: verified, so the rejected rows' seeds come
    # from batch rows that are not their position among the rejected.
    drafts[1], drafts[4] = whisper_adapter.text(full[1]), whisper_adapter.text(full[4])
    parts = [[i] for i in range(len(full))] if single else [list(range(len(full)))]
    for part in parts:
        sub = type(enc)(states=enc.states[part], valid_frames=enc.valid_frames[part])
        sub_drafts = [drafts[i] for i in part]
        plain, seeded_plain = _fallback_rows(whisper_adapter, sub, sub_drafts, reuse_kv=False)
        reused, seeded = _fallback_rows(whisper_adapter, sub, sub_drafts, reuse_kv=True)
        no_cross, _ = _fallback_rows(whisper_adapter, sub, sub_drafts, reuse_kv=True, drop_cross=True)
        assert not any(seeded_plain) and all(seeded) and (seeded or set(part) <= {1, 4})
        for n, i in enumerate(part):
            if i in (1, 4):
                assert reused[n].stage == plain[n].stage == LLM_VERIFY and reused[n].tokens == full[i]
                continue
            assert reused[n].stage == AR_FALLBACK and len(reused[n].prefix) == js[i]
            forced = greedy_decode(whisper_adapter, enc.states[i:i + 1], prefixes=[reused[n].prefix])[0]
            assert reused[n].tokens == plain[n].tokens == no_cross[n].tokens == reused[n].prefix + forced
            assert reused[n].tokens == full[i]


def test_seeded_decode_rejects_mismatched_seeds(whisper_adapter, encoded):
    from shardscribe.pipeline.decoding.ar.greedy import DecodeSeed

    enc, _ = encoded
    kv = [(torch.zeros(6, 5, 64), torch.zeros(6, 5, 64))] * 4
    with pytest.raises(ValueError, match="one seed per row"):
        greedy_decode(whisper_adapter, enc.states[:1], prefixes=[[1, 2]], seeds=[DecodeSeed(kv, 3)])


def test_verify_max_entropy_sends_uncertain_rows_straight_to_ar(whisper_adapter, encoded):
    """Above the ceiling a row skips verification and gets exactly full AR (prefix []);
    below it the row is decoded exactly as without the ceiling; no ceiling = the paper."""
    enc, full = encoded
    js = [min(2, len(f) - 1) for f in full]
    drafts = _corrupted_drafts(whisper_adapter, full, js)
    entropy = torch.tensor([0.5 + 1.5 * (i % 2) for i in range(len(full))])  # 0.5, 2.0, 0.5, ...
    base = SelfSpeculativeDecoder(whisper_adapter, 0.0, 0.01).decode(enc.states, drafts, entropy)
    capped = SelfSpeculativeDecoder(whisper_adapter, 0.0, 0.01, verify_max_entropy=1.0).decode(
        enc.states, drafts, entropy)
    off = SelfSpeculativeDecoder(whisper_adapter, 0.0, 0.01, verify_max_entropy=math.inf).decode(
        enc.states, drafts, entropy)
    assert [(r.stage, r.prefix, r.tokens) for r in off] == [(r.stage, r.prefix, r.tokens) for r in base]
    for i, (b, c) in enumerate(zip(base, capped)):
        if entropy[i] >= 1.0:
            assert c.stage == AR_FALLBACK and c.prefix == [] and c.draft_tokens == [] and c.min_prob is None
            assert c.tokens == full[i]
        else:
            assert (c.stage, c.prefix, c.tokens, c.min_prob) == (b.stage, b.prefix, b.tokens, b.min_prob)
            assert len(c.prefix) == js[i]


def test_ssd_config_keys_are_validated():
    from shardscribe.pipeline.config import ConfigError, load_config

    cfg = load_config("ssd")
    assert cfg.ssd.reuse_kv is True and cfg.ssd.verify_max_entropy is None
    cfg = load_config("ssd", ["ssd.verify_max_entropy=1.5", "ssd.reuse_kv=false"])
    assert cfg.ssd.verify_max_entropy == 1.5 and cfg.ssd.reuse_kv is False
    with pytest.raises(ConfigError, match="ssd.verify_max_entropy"):
        load_config("ssd", ["ssd.verify_max_entropy=-1"])
    with pytest.raises(ConfigError, match="ssd.reuse_kv"):
        load_config("ssd", ["ssd.reuse_kv=maybe"])


def test_fallback_batch_of_seeds_from_several_verification_batches(whisper_adapter, encoded):
    """The in-process fallback re-batches rows across first-pass batches: seeds from
    different verification caches are merged into one batch and stay exact."""
    enc, full = encoded
    js = [min(1 + i % 3, len(f) - 1) for i, f in enumerate(full)]
    drafts = _corrupted_drafts(whisper_adapter, full, js)
    ssd = SelfSpeculativeDecoder(whisper_adapter, tau_ctc=0.0, tau_slm=0.01)
    halves = [list(range(0, len(full), 2)), list(range(1, len(full), 2))]
    rows = {}
    for half in halves:
        for i, r in zip(half, ssd.first_pass(enc.states[half], [drafts[i] for i in half], torch.zeros(len(half)))):
            rows[i] = r
    order = sorted(rows)
    assert all(rows[i].seed is not None for i in order)
    assert len({id(rows[i].seed.cross_source) for i in order}) == 2
    ssd.fallback(enc.states[order], [rows[i] for i in order])
    assert [rows[i].tokens for i in order] == [full[i] for i in order]
    assert [len(rows[i].prefix) for i in order] == [js[i] for i in order]


@pytest.mark.parametrize("chunk", [None, 1, 3, 8])
def test_per_row_accept_tau_equals_two_separate_verifications(whisper_adapter, encoded, chunk):
    """accept_tau (gate verification): acceptance as a pass at each row's own threshold
    would decide it, j and the next token as the pass at tau_slm finds them."""
    enc, full = encoded
    bad = whisper_adapter.tokenize("zebra")[0]
    drafts = [f[:j] + [bad] + f[j + 1:] for f, j in zip(full, [0, 2, 5, 9, 1, 4, 13])]
    drafts[3], drafts[5], drafts[6] = full[3], full[5][:-1], full[6]
    tau_slm = 0.3
    low = torch.tensor([1e-4, 0.3, 1e-6, 1e-4, 0.3, 1e-4, 0.0])
    got = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm, head_chunk=chunk, accept_tau=low)
    at_slm = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm)
    assert got.first_reject.tolist() == at_slm.first_reject.tolist()
    assert got.next_token.tolist() == at_slm.next_token.tolist()
    for i, d in enumerate(drafts):
        alone = verify_drafts(whisper_adapter, enc.states[i:i + 1], [d], float(low[i]))
        assert bool(got.accepted[i]) == bool(alone.accepted[0]), i
    assert got.accepted.any() and not got.accepted.all()
    assert not bool(got.accepted[5])    # incomplete: no threshold accepts it
    assert (got.accepted & ~at_slm.accepted).any()   # some row passes only its lower threshold


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_chunked_verification_head_makes_the_same_decisions(whisper_adapter, encoded, chunk):
    """The output projection in chunks, stopping at each row's first failure, accepts the
    same drafts, with the same j and next token, as the projection over every position."""
    enc, full = encoded
    bad = whisper_adapter.tokenize("zebra")[0]
    drafts = [f[:j] + [bad] + f[j + 1:] for f, j in zip(full, [0, 2, 5, 9, 1, 4, 13])]
    drafts[3] = full[3]          # accepted: every position is computed
    drafts[5] = full[5][:-1]     # incomplete: j = K
    for tau in (0.01, 0.3):
        ref = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm=tau)
        got = verify_drafts(whisper_adapter, enc.states, drafts, tau_slm=tau, head_chunk=chunk)
        assert got.accepted.tolist() == ref.accepted.tolist()
        assert got.first_reject.tolist() == ref.first_reject.tolist()
        assert got.next_token.tolist() == ref.next_token.tolist()
        if tau == 0.01:
            assert ref.accepted[3] and not ref.accepted[5] and ref.first_reject[5] == len(drafts[5])
        for i, d in enumerate(drafts):
            j = int(ref.first_reject[i])
            upto = min(len(d), (j // chunk + 1) * chunk)  # positions in the chunks up to j's
            assert got.token_probs[i, :upto].tolist() == pytest.approx(ref.token_probs[i, :upto].tolist(), abs=1e-5)
            assert got.token_probs[i, upto:len(d)].eq(0).all()
            if j == len(d):  # accepted or incomplete: every position was computed
                # A chunk is a GEMM of another shape, so its float32 rounding differs:
                # same tolerance as the token probabilities above (1e-6 failed on one VM).
                assert float(got.min_prob[i]) == pytest.approx(float(ref.min_prob[i]), abs=1e-5)
            else:
                assert float(got.min_prob[i]) <= tau
