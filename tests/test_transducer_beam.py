"""ALSD++ and AES++ ("Pushing the Limits of Beam Search Decoding for Transducer-based ASR
models") against independent references on tiny random Parakeet RNN-T / TDT checkpoints
(tests/transducer_reference.py): a beam as wide as the hypothesis space finds the
brute-force best alignment, both searches equal a plain per-utterance ALSD / AES with every
fusion strategy (eq. 2 / eq. 3 blank scoring, early / late pruning, LM and boosting tree),
beam 1 equals greedy decoding, LM weight 0 equals no LM, a batch equals each utterance
alone, and TDT durations are honoured."""
from __future__ import annotations

import pytest
import torch

from beam_reference import BigramTable
from shardscribe.pipeline.decoding.transducer.greedy import transducer_greedy
from shardscribe.pipeline.decoding.transducer.search import TransducerBeamSearch
from shardscribe.pipeline.lm.boosting import BoostingTree
from shardscribe.pipeline.models.transducer.adapter import load_transducer_adapter
from transducer_reference import TINY, brute_force, build, reference_search


def _adapter(tmp_path_factory, kind, **kw):
    root = tmp_path_factory.mktemp(f"{kind}-{len(kw)}")
    build(kind, root, **kw)
    return load_transducer_adapter(str(root))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Brute-force sized: 4 tokens + blank, two symbols per frame; TDT durations 0-2."""
    return {kind: _adapter(tmp_path_factory, kind, pieces=TINY, durations=(0, 1, 2), max_symbols=2,
                           blank_bias=0.0) for kind in ("rnnt", "tdt")}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return {kind: _adapter(tmp_path_factory, kind, max_symbols=3) for kind in ("rnnt", "tdt")}


def _frames(b, t, h, seed):
    return torch.randn(b, t, h, generator=torch.Generator().manual_seed(seed)) * 1.5


CASES = [("rnnt", "alsd"), ("rnnt", "aes"), ("tdt", "alsd")]


@pytest.mark.parametrize("kind,algorithm", CASES)
def test_a_beam_as_wide_as_the_space_finds_the_brute_force_best(tiny, kind, algorithm):
    model = tiny[kind]
    misses = 0
    for seed in ((0, 6) if kind == "tdt" else (0, 1, 2)):   # seed 6: TDT greedy misses
        frames = _frames(1, 3, 24, seed=seed)
        best, tokens = brute_force(model, frames[0], 3)
        out = TransducerBeamSearch(model, 64, algorithm=algorithm)(frames, torch.tensor([3]))
        assert out.scores[0].item() == pytest.approx(best, abs=1e-4), seed
        assert out.tokens[0] == tokens, seed
        narrow = TransducerBeamSearch(model, 1, algorithm=algorithm)(frames, torch.tensor([3]))
        misses += narrow.scores[0].item() < best - 1e-3
    assert misses      # the test can fail: greedy misses the best alignment on some inputs


def _fusion(model, seed):
    lm = BigramTable.random(model.vocab_size - 1, seed)
    tree = BoostingTree.from_phrases([[[3, 5, 7], [2, 2]]], model.vocab_size - 1, context_score=1.5)
    return lm, tree


@pytest.mark.parametrize("kind,algorithm,blank_scoring,pruning", [
    ("rnnt", "alsd", "asr", "early"), ("rnnt", "alsd", "asr", "late"), ("rnnt", "alsd", "lm", "early"),
    ("rnnt", "alsd", "lm", "late"), ("rnnt", "aes", "lm", "late"), ("rnnt", "aes", "asr", "early"),
    ("tdt", "alsd", "lm", "late"), ("tdt", "alsd", "asr", "early")])
def test_batched_search_equals_the_per_utterance_reference(small, kind, algorithm, blank_scoring, pruning):
    model = small[kind]
    lm, tree = _fusion(model, seed=3)
    if pruning == "late":
        lm.num_states = model.vocab_size        # late pruning: the dense-table lookup path
    frames, lengths = _frames(3, 5, 24, seed=11), torch.tensor([5, 3, 4])
    search = TransducerBeamSearch(model, 4, algorithm=algorithm, lm=lm, alpha_lm=0.6, boost=tree, alpha_boost=0.5,
                                  blank_scoring=blank_scoring, pruning=pruning)
    out = search(frames, lengths)
    for i in range(3):
        score, tokens = reference_search(model, frames[i], int(lengths[i]), 4, algorithm,
                                         fusion=[(lm, 0.6), (tree, 0.5)], lam=0.6,
                                         blank_scoring=blank_scoring, pruning=pruning)
        assert out.tokens[i] == tokens, (i, out.tokens[i], tokens)
        assert out.scores[i].item() == pytest.approx(score, abs=1e-3)


@pytest.mark.parametrize("kind,algorithm", CASES)
def test_plain_search_equals_the_reference_and_lm_weight_zero_is_no_lm(small, kind, algorithm):
    model = small[kind]
    frames, lengths = _frames(2, 7, 24, seed=2), torch.tensor([7, 5])
    out = TransducerBeamSearch(model, 3, algorithm=algorithm)(frames, lengths)
    for i in range(2):
        score, tokens = reference_search(model, frames[i], int(lengths[i]), 3, algorithm)
        assert (out.tokens[i], round(out.scores[i].item(), 3)) == (tokens, round(score, 3))
    lm = BigramTable.random(model.vocab_size - 1, 4)
    for blank_scoring in ("asr", "lm"):
        zero = TransducerBeamSearch(model, 3, algorithm=algorithm, lm=lm, alpha_lm=0.0, blank_scoring=blank_scoring,
                                    pruning="late")(frames, lengths)
        assert zero.tokens == out.tokens
        torch.testing.assert_close(zero.scores, out.scores)


@pytest.mark.parametrize("kind,algorithm", CASES)
def test_beam_one_is_greedy_and_a_batch_is_each_utterance_alone(small, kind, algorithm, sample_audio):
    model = small[kind]
    audios = [a[:16000 * 2] for a in list(sample_audio.values())[:4]]
    enc = model.encode(audios)
    greedy = transducer_greedy(model, enc.states, enc.valid_frames)
    one = TransducerBeamSearch(model, 1, algorithm=algorithm)(enc.states, enc.valid_frames)
    assert one.tokens == greedy.tokens and one.frames == greedy.frames
    torch.testing.assert_close(one.scores, greedy.scores, atol=1e-4, rtol=0)
    search = TransducerBeamSearch(model, 4, algorithm=algorithm)
    batch = search(enc.states, enc.valid_frames)
    assert any(a != b for a, b in zip(batch.tokens, greedy.tokens))    # the beam changes something
    for i in (0, 3):
        alone = search(enc.states[i:i + 1, :int(enc.valid_frames[i])], enc.valid_frames[i:i + 1])
        assert alone.tokens[0] == batch.tokens[i]
        assert alone.scores[0].item() == pytest.approx(batch.scores[i].item(), abs=1e-4)


def test_tdt_durations_are_honoured(tmp_path_factory):
    model = _adapter(tmp_path_factory, "tdt", durations=(2, 4), max_symbols=3)
    frames, lengths = _frames(2, 9, 24, seed=8), torch.tensor([9, 7])
    for k in (1, 4):
        out = TransducerBeamSearch(model, k)(frames, lengths)
        assert any(out.frames)
        for fr, n in zip(out.frames, lengths.tolist()):
            assert all(f % 2 == 0 and f < n for f in fr), fr    # every step moves 2 or 4 frames
        for i in range(2):
            assert reference_search(model, frames[i], int(lengths[i]), k)[1] == out.tokens[i]


def test_refuses_what_it_cannot_search(small):
    with pytest.raises(ValueError, match="AES"):
        TransducerBeamSearch(small["tdt"], 4, algorithm="aes")
    with pytest.raises(ValueError, match="build-lm"):
        TransducerBeamSearch(small["rnnt"], 4, lm=BigramTable.random(7, 0), alpha_lm=0.5)


def test_word_timestamps_follow_the_best_path(small):
    from shardscribe.pipeline.decoding.transducer.words import word_timestamps

    model = small["rnnt"]
    frames, lengths = _frames(1, 12, 24, seed=4), torch.tensor([12])
    out = TransducerBeamSearch(model, 4)(frames, lengths)
    words = word_timestamps(model.tokenizer, out.tokens[0], out.frames[0], model.frame_shift_s, offset_s=1.0,
                            decode=model.decode_text)
    pieces = model.tokenizer.convert_ids_to_tokens(out.tokens[0])
    assert len(words) == sum(p.startswith("▁") for p in pieces[1:]) + 1 or not words
    assert " ".join(w["word"] for w in words) == model.decode_text(out.tokens[0]).strip()
    starts = [w["start"] for w in words]
    assert starts == sorted(starts) and all(1.0 <= w["start"] < w["end"] <= 1.0 + 12 * 0.08 + 1e-9 for w in words)


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_the_per_utterance_alsd_baseline_is_exact_where_it_must_be(tiny, small, kind):
    """The bench's per-utterance ALSD (pipeline.training.references.transducer_alsd): as wide
    as the space it finds the brute-force best; at beam 1 it is greedy decoding."""
    from shardscribe.pipeline.training.references.transducer_alsd import per_utterance_alsd

    model = tiny[kind]
    for seed in (0, 6):
        frames = _frames(1, 3, 24, seed=seed)
        best, tokens = brute_force(model, frames[0], 3)
        got, score = per_utterance_alsd(model, frames[0], 3, beam=64)
        assert (got, score) == (tokens, pytest.approx(best, abs=1e-4)), seed
    model = small[kind]
    frames = _frames(3, 9, 24, seed=2)
    greedy = transducer_greedy(model, frames, torch.tensor([9, 6, 4]))
    for i, n in enumerate((9, 6, 4)):
        assert per_utterance_alsd(model, frames[i], n, beam=1)[0] == greedy.tokens[i]


def test_aes_expansion_gamma_equals_the_reference_and_bounds(small, sample_audio):
    """mAES's expansion beam: against the per-utterance reference that filters each
    hypothesis's expansions, on inputs where gamma changes the search; gamma 0 leaves each
    hypothesis its best expansion only (the greedy path), a huge gamma is no pruning."""
    model = small["rnnt"]
    lm, tree = _fusion(model, seed=3)
    lm.num_states = model.vocab_size
    frames, lengths = _frames(3, 6, 24, seed=5), torch.tensor([6, 4, 5])
    changed = 0
    for gamma in (0.5, 1.5):
        kw = dict(algorithm="aes", lm=lm, alpha_lm=0.6, boost=tree, alpha_boost=0.5)
        out = TransducerBeamSearch(model, 4, expansion_gamma=gamma, **kw)(frames, lengths)
        full = TransducerBeamSearch(model, 4, **kw)(frames, lengths)
        for i in range(3):
            score, tokens = reference_search(model, frames[i], int(lengths[i]), 4, "aes",
                                             fusion=[(lm, 0.6), (tree, 0.5)], lam=0.6, gamma=gamma)
            assert out.tokens[i] == tokens, (gamma, i)
            assert out.scores[i].item() == pytest.approx(score, abs=1e-3)
            changed += out.scores[i].item() != pytest.approx(full.scores[i].item(), abs=1e-4)
    assert changed     # the test can fail: gamma prunes a path the full search keeps
    audios = [a[:16000 * 2] for a in list(sample_audio.values())[:4]]
    enc = model.encode(audios)
    greedy = transducer_greedy(model, enc.states, enc.valid_frames)
    zero = TransducerBeamSearch(model, 4, algorithm="aes", expansion_gamma=0.0)(enc.states, enc.valid_frames)
    assert zero.tokens == greedy.tokens
    wide = TransducerBeamSearch(model, 4, algorithm="aes", expansion_gamma=1e9)(enc.states, enc.valid_frames)
    plain = TransducerBeamSearch(model, 4, algorithm="aes")(enc.states, enc.valid_frames)
    assert wide.tokens == plain.tokens and plain.tokens != greedy.tokens
    with pytest.raises(ValueError, match="expansion_gamma"):
        TransducerBeamSearch(model, 4, algorithm="alsd", expansion_gamma=1.0)
