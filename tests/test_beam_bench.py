"""Helpers of `shardscribe bench ctc-beam`: the simulated posteriors really encode their
text, the phrase F-score counts what it should, and key phrases come from held-out text."""
from __future__ import annotations

import pytest
import torch

from shardscribe.jobs.bench.data import key_phrases, simulate_log_probs
from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch
from shardscribe.pipeline.metrics import corpus_wer_lowercase, phrase_fscore
from shardscribe.pipeline.text import charset


def test_simulated_posteriors_are_normalised_and_decodable():
    texts = ["Hello world.", "aa bb"]
    lp, lengths = simulate_log_probs(texts, seed=1)
    assert lp.shape[2] == charset.NUM_CLASSES
    valid = torch.arange(lp.shape[1])[None, :] < lengths[:, None]
    sums = lp.exp().sum(-1)
    assert torch.allclose(sums[valid], torch.ones(int(valid.sum())), atol=1e-4)
    # the reference is reachable: forcing the blank between doubled letters works
    assert lp.isfinite()[valid].all()
    again, _ = simulate_log_probs(texts, seed=1)
    assert torch.equal(lp, again)
    res = CTCBeamSearch(8)(lp, lengths)
    assert corpus_wer_lowercase(texts, [charset.decode(t) for t in res.tokens]) < 1.0


def test_phrase_fscore_counts_per_utterance_matches():
    refs = ["the Lambda system", "a Lambda here"]
    hyps = ["the Lambda systen", "Lambda Lambda here"]
    # ref phrases: Lambda x2, system x1 -> 3; hyp phrases: Lambda x3 -> tp 2
    f = phrase_fscore(refs, hyps, ["Lambda", "system"])
    p, r = 2 / 3, 2 / 3
    assert abs(f - 100 * 2 * p * r / (p + r)) < 1e-9
    assert phrase_fscore(refs, refs, ["Lambda", "system"]) == 100.0


def test_key_phrases_prefer_held_out_rare_words():
    held = ["Quokkas enjoy breakfast", "quokkas are small"]
    train = ["breakfast is served", "breakfast again", "zebras run", "elephants walk"]
    phrases = key_phrases(held, train, 3)
    assert phrases[0] == "Quokkas" and "breakfast" not in phrases
    assert len(phrases) == 3


def test_phrase_fscore_counts_multi_word_phrases():
    import pytest

    from shardscribe.jobs.bench.data import domain_phrases

    phrases = domain_phrases()
    assert len(phrases) == 100 and "heat exchanger" in phrases
    refs = ["Drain the heat exchanger 32 in the control room."]
    assert phrase_fscore(refs, ["drain the heat exchanger 32 in the control room"], phrases) == 100.0
    # "heat" alone is no match; "Drain" and "the control room" still are
    f = phrase_fscore(refs, ["Drain the heat exchange 32 in the control room."], phrases)
    assert f == pytest.approx(100 * 2 * (2 / 2) * (2 / 3) / (1 + 2 / 3))


