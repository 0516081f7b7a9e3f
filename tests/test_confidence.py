"""Word, segment and row confidence (pipeline.confidence):

- the metrics against hand-computed values (ECE, NCE) and a pair count (AUC-ROC);
- the entropy measures of "Fast Entropy-Based Methods of Word-Level Confidence Estimation
  for End-to-End Automatic Speech Recognition" at their end points and against scipy's
  Shannon entropy;
- word labels, agreement and the N-best posterior on hand-aligned examples;
- the calibration's JSON round trip equals scikit-learn's own predictions;
- the embedded Whisper's confidence of a deliberately wrong word is low and of the words
  it heard is high;
- the job's rows carry confidences for every decoder kind (embedded model; tiny random CTC
  and transducer checkpoints), an error row none, in the output schema.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import ROOT


# ----------------------------------------------------------------------------- metrics
def test_ece_and_nce_against_hand_computed_values():
    from shardscribe.pipeline.confidence.evaluation import ece, nce, scores

    conf = [0.95, 0.9, 0.15, 0.25, 0.6]
    correct = [True, False, False, True, True]
    # 10 bins: [0.9,1.0]: {0.95 T, 0.9 F} acc 0.5 conf 0.925; [0.1,0.2): {0.15 F} acc 0 conf 0.15;
    # [0.2,0.3): {0.25 T} acc 1 conf 0.25; [0.6,0.7): {0.6 T} acc 1 conf 0.6.
    want_ece = (2 / 5) * 0.425 + (1 / 5) * 0.15 + (1 / 5) * 0.75 + (1 / 5) * 0.4
    assert ece(conf, correct) == pytest.approx(want_ece)
    p = 3 / 5
    h = -(3 * math.log(p) + 2 * math.log(1 - p))
    h_c = -(math.log(0.95) + math.log(0.25) + math.log(0.6) + math.log(1 - 0.9) + math.log(1 - 0.15))
    assert nce(conf, correct) == pytest.approx((h - h_c) / h)
    # AUC-ROC of detecting wrong words: the share of (wrong, right) pairs where the wrong
    # word has the lower confidence: wrong {0.9, 0.15} vs right {0.95, 0.25, 0.6}: 0.9 is
    # below 0.95 only (1 of 3), 0.15 below all three -> 4 / 6.
    assert scores(conf, correct)["auc_roc"] == pytest.approx(4 / 6)


def test_ece_of_a_calibrated_confidence_against_its_exact_expectation():
    """Consistency resampling against the expectation summed over every label outcome:
    {0.95, 0.9} share the last bin (both right 0.855: |1 - 0.925|; one right 0.14: 0.425;
    none 0.005: 0.925), {0.15} is alone in its bin (E|y - 0.15| = 2 x 0.15 x 0.85)."""
    from shardscribe.pipeline.confidence.evaluation import ece_if_calibrated

    last_bin = 0.855 * 0.075 + 0.14 * 0.425 + 0.005 * 0.925
    want = (2 / 3) * last_bin + (1 / 3) * (2 * 0.15 * 0.85)
    mean, p95 = ece_if_calibrated([0.95, 0.9, 0.15], draws=40000, seed=1)
    assert mean == pytest.approx(want, abs=0.004)
    assert p95 > mean


def test_entropy_measures_at_their_end_points_and_against_shannon():
    from scipy.stats import entropy as shannon

    from shardscribe.pipeline.confidence.measures import confidence, entropy

    v = 7
    uniform = torch.full((1, v), -math.log(v))
    certain = torch.log(torch.tensor([[1.0 - 6e-30] + [1e-30] * 6], dtype=torch.float64))
    for measure in ("max_prob", "gibbs", "tsallis", "renyi"):
        for norm in ("lin", "exp"):
            assert confidence(uniform, measure, 1 / 3, norm).item() == pytest.approx(0.0, abs=1e-6)
            assert confidence(certain, measure, 1 / 3, norm).item() == pytest.approx(1.0, abs=1e-3)
    p = torch.tensor([[0.5, 0.2, 0.1, 0.1, 0.05, 0.03, 0.02]], dtype=torch.float64)
    want = shannon(p[0].numpy())
    for measure in ("gibbs", "tsallis", "renyi"):     # alpha -> 1: Shannon's entropy
        assert entropy(p.log(), measure, 1.0).item() == pytest.approx(want, rel=1e-6)
    assert entropy(p.log(), "tsallis", 1.0 + 1e-5).item() == pytest.approx(want, rel=1e-4)
    assert entropy(p.log(), "renyi", 1.0 + 1e-5).item() == pytest.approx(want, rel=1e-4)
    # Shannon's exponential normalisation is (V exp(-H) - 1) / (V - 1).
    assert confidence(p.log(), "gibbs", 1.0, "exp").item() == pytest.approx((v * math.exp(-want) - 1) / (v - 1))


def test_word_labels_agreement_and_nbest_posterior():
    from shardscribe.pipeline.confidence.evaluation import utterance_correct, word_labels
    from shardscribe.pipeline.confidence.words import agreement, nbest_posterior, token_word_index

    assert word_labels(["The", "bat", "sat,", "down", "—"], "the cat sat") == [True, False, True, False, None]
    assert utterance_correct("The cat, sat.", "the cat sat") and not utterance_correct("the cat", "the cat sat")
    assert agreement(["the", "quick", "fox", "jumps"], "the quack fox jumps high") == [1.0, 0.0, 1.0, 1.0]
    post, best = nbest_posterior(["a", "b", "c"], ["a b c", "a x c", "a b"], [0.0, math.log(0.5), math.log(0.5)])
    # softmax of (0, log .5, log .5) = (.5, .25, .25): a in all, b in 1st and 3rd, c in 1st and 2nd
    assert best == pytest.approx(0.5) and post == pytest.approx([1.0, 0.75, 0.75])
    pieces = {1: " Hello", 2: ",", 3: " wor", 4: "ld"}
    assert token_word_index(lambda ids: "".join(pieces[i] for i in ids), [1, 2, 3, 4]) == [0, 0, 1, 1]


def test_word_features_carry_their_neighbours_weakest_token():
    """Three words from five tokens (probabilities by hand): each word's neighbour
    features are the adjacent words' min token probability, 1.0 past the segment's ends."""
    from shardscribe.pipeline.confidence.words import aggregate

    prob = np.array([0.9, 0.4, 0.8, 0.7, 0.2])
    feats = aggregate({"prob": prob}, [0, 0, 1, 2, 2], 3)
    assert [f["prob_min"] for f in feats] == [0.4, 0.8, 0.2]
    assert [f["prev_prob_min"] for f in feats] == [1.0, 0.4, 0.8]
    assert [f["next_prob_min"] for f in feats] == [0.8, 0.2, 1.0]
    assert [f["ctx_min"] for f in feats] == [0.8, 0.2, 0.8]
    one = aggregate({"prob": np.array([0.5])}, [0], 1)[0]
    assert (one["prev_prob_min"], one["next_prob_min"], one["ctx_min"]) == (1.0, 1.0, 1.0)


def test_calibration_round_trip_equals_scikit_learn(tmp_path):
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    from shardscribe.jobs.calibrate import fit_map
    from shardscribe.pipeline.confidence.calibration import FORMAT, Calibration

    rng = np.random.default_rng(0)
    n = 400
    x = rng.normal(size=(n, 2))
    y = rng.random(n) < 1 / (1 + np.exp(-(2 * x[:, 0] - x[:, 1])))
    rows = [{"a": float(a), "b": float(b)} for a, b in x]
    cal = Calibration({"family": "f"}, {"k:s": fit_map(rows, y.tolist(), isotonic=True)}, {}, {})
    cal.save(tmp_path / "cal.json")
    assert json.loads((tmp_path / "cal.json").read_text())["format"] == FORMAT
    back = Calibration.load(tmp_path / "cal.json").word["k:s"]
    # scikit-learn, independently: standardise, logistic regression, isotonic on its output
    z = (x - x.mean(0)) / x.std(0)
    lr = LogisticRegression(C=1.0, max_iter=2000).fit(z, y)
    p = lr.predict_proba(z)[:, 1]
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(p, y)
    probe = rng.normal(size=(50, 2)) * 2
    want = iso.predict(lr.predict_proba((probe - x.mean(0)) / x.std(0))[:, 1])
    got = back([{"a": float(a), "b": float(b)} for a, b in probe])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_calibration_keeps_the_isotonic_step_only_where_it_pays():
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    from shardscribe.jobs.calibrate import fit_map

    rng = np.random.default_rng(3)
    # plateaus a logistic curve cannot follow: P(correct) 0.02, 0.5, 0.98 over three ranges
    x = rng.normal(size=2000) * 1.5
    y = rng.random(2000) < np.where(x < -1, 0.02, np.where(x > 1, 0.98, 0.5))
    steps = fit_map([{"a": float(v)} for v in x], y.tolist())
    z = ((x - x.mean()) / x.std())[:, None]
    lr = LogisticRegression(C=1.0, max_iter=2000).fit(z, y)
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(lr.predict_proba(z)[:, 1], y)
    probe = np.linspace(-3, 3, 25)
    pz = ((probe - x.mean()) / x.std())[:, None]
    np.testing.assert_allclose(steps([{"a": float(v)} for v in probe]), iso.predict(lr.predict_proba(pz)[:, 1]),
                               atol=1e-9)
    assert steps([{"a": 0.0}])[0] == pytest.approx(0.5, abs=0.08)     # the middle plateau
    # a truly logistic relation on 120 items: the isotonic steps would only fit the noise
    x2 = rng.normal(size=(120, 2))
    y2 = rng.random(120) < 1 / (1 + np.exp(-(2 * x2[:, 0] - x2[:, 1])))
    smooth = fit_map([{"a": float(a), "b": float(b)} for a, b in x2], y2.tolist())
    z2 = (x2 - x2.mean(0)) / x2.std(0)
    lr2 = LogisticRegression(C=1.0, max_iter=2000).fit(z2, y2)
    probe2 = rng.normal(size=(30, 2)) * 2
    np.testing.assert_allclose(smooth([{"a": float(a), "b": float(b)} for a, b in probe2]),
                               lr2.predict_proba((probe2 - x2.mean(0)) / x2.std(0))[:, 1], rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------- a real decoder
def test_a_wrong_word_gets_a_low_confidence(whisper_adapter, sample_audio):
    from shardscribe.pipeline.confidence.apply import ConfidenceScorer
    from shardscribe.pipeline.confidence.calibration import EMBEDDED_PATH, Calibration
    from shardscribe.pipeline.confidence.features import decoder_words
    from shardscribe.pipeline.kinds import decoder_kind

    ad = whisper_adapter
    audio = sample_audio["pump_flite_rms"]
    states = ad.encode([audio]).states
    right = ad.tokenize("Please replace the pump filter before Monday morning.")
    wrong = ad.tokenize("Please replace the banana filter before Monday morning.")
    (w_right, f_right), (w_wrong, f_wrong) = decoder_words(ad, torch.cat([states, states]), [right, wrong])
    assert [w["word"] for w in w_wrong][3] == "banana"
    assert f_wrong[3]["prob_mean"] < 0.01 < 0.5 < f_right[3]["prob_mean"]
    # An entropy measure reads the distribution that predicted the word, the same for both
    # (the same prefix): only the emitted token's probability tells them apart there.
    assert f_wrong[3]["tsallis_mean"] == pytest.approx(f_right[3]["tsallis_mean"])
    assert np.mean([f["prob_mean"] for f in f_right]) > 0.8
    scorer = ConfidenceScorer(Calibration.load(EMBEDDED_PATH), decoder_kind("ar"))
    c_right, c_wrong = scorer.words("ar", f_right), scorer.words("ar", f_wrong)
    assert c_wrong[3] < 0.3 < 0.7 < c_right[3]
    assert scorer.utterance(c_wrong) < scorer.utterance(c_right)


def test_the_confidence_pass_reusing_greedys_cross_attention_scores_the_same(whisper_adapter, sample_audio):
    """``ar`` hands greedy decoding's cross-attention K/V to the confidence pass: every
    measure of every token is the same as from a pass that projects the encoder states
    itself, on a batch of clips of different lengths and texts."""
    from shardscribe.pipeline.confidence.scores import decoder_token_scores
    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode

    ad = whisper_adapter
    audios = [sample_audio[k] for k in ("pump_flite_rms", "fox_flite_slt", "coffee_espeak_en_us")]
    states = ad.encode(audios).states
    cross = []
    tokens = greedy_decode(ad, states, cross_out=cross)
    assert len(cross) == ad.model.config.decoder_layers and cross[0][0].shape[0] == len(audios)
    assert len({len(t) for t in tokens}) > 1          # rows ended at different steps
    plain = decoder_token_scores(ad, states, tokens)
    reused = decoder_token_scores(ad, states, tokens, cross_kv=cross)
    for a, b in zip(plain, reused):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    # the K/V handed over are the ones that matter: other rows' K/V change the scores
    swapped = [(k.flip(0), v.flip(0)) for k, v in cross]
    assert not np.array_equal(decoder_token_scores(ad, states, tokens, cross_kv=swapped)[0]["prob"], plain[0]["prob"])


@pytest.mark.parametrize("seeds_carry_cross", [True, False])
def test_ssd_fallback_hands_its_cross_attention_to_the_confidence_pass(whisper_adapter, sample_audio,
                                                                      seeds_carry_cross):
    """SSD's fallback decodes seeded rows (verified prefixes; their seeds carry the
    verification's cross-attention K/V in-process, or not, as from another process) and
    plain ones (an empty draft) in two groups; the K/V it leaves, put back in row order,
    give the confidence pass the scores it computes by projecting them itself."""
    from shardscribe.pipeline.confidence.scores import decoder_token_scores
    from shardscribe.pipeline.decoding.ssd.decoder import SelfSpeculativeDecoder

    ad = whisper_adapter
    keys = ("pump_flite_rms", "fox_flite_slt", "coffee_espeak_en_us", "lights_festival_kal")
    states = ad.encode([sample_audio[k] for k in keys]).states
    drafts = ["Please replace the banana filter before Monday.", "", "The quick brown cat", "Turn off the"]
    ssd = SelfSpeculativeDecoder(ad, tau_ctc=0.0, tau_slm=0.3)
    rows = ssd.first_pass(states, drafts, torch.full((len(drafts),), 5.0))
    pending = [i for i, r in enumerate(rows) if r.stage is None]
    assert pending == [0, 1, 2, 3], [r.stage for r in rows]
    assert rows[1].seed is None and all(rows[i].seed is not None for i in (0, 2, 3))
    if not seeds_carry_cross:
        for i in (0, 2, 3):
            rows[i].seed.cross_source = None
    cross = []
    done = ssd.fallback(states[pending], [rows[i] for i in pending], cross_out=cross)
    assert len(cross) == ad.model.config.decoder_layers and cross[0][0].shape[0] == len(pending)
    tokens = [r.tokens for r in done]
    # handing the K/V over changes nothing in the decoding itself
    again = ssd.first_pass(states, drafts, torch.full((len(drafts),), 5.0))
    if not seeds_carry_cross:
        for i in (0, 2, 3):
            again[i].seed.cross_source = None
    assert [r.tokens for r in ssd.fallback(states[pending], [again[i] for i in pending])] == tokens
    plain = decoder_token_scores(ad, states[pending], tokens)
    reused = decoder_token_scores(ad, states[pending], tokens, cross_kv=cross)
    for a, b in zip(plain, reused):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


# --------------------------------------------------------------------- the job's rows
def _run(cfg, rows):
    from shardscribe.actors.audio_prep import AudioPrep
    from shardscribe.actors.finisher import Finisher
    from shardscribe.actors.transcriber import Transcriber
    from shardscribe.pipeline.kinds import decoder_kind
    from shardscribe.pipeline.records import INPUT_SCHEMA, OUTPUT_SCHEMA, table

    kind = decoder_kind(cfg.decoder.kind)
    model = Transcriber(cfg.to_dict(), kind)
    out = model(AudioPrep(cfg.to_dict(), kind)(table(rows, INPUT_SCHEMA)))
    if kind.two_stage:
        out = Finisher(cfg.to_dict(), kind, first_stage=model.decoder)(out)
    assert out.schema.equals(OUTPUT_SCHEMA, check_metadata=False)
    return {r["id"]: r for r in out.to_pylist()}


def _check(rows: dict) -> int:
    """Every word, segment with words and row with words has a confidence in [0, 1], the
    error row none; returns the words seen."""
    assert rows["broken"]["error"] and rows["broken"]["confidence"] is None
    seen = 0
    for rid, row in rows.items():
        if rid == "broken":
            continue
        assert row["error"] is None and row["segments"], row
        for seg in row["segments"]:
            assert len(seg["words"]) == len(seg["text"].split()), seg
            assert all(0.0 <= w["confidence"] <= 1.0 for w in seg["words"]), seg
            assert (seg["confidence"] is None) == (not seg["words"]), seg
            seen += len(seg["words"])
        has_words = any(seg["words"] for seg in row["segments"])
        assert (row["confidence"] is not None) == has_words and (not has_words or 0.0 <= row["confidence"] <= 1.0)
    return seen


@pytest.fixture(scope="module")
def inputs(samples_dir, sample_manifest):
    rows = [dict(r, audio=str(samples_dir / r["audio"])) for r in sample_manifest[:2]]
    return rows + [{"id": "broken", "audio": str(ROOT / "pyproject.toml")}]


@pytest.mark.parametrize("config", ["ar", "ssd", "ctc_greedy", "ctc_beam"])
def test_rows_carry_confidence_embedded(config, inputs, model_cache):
    from shardscribe.pipeline.config import load_config

    cfg = load_config(config, [f"model.cache_dir={model_cache}", "model.device=cpu", "confidence.enabled=true"])
    assert _check(_run(cfg, inputs)) >= 10


def test_rows_carry_confidence_tiny_ctc_and_transducers(inputs, tmp_path_factory):
    from shardscribe.pipeline.config import load_config
    from test_ctc_family import saved_checkpoint
    from transducer_reference import build

    ctc_root = tmp_path_factory.mktemp("ctc")
    saved_checkpoint("wav2vec2", ctc_root)
    tdt_root = tmp_path_factory.mktemp("tdt")
    build("tdt", tdt_root, max_symbols=3, zero_duration_bias=-100.0)
    for config, root in (("ctc_model_greedy", ctc_root), ("transducer_greedy", tdt_root),
                         ("transducer_beam", tdt_root)):
        rows = _run(load_config(config, [f"model.source={root}", "model.device=cpu", "confidence.enabled=true"]), inputs)
        assert _check(rows) >= 1, config
