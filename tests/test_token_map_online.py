"""The token map of "Model-free Speculative Decoding for Transformer-based ASR with Token Map
Drafting" built online (token_map.online): the growing map against the offline Algorithm 1
over the same text, its memory bounds, its replay against the decoder's own counts, and
the ar kind and a job drafting from it against plain greedy AR (``--config ar``), text for
text, on the embedded Whisper and the bundled samples said twice, so that later rows
draft from earlier rows' transcripts."""
from __future__ import annotations

import json
import random

import pytest

from conftest import SAMPLES, transcribe_in_process
from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
from shardscribe.pipeline.decoding.drafting.drafters import TokenMapDrafter
from shardscribe.pipeline.decoding.drafting.token_map import END, TokenMap, build_token_map
from shardscribe.pipeline.decoding.drafting.token_map_online import NODES_PER_KEY, OnlineTokenMap, replay_online

COPIES = 2      # a second saying drafts from the first's transcripts


# ---------------------------------------------------------------------------- the map
def _sentences(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    phrases = [[rng.randrange(100, 120) for _ in range(rng.randint(2, 6))] for _ in range(8)]
    return [[t for _ in range(rng.randint(1, 3)) for t in rng.choice(phrases)] for _ in range(n)]


@pytest.mark.parametrize("order,max_len,min_share", [(3, 4, 0.5), (2, 6, 0.0), (1, 3, 0.3)])
def test_learning_in_batches_gives_the_offline_map_of_the_same_text(order, max_len, min_share, monkeypatch):
    """Algorithm 1 run incrementally equals it run once over everything (min_count 1), as
    long as no key forgets (its node bound is tested below)."""
    monkeypatch.setattr("shardscribe.pipeline.decoding.drafting.token_map_online.NODES_PER_KEY", 10**9)
    sents = _sentences(order, 120)
    online = OnlineTokenMap(max_len=max_len, order=order, min_share=min_share)
    for i in range(0, len(sents), 7):
        online.learn(sents[i:i + 7])
        online.candidates(sents[i][:2], 2, max_len, 99)   # ranked mid-way, then stale
    offline = build_token_map(sents, order=order, max_len=max_len, min_count=1, min_share=min_share)
    assert online.keys == len({tuple(s[j - n:j]) for s in sents for j in range(1, len(s) + 1)
                               for n in range(1, min(order, j) + 1)})
    assert {k for k in offline.table} <= {k for k in online._tries}
    for key, cands in offline.table.items():
        assert online.ranked(key) == cands, key
    history = sents[5][:3]
    assert online.candidates(history, 3, max_len, 99) == offline.candidates(history, 3, max_len, 99)
    assert online.rows == len(sents) and online.tokens == sum(map(len, sents))


def test_keys_and_nodes_stay_bounded():
    rng = random.Random(0)
    online = OnlineTokenMap(max_len=4, order=2, max_keys=50)
    for _ in range(40):
        online.learn([[rng.randrange(1000) for _ in range(30)] for _ in range(5)])
    assert online.keys == 50 and online.dropped > 0
    # One key with many distinct followers: its rarest are forgotten, its frequent one stays.
    hub = OnlineTokenMap(max_len=4, order=1)
    for i in range(200):
        hub.learn([[7, 8, 9, 10, 11]] * 2 + [[7, 1000 + i, 2000 + i, 3000 + i]])
    assert hub._tries[(7,)][2] <= NODES_PER_KEY
    assert hub.ranked((7,))[0] == (8, 9, 10, 11)
    assert hub.nodes == sum(e[2] for e in hub._tries.values())


def test_learned_candidates_come_before_the_given_maps():
    base = TokenMap(order=2, table={(5,): [(6, 7)], (4, 5): [(9,)]})
    online = OnlineTokenMap(max_len=4, base=base)
    assert online.order == 2
    assert online.candidates([4, 5], 3, 4, 99) == [[9], [6, 7]]
    online.learn([[4, 5, 8]])
    assert online.candidates([4, 5], 3, 4, 99) == [[8, 99], [9], [6, 7]]
    assert online.ranked((5,)) == [(8, END), (6, 7)]


def test_config_key_is_typed_validated_and_listed():
    cfg = load_config("ar", ["token_map.online=true", "token_map.online_max_keys=100"])
    assert cfg.token_map.online is True and cfg.token_map.online_max_keys == 100
    assert load_config("ar").token_map.online is False
    with pytest.raises(ConfigError, match="token_map.online_max_keys"):
        load_config("ar", ["token_map.online_max_keys=0"])
    with pytest.raises(ConfigError, match="token_map.online"):
        load_config("ar", ["token_map.online=maybe"])
    with pytest.raises(ConfigError, match="token_map.online: drafts for an attention decoder"):
        load_config("ctc_greedy", ["token_map.online=true"])
    with pytest.raises(ConfigError, match="token_map.online: token-map drafting does not apply"):
        load_config("ar", ["token_map.online=true", "model.timestamps=true"])
    from shardscribe.pipeline.config_keys import config_keys

    keys = {k.key: k for k in config_keys()}
    assert keys["token_map.online"].type == "bool" and keys["token_map.online"].comment
    assert keys["token_map.online_max_keys"].type == "int"


# ------------------------------------------------- exactness: Whisper, real audio
@pytest.fixture(scope="module")
def repeated(whisper_adapter, sample_audio, sample_manifest):
    """The bundled samples said COPIES times over, in order; plain greedy AR's tokens."""
    ad = whisper_adapter
    audios = [sample_audio[m["id"]] for m in sample_manifest] * COPIES
    states = ad.encode(audios).states
    return ad, audios, states, greedy_decode(ad, states)


def test_replay_predicts_the_online_decoders_counts(repeated):
    """Decoding batch after batch while the map learns each one makes exactly the passes
    and acceptance the replay computes from plain AR's tokens alone; the output is AR's."""
    ad, _, states, plain = repeated
    batch = 5
    drafter = TokenMapDrafter(OnlineTokenMap(max_len=4), 1, 4)
    truth, out = {}, []
    for i in range(0, states.shape[0], batch):
        got = greedy_decode(ad, states[i:i + batch], drafter=drafter, timer=truth)
        drafter.learn(got)
        out += got
    assert out == plain
    assert truth["tm_accepted"] > 0
    got = replay_online(plain, TokenMapDrafter(OnlineTokenMap(max_len=4), 1, 4), batch, 224, ad.eot_id)
    for key in ("tm_passes", "tm_plain_passes", "tm_rounds", "tm_drafted", "tm_accepted"):
        assert getattr(got, key) == truth.get(key, 0), key
    assert got.pass_ratio > 1.0


@pytest.mark.slow   # three passes over 14 clips: about 30 s
def test_ar_kind_with_an_online_map_drafts_from_earlier_batches_and_equals_plain_ar(repeated):
    from shardscribe.pipeline.kinds.ar.stage import build

    ad, audios, _, _ = repeated
    plain = [r.text for r in build(ad, load_config("ar")).decode(audios)]
    dec = build(ad, load_config("ar", ["token_map.online=true", "token_map.adaptive=false"]))
    n = len(audios) // COPIES
    texts = [r.text for i in range(0, len(audios), n) for r in dec.decode(audios[i:i + n])]
    assert texts == plain
    assert dec.drafting.totals["tm_accepted"] > 0
    assert dec.drafting.token_map.rows == sum(1 for t in plain if t)
    # The adaptive policy (the default) drafts from it too, with the same text.
    adaptive = build(ad, load_config("ar", ["token_map.online=true"]))
    assert [r.text for i in range(0, len(audios), n) for r in adaptive.decode(audios[i:i + n])] == plain
    assert adaptive.drafting.totals["tm_accepted"] > 0


@pytest.mark.slow   # two SSD passes over 14 clips, every row falling back: about 20 s
def test_ssd_fallback_learns_and_stays_exact(ssd_adapter, sample_audio, sample_manifest):
    """SSD's fallback drafts from the online map too; the texts are the plain fallback's."""
    from shardscribe.pipeline.kinds.ssd.stages import build_fallback, build_first_pass

    audios = [sample_audio[m["id"]] for m in sample_manifest] * 2
    n = len(audios) // 2
    texts = {}
    for online in (False, True):
        # every draft rejected at the gate and in verification: all rows fall back
        cfg = load_config("ssd", ["ssd.tau_ctc=0.0", "ssd.max_draft_error=null", "ssd.adaptive_verify=false",
                                  f"token_map.online={str(online).lower()}", "token_map.adaptive=false"])
        first = build_first_pass(ssd_adapter, cfg)
        second = build_fallback(cfg, first)
        out = []
        for i in range(0, len(audios), n):
            res = first.decode(audios[i:i + n])
            second.finish([r for r in res if r.pending is not None])
            out += [r.text for r in res]
        texts[online] = out
        if online:
            assert first.ssd.map_drafting.totals["tm_accepted"] > 0
    assert texts[True] == texts[False]


@pytest.mark.slow
def test_job_with_an_online_map_writes_ar_text_and_reports_the_map(tmp_path):
    """Two jobs on the local runner (jobs.cli.main in this process), `--config ar` and
    `--config ar --set token_map.online=true`, on the samples said twice (seven recordings a batch):
    the same text for every id, and the summary reports the map replayed on the job's own
    text, with drafts accepted and a bound above 1."""
    rows = [json.loads(line) for line in (SAMPLES / "samples.jsonl").read_text().splitlines()]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({**r, "id": f"{r['id']}-{c}", "audio": str(SAMPLES / r["audio"])}) + "\n"
                                for c in range(COPIES) for r in rows))
    common = ["--input", str(manifest), "--runner", "local", "--quiet", "--set", "batching.recordings_per_batch=7"]
    _, plain = transcribe_in_process(tmp_path / "ar", *common, "--config", "ar")
    summary, online = transcribe_in_process(tmp_path / "online", *common, "--config", "ar",
                                            "--set", "token_map.online=true")
    assert {i: r["text"] for i, r in online.items()} == {i: r["text"] for i, r in plain.items()}
    report = summary["token_map_online"]
    assert report["replayed_segments"] == len(rows) * COPIES and report["batch"] == 7
    assert report["map"]["keys"] > 0 and report["accepted"] > 0
    assert report["always_right_pass_ratio"] >= report["pass_ratio"] > 1.0


@pytest.mark.slow
def test_bench_online_rows_equal_ar_and_report_the_online_bound(tmp_path, model_cache):
    """`bench token-map --online` on the samples said twice: the online rows' tokens equal
    plain AR's, drafts are accepted, and the online map's bound is reported (>= 1, at most
    the always-right map's). No timing is asserted."""
    from shardscribe.jobs.cli import main

    out = tmp_path / "tm.json"
    assert main(["bench", "token-map", "--sets", "samples", "--copies", "2", "--online", "--map-sentences", "200",
                 "--repeat", "1", "--set", f"model.cache_dir={model_cache}", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    s = result["summary"]["samples"]
    assert s["identical"] and s["segments"] == 14
    assert s["online"]["always_A_l"] > 0
    replay = s["replay"]
    assert replay["oracle"]["4"]["bound"] >= replay["online"]["bound"] >= 1.0
    assert {"online map K=1 adaptive", "online map K=1 always"} <= {r["config"] for r in result["rows"]}