@pytest.mark.slow
def test_quick_bench_runs_end_to_end_with_the_contract_keys(tmp_path, capsys, monkeypatch):
    """`shardscribe bench ctc-beam --quick` on simulated posteriors: every contract key is a
    number, the speed ratios come from the interleaved headline timing, the LM and the
    boosting list act (WERs and F-scores relate as the search guarantees), the PNG is
    written, and the run's scratch files (LMs; with --model a full-size checkpoint) are gone
    afterwards. No timing is asserted."""
    import json
    import tempfile

    from shardscribe.jobs.cli import main

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    out = tmp_path / "r.json"
    assert main(["bench", "ctc-beam", "--quick", "--utterances", "12", "--reps", "1", "--out", str(out)]) == 0
    assert list(scratch.iterdir()) == []
    assert "summary:" in capsys.readouterr().out
    result = json.loads(out.read_text())
    s = result["summary"]
    for key in ("wer_greedy", "wer_beam_lm", "wer_flashlight", "speedup_vs_pyctcdecode", "speedup_vs_flashlight",
                "flop_speedup", "flop_wer_rel_change", "boost_fscore_gain"):
        assert isinstance(s[key], (int, float)), key
    ms = s["headline_ms_per_utt"]
    assert s["speedup_vs_pyctcdecode"] == ms["pyctcdecode"] / ms["ours"]
    assert s["flop_speedup"] == ms["ours"] / ms["ours_flop"]
    assert s["speedup_vs_pyctcdecode_flop_paper"] == ms["pyctcdecode"] / ms["ours_flop_paper"]
    # the FLToP paper's point is a search of its own: at most N = 4 tokens a frame, where
    # the shipped (8, 5e-4) keeps more on these frames
    paper = next(r for r in result["rows"] if r["decoder"] == "ours (FLToP N 4, R 0.007)")
    shipped = next(r for r in result["rows"] if r["decoder"] == "ours" and r["flop"] and r["beam"] == 8
                   and r["lm"] and not r["phrases"] and r["batch"] == 32)
    assert paper["avg_tokens"] <= 4 < shipped["avg_tokens"]
    assert s["wer_beam_lm_flop_paper"] == paper["wer"]
    assert s["wer_beam_lm"] <= s["wer_greedy"]
    assert s["boost_fscore"] >= s["boost_fscore_without"]
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_boundary_errors_pair_the_same_words_in_order():
    from shardscribe.jobs.bench.ctc_beam_model import boundary_errors

    predicted = [{"word": "Hello,", "start": 0.1, "end": 0.5}, {"word": "wurld", "start": 0.6, "end": 0.9},
                 {"word": "again", "start": 1.0, "end": 1.2}]
    truth = [("hello", 0.12, 0.5), ("world", 0.6, 1.0), ("again", 1.1, 1.2)]
    assert sorted(round(e, 3) for e in boundary_errors(predicted, truth)) == [0.0, 0.0, 0.02, 0.1]


def test_speech_span_finds_a_tone_between_silences():
    import numpy as np

    from shardscribe.jobs.bench.ctc_beam_model import speech_span

    audio = np.zeros(16000, np.float32)
    audio[4000:9600] = 0.3 * np.sin(np.arange(5600) * 0.2)
    assert speech_span(audio) == (4000, 9600)
    assert speech_span(np.zeros(800, np.float32)) is None


def test_model_bench_on_a_tiny_checkpoint(tmp_path, sample_audio):
    """`bench ctc-beam --model` at reduced sizes: a tiny random Parakeet CTC checkpoint in
    its own 35-piece vocabulary against flashlight and pyctcdecode, and word timing on the
    embedded model, whose boundaries on one clip of separately rendered words must be
    within a few frames. No speed is asserted."""
    from shardscribe.jobs.bench.ctc_beam_model import model_speed, word_timing
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.training.sample_text import pydoc_sentences
    from test_ctc_family import saved_checkpoint

    saved_checkpoint("parakeet", tmp_path / "m")
    clips = [sample_audio[c] for c in sorted(sample_audio)[:3]]
    text = pydoc_sentences()
    out = model_speed(str(tmp_path / "m"), clips, text[:400], text[400:406], ["the"], tmp_path, rounds=1,
                      alpha=0.5, beam_cfg=load_config("ctc_beam").beam)
    assert out["vocab_size"] == 35 and out["blank"] == 34 and out["frame_stride_s"] == 0.08
    for part in ("own_frames", "simulated_frames"):
        for key in ("ours", "ours_dense", "ours_flop", "ours_flop_paper", "flashlight", "pyctcdecode", "greedy"):
            assert out[part]["ms_per_utt"][key] > 0
        assert out[part]["loops"]["ours_dense"] == "native"
    wer = out["simulated_frames"]["wer"]
    # in-vocabulary posteriors of the held-out text: the LM search reads back at least what
    # greedy does, and the dense table is the same LM
    assert wer["ours"] <= wer["greedy"] < 1.0 and wer["ours"] == wer["ours_dense"]
    assert out["rtfx_beam_vs_greedy"] == pytest.approx(out["rtfx_beam_lm_100_phrases"] / out["rtfx_greedy"])
    timing = word_timing(["Check the pump before the valve opens."], seed=0)
    assert timing["greedy_matched_words"] >= 3
    assert timing["greedy_boundary_mae_s"] < 0.15
