"""Token-map drafting ("Model-free Speculative Decoding for Transformer-based ASR with Token
Map Drafting"): the map against a brute-force count of the text it was built from, and
drafted greedy decoding against plain greedy decoding, token for token, on real audio
with the embedded Whisper (the bundled samples and held-out TTS speech) and on a tiny
random granite-speech (whose plain greedy output the granite tests check against
transformers' own forward), batched and one row at a time, for maps of order 1-4, K 1-4,
a random map and an oracle map."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
from shardscribe.pipeline.decoding.drafting.drafters import TokenMapDrafter
from shardscribe.pipeline.decoding.ssd.decoder import SelfSpeculativeDecoder
from shardscribe.pipeline.decoding.drafting.token_map import END, TokenMap, build_token_map
from shardscribe.pipeline.decoding.drafting.token_map_replay import oracle, replay_drafting
from shardscribe.pipeline.decoding.drafting.token_map_policy import DraftPolicy
from conftest import full_product_greedy
from test_granite_adapter import MAX_NEW as GRANITE_MAX_NEW
from test_granite_adapter import setup  # noqa: F401 - the tiny granite fixture

# ------------------------------------------------------------------------- the map itself


def _occurrences(sentences, key):
    """Every continuation (to the sentence's END) that follows ``key`` in ``sentences``."""
    out = []
    for s in sentences:
        seq = list(s) + [END]
        for i in range(len(key), len(seq)):
            if tuple(seq[i - len(key):i]) == key:
                out.append(tuple(seq[i:]))
    return out


def test_map_candidates_are_counted_continuations_ranked_by_count_sum():
    rng = random.Random(0)
    vocab = [10, 11, 12, 13, 14]
    sentences = [[rng.choice(vocab) for _ in range(rng.randint(2, 7))] for _ in range(200)]
    m = build_token_map(sentences, order=2, max_len=4, min_count=3, keep=3, min_share=0.0)
    assert m.table
    for key, cands in m.table.items():
        occ = _occurrences(sentences, key)
        assert len(occ) >= 3
        prefixes = Counter(c[:d] for c in occ for d in range(1, min(4, len(c)) + 1))
        for cand in cands:
            # every prefix of a candidate follows the key at least min_count times
            assert all(prefixes[cand[:d]] >= 3 for d in range(1, len(cand) + 1))
        # The first candidate has the highest count sum over its prefixes among all paths
        # of pruned nodes (brute force over every surviving continuation).
        best = max(sum(prefixes[p[:d]] for d in range(1, len(p) + 1))
                   for p in prefixes if prefixes[p] >= 3)
        assert sum(prefixes[cands[0][:d]] for d in range(1, len(cands[0]) + 1)) == best
    # Keys shorter than the order exist, none longer.
    assert {len(k) for k in m.table} == {1, 2}


def test_lookup_takes_the_longest_key_first_cuts_at_end_and_drops_duplicates(tmp_path):
    m = TokenMap(order=2, table={(5,): [(6, 7), (8,)], (4, 5): [(6, 7, END, 9), (6,)]})
    assert m.candidates([1, 4, 5], k=4, max_draft=8, eot=99) == [[6, 7, 99], [6], [6, 7], [8]]
    assert m.candidates([1, 4, 5], k=2, max_draft=2, eot=99) == [[6, 7], [6]]
    assert m.candidates([3, 5], k=4, max_draft=1, eot=99) == [[6], [8]]
    assert m.candidates([], k=4, max_draft=8, eot=99) == []
    m.save(tmp_path / "m.safetensors")
    back = TokenMap.load(tmp_path / "m.safetensors")
    assert back.table == m.table and back.order == 2


def test_min_share_prunes_rare_followers():
    sentences = [[1, 2, 3]] * 8 + [[1, 4, 5]] * 2
    assert build_token_map(sentences, order=1, min_count=1, keep=2, min_share=0.0).table[(1,)] == [(2, 3, END), (4, 5, END)]
    assert build_token_map(sentences, order=1, min_count=1, keep=2, min_share=0.3).table[(1,)] == [(2, 3, END)]


def test_build_token_map_cli_writes_a_loadable_map(tmp_path):
    from shardscribe.jobs.cli import main

    text = tmp_path / "domain.txt"
    text.write_text("Replace the pump filter.\nReplace the pump belt.\nReplace the pump filter.\n\n")
    out = tmp_path / "map.safetensors"
    assert main(["build-token-map", "--text", str(text), "--tokenizer", "embedded", "--order", "2",
                 "--output", str(out)]) == 0
    m = TokenMap.load(out)
    assert m.order == 2 and m.meta["sentences"] == 3
    from shardscribe.pipeline.models.transcript_tokens import load_transcript_tokenizer

    ids = load_transcript_tokenizer("embedded").encode("Replace the pump filter.")
    assert m.candidates(ids[:2], 1, 16, eot=-7)[0] == ids[2:] + [-7]
    assert main(["build-token-map", "--text", str(tmp_path / "missing.txt"), "--output", str(out)]) == 1


# --------------------------------------------------------------------- the config keys
def test_config_checks_the_token_map_before_any_worker(tmp_path):
    good = tmp_path / "m.safetensors"
    build_token_map([[1, 2, 3]] * 2).save(good)
    cfg = load_config("ar", [f"decoder.token_map={good}", "token_map.candidates=3"])
    assert cfg.token_map.candidates == 3 and cfg.decoder.token_map == str(good)
    with pytest.raises(ConfigError, match="decoder.token_map: .* does not exist"):
        load_config("ar", [f"decoder.token_map={tmp_path / 'nope'}"])
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a map")
    with pytest.raises(ConfigError, match="is not a token map"):
        load_config("ar", [f"decoder.token_map={bad}"])
    with pytest.raises(ConfigError, match="decoder.kind=ctc_greedy has none"):
        load_config("ctc_greedy", [f"decoder.token_map={good}"])
    with pytest.raises(ConfigError, match="token_map.max_draft"):
        load_config("ar", ["token_map.max_draft=0"])
    with pytest.raises(ConfigError, match="verifies greedily"):
        load_config("ssd", [f"decoder.token_map={good}", "ssd.lookahead=2", "ssd.lookahead_rule=tau_slm"])


# ------------------------------------------------------------------------ the policy
def test_policy_drafts_first_stops_below_break_even_and_probes():
    policy = DraftPolicy(half_life=1e9, probe_every=4, prior_gain=3.0, prior_weight=4.0)
    assert policy.should_draft()          # optimistic prior
    policy.observe(True, seconds=2.0, rows=8, decided=8)      # nothing accepted
    policy.observe(False, seconds=1.0, rows=8, decided=8)
    # gain (8 + 12) / 12 = 1.67 < cost 2.0: drafting does not pay
    assert policy.gain() == pytest.approx(20 / 12) and policy.cost() == pytest.approx(2.0)
    choices = [policy.should_draft() for _ in range(10)]
    assert choices == [False] * 4 + [True] + [False] * 4 + [True]   # a probe after four plain passes
    policy.observe(True, seconds=2.0, rows=8, decided=40)   # now 4 tokens accepted per row
    assert policy.should_draft()


# ------------------------------------------------------- exactness: Whisper, real audio
@pytest.fixture(scope="module")
def whisper_set(whisper_adapter, sample_audio, sample_manifest):
    """The bundled samples and held-out TTS speech (maintenance sentences and prose, voices
    the CTC head never heard), encoded; plain greedy tokens; texts to build maps from."""
    from shardscribe.jobs.bench.data import heldout_voice_speech
    from shardscribe.pipeline.training.tts.domain_text import domain_sentences

    ad = whisper_adapter
    domain = domain_sentences(300, 5)
    held = domain[:1] + [{"text": "Spawn an external command.", "spoken": "Spawn an external command."}]
    audios = [sample_audio[m["id"]] for m in sample_manifest] + [a for _, a in heldout_voice_speech(held, 3)]
    states = ad.encode(audios).states
    plain = full_product_greedy(ad, states)     # drafting walks its trees through the screen
    texts = [m["text"] for m in sample_manifest] + [d["text"] for d in domain[1:]]
    return ad, states, plain, [ad.tokenize(t) for t in texts]


@pytest.mark.parametrize("order,k", [(1, 4), (2, 3), (3, 2), (4, 1)])
def test_drafted_greedy_equals_plain_greedy_on_whisper(whisper_set, order, k):
    ad, states, plain, tokenised = whisper_set
    m = build_token_map(tokenised, order=order, min_count=1, min_share=0.0)
    timer = {}
    got = greedy_decode(ad, states, drafter=TokenMapDrafter(m, k, 6), timer=timer)
    assert got == plain
    assert timer["tm_accepted"] > 0   # the drafts were used, not just proposed


def test_random_and_oracle_maps_and_token_limits_on_whisper(whisper_set):
    ad, states, plain, _ = whisper_set
    rng = random.Random(1)
    # Random: frequent real tokens followed by random ones, so candidates fire and fail.
    firsts = [p[:2] for p in plain]
    noise = [f + [rng.randrange(ad.vocab_size) for _ in range(6)] for f in firsts for _ in range(2)]
    rand = build_token_map(noise, order=2, min_count=1, min_share=0.0)
    assert greedy_decode(ad, states, drafter=TokenMapDrafter(rand, 4, 8)) == plain
    # Oracle: built from the output itself (drafts run into end-of-text).
    oracle = build_token_map(plain, order=3, min_count=1, min_share=0.0)
    timer = {}
    assert greedy_decode(ad, states, drafter=TokenMapDrafter(oracle, 2, 16), timer=timer) == plain
    assert timer["tm_accepted"] / timer["tm_drafted"] > 0.5
    limit = 3
    assert greedy_decode(ad, states, max_new_tokens=limit, drafter=TokenMapDrafter(oracle, 2, 16)) == \
        greedy_decode(ad, states, max_new_tokens=limit)


@pytest.mark.parametrize("order,k,max_draft,batch,limit", [(2, 4, 6, 4, 224), (1, 2, 8, 5, 7)])
def test_replay_predicts_the_decoders_passes_and_acceptance(whisper_set, order, k, max_draft, batch, limit):
    """The replay (pipeline.decoding.drafting.token_map_replay) works from plain AR's tokens alone;
    its pass and acceptance counts must be the ones the decoder's tree walk records,
    batch by batch, token limit included."""
    ad, states, plain, tokenised = whisper_set
    m = build_token_map(tokenised, order=order, min_count=1, min_share=0.0)
    md = TokenMapDrafter(m, k, max_draft)
    truth = {}
    for i in range(0, states.shape[0], batch):
        greedy_decode(ad, states[i:i + batch], max_new_tokens=limit, drafter=md, timer=truth)
    ar = [t[:limit] for t in plain]
    got = replay_drafting(ar, lambda _, h, room: md.propose(h, room, ad.eot_id, None), batch, limit, ad.eot_id)
    assert truth["tm_accepted"] > 0
    for key in ("tm_passes", "tm_plain_passes", "tm_rounds", "tm_drafted", "tm_accepted"):
        assert getattr(got, key) == truth.get(key, 0), key
    assert got.passes == got.tm_passes + got.tm_plain_passes + -(-states.shape[0] // batch)
    assert got.ar_passes == sum(max(len(t) + (len(t) < limit) for t in ar[i:i + batch])
                                for i in range(0, len(ar), batch))
    # A map that is always right decides max_draft + 1 tokens a pass after the prefill.
    right = oracle(ar, max_draft, batch, limit, ad.eot_id)
    if limit > max(len(t) for t in ar) + max_draft:
        assert right.passes == sum(max(1 - (-(len(t)) // (max_draft + 1)) for t in ar[i:i + batch])
                                   for i in range(0, len(ar), batch))
    assert right.pass_ratio > got.pass_ratio >= 1.0


def test_rows_alone_and_forced_prefixes_on_whisper(whisper_set):
    ad, states, plain, tokenised = whisper_set
    m = build_token_map(tokenised, order=3, min_count=1, min_share=0.0)
    for i in (0, states.shape[0] - 1):   # a bundled sample and a held-out domain clip
        alone = greedy_decode(ad, states[i:i + 1])
        assert greedy_decode(ad, states[i:i + 1], drafter=TokenMapDrafter(m, 2, 8)) == alone
    some = [0, 2, 4, states.shape[0] - 1]
    prefixes = [plain[i][:n % 3 + 1] for n, i in enumerate(some)]
    assert greedy_decode(ad, states[some], prefixes=prefixes, drafter=TokenMapDrafter(m, 2, 8, DraftPolicy())) == \
        greedy_decode(ad, states[some], prefixes=prefixes)


def test_ssd_fallback_with_both_draft_sources_equals_the_plain_fallback(whisper_adapter, whisper_set):
    ad, states, plain, tokenised = whisper_set
    m = build_token_map(tokenised, order=3, min_count=1, min_share=0.0)
    rows_used = [1, 3, states.shape[0] - 2, states.shape[0] - 1]
    texts = [ad.text(plain[i]) for i in rows_used]
    # Damaged drafts (every third word dropped) fail verification part-way.
    drafts = [" ".join(w for j, w in enumerate(t.split()) if j % 3 != 2) for t in texts]
    outs = []
    for lookahead, md in ((0, None), (4, TokenMapDrafter(m, 2, 8, map_first=True)),
                          (4, TokenMapDrafter(m, 2, 8, map_first=False))):
        ssd = SelfSpeculativeDecoder(ad, 0.0, 0.5, lookahead=lookahead, map_drafting=md)
        rows = ssd.decode(states[rows_used], drafts, torch.ones(len(drafts)))
        outs.append([r.tokens for r in rows])
    assert all(o == outs[0] for o in outs[1:])


# ------------------------------------------------------ exactness: tiny granite-speech
def test_drafted_greedy_equals_plain_greedy_on_granite(setup):  # noqa: F811
    ad, states, full = setup["adapter"], setup["states"], setup["full"]
    rng = random.Random(2)
    oracle = [f for f in full if f]
    rand = [[rng.randrange(5, len(setup["tok"])) for _ in range(8)] for _ in range(20)]
    for order in (1, 2, 3, 4):
        for k, source in ((order, oracle), (5 - order, rand + oracle)):
            m = build_token_map(source, order=order, min_count=1, min_share=0.0)
            got = greedy_decode(ad, states, max_new_tokens=GRANITE_MAX_NEW, drafter=TokenMapDrafter(m, k, 6))
            assert got == full
    m = build_token_map(oracle, order=3, min_count=1, min_share=0.0)
    for i in range(states.shape[0]):
        got = greedy_decode(ad, states[i:i + 1], max_new_tokens=GRANITE_MAX_NEW, drafter=TokenMapDrafter(m, 2, 6))
        assert got == [full[i]]


def test_ar_decoder_kind_drafts_from_the_configured_map(tmp_path, whisper_adapter, sample_audio):
    from shardscribe.pipeline.kinds.ar.stage import build

    path = tmp_path / "m.safetensors"
    build_token_map([whisper_adapter.tokenize("The quick brown fox jumps over the lazy dog.")] * 2).save(path)
    cfg = load_config("ar", [f"decoder.token_map={path}"])
    dec = build(whisper_adapter, cfg)
    assert dec.drafting is not None and isinstance(dec.drafting.policy, DraftPolicy)
    audio = [sample_audio["fox_flite_slt"]]
    plain = build(whisper_adapter, load_config("ar")).decode(audio)
    assert [r.text for r in dec.decode(audio)] == [r.text for r in plain]
    # A map built with another tokenizer is refused by name.
    TokenMap(order=1, table={(1,): [(whisper_adapter.vocab_size + 5,)]}).save(path)
    with pytest.raises(ValueError, match="beyond the model's vocabulary"):
        build(whisper_adapter, cfg)


def test_golden_config_keys_default_off():
    cfg = load_config("ar")
    assert cfg.decoder.token_map is None
    assert json.loads(json.dumps(cfg.to_dict()))["token_map"]["candidates"] >= 1


@pytest.mark.slow
def test_bench_reports_the_replay_bounds_beside_the_measured_rows(tmp_path, capsys, model_cache):
    """`bench token-map` on a few domain clips: every drafted row equals AR, and the bound
    rows order as they must (the right map's >= the best map's >= the main map's >= 1).
    No timing is asserted."""
    from shardscribe.jobs.cli import main

    out = tmp_path / "tm.json"
    assert main(["bench", "token-map", "--domain", "6", "--sets", "domain", "--map-sentences", "400",
                 "--repeat", "1", "--sweep-k", "2", "--sweep-n", "2", "--set", f"model.cache_dir={model_cache}",
                 "--out", str(out)]) == 0
    assert "summary:" in capsys.readouterr().out
    result = json.loads(out.read_text())
    s = result["summary"]["domain"]
    assert s["identical"]
    replay = s["replay"]
    assert replay["step_cost"]["per_pass_s"] >= 0 and replay["step_cost"]["per_row_s"] >= 0
    assert replay["oracle"]["16"]["bound"] >= replay["best"]["bound"] >= replay["main"]["bound"] >= 1.0
    assert replay["best"]["max_pass_ratio"] >= replay["best"]["pass_ratio"]
    bounds = [r for r in result["rows"] if r["config"].startswith("bound")]
    assert [r["speedup"] for r in bounds[:2]] == [replay["main"]["bound"], replay["best"]["bound"]]
    assert out.with_suffix(".png").stat().st_size > 10_000
