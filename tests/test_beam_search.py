"""FlexCTC batched beam search (pipeline.decoding.ctc_beam) against independent references:
brute force over all alignments, greedy CTC, and itself under batching/permutation."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_reference import BigramTable, brute_force, peaky_log_probs
from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch
from shardscribe.pipeline.models.ctc_greedy import ctc_greedy

torch.set_num_threads(1)


def random_log_probs(b, t, v1, seed, sharp=2.0):
    g = torch.Generator().manual_seed(seed)
    return (sharp * torch.randn(b, t, v1, generator=g)).log_softmax(-1)


@pytest.mark.parametrize("merge", ["max", "logsumexp"])
@pytest.mark.parametrize("with_lm", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_exhaustive_beam_equals_brute_force(merge, with_lm, seed):
    t, v1 = 5, 3
    lp = random_log_probs(1, t, v1, seed)
    fusion = []
    kwargs = dict(beta=0.7)
    if with_lm:
        lm = BigramTable.random(v1 - 1, seed)
        boost = BigramTable.random(v1 - 1, seed + 100)
        fusion = [(lm, 0.8), (boost, 0.3)]
        kwargs.update(lm=lm, alpha_lm=0.8, boost=boost, alpha_boost=0.3)
    ref = brute_force(lp[0], beta=0.7, fusion=fusion, merge=merge)
    # a beam as large as the number of alignments never drops a candidate: exact search
    search = CTCBeamSearch(v1 ** t, merge=merge, nbest=5, **kwargs)
    res = search(lp)
    assert tuple(res.tokens[0]) == ref[0][0]
    assert float(res.scores[0]) == pytest.approx(ref[0][1], abs=1e-4)
    got = [(tuple(toks), float(s)) for toks, s in zip(res.nbest_tokens[0], res.nbest_scores[0])]
    for (gt, gs), (rt, rs) in zip(got, ref[:5]):
        assert gs == pytest.approx(rs, abs=1e-4)
    assert {g[0] for g in got[:3]} == {r[0] for r in ref[:3]} or ref[2][1] == pytest.approx(ref[3][1])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 4), t=st.integers(1, 12), v1=st.integers(2, 7))
def test_beam_one_equals_greedy(seed, b, t, v1):
    lp = random_log_probs(b, t, v1, seed)
    lengths = torch.randint(0, t + 1, (b,), generator=torch.Generator().manual_seed(seed))
    res = CTCBeamSearch(1)(lp, lengths)
    greedy = ctc_greedy(lp, lengths)
    assert res.tokens == greedy.tokens
    assert res.token_frames == greedy.frames


@pytest.mark.parametrize("flop", [None, (3, 0.05)])
def test_alpha_zero_equals_no_lm(flop):
    lp = random_log_probs(3, 30, 8, seed=1, sharp=1.0)
    lengths = torch.tensor([30, 17, 25])
    lm = BigramTable.random(7, seed=5)
    kw = dict(beam_size=6, prune_threshold=8.0, beta=0.4)
    if flop:
        kw.update(flop_top_n=flop[0], flop_ratio=flop[1])
    plain = CTCBeamSearch(**kw)(lp, lengths)
    zero = CTCBeamSearch(lm=lm, alpha_lm=0.0, boost=lm, alpha_boost=0.0, **kw)(lp, lengths)
    assert zero.nbest_tokens == plain.nbest_tokens
    assert torch.equal(zero.nbest_scores, plain.nbest_scores)
    with_lm = CTCBeamSearch(lm=lm, alpha_lm=1.0, **kw)(lp, lengths)
    assert not torch.equal(with_lm.nbest_scores, plain.nbest_scores)


@pytest.mark.parametrize("merge", ["max", "logsumexp"])
@pytest.mark.parametrize("flop, data", [(None, "random"), ((4, 0.01), "random"), ((3, 0.05), "peaky")])
def test_batched_equals_single_utterance(merge, flop, data):
    """With FLToP the search folds single-survivor frame runs (``compress_frames``); the
    peaky input has many such runs, of different lengths per row."""
    b, t, v1 = 5, 40, 9
    if data == "peaky":
        lp = peaky_log_probs(b, t, v1, seed=7)
    else:
        lp = random_log_probs(b, t, v1, seed=3, sharp=1.5)
    lengths = torch.tensor([40, 1, 23, 0, 31])
    # padded frames hold garbage that must not leak into the frozen utterances
    lp = torch.where(torch.arange(t)[None, :, None] < lengths[:, None, None], lp, torch.randn(b, t, v1))
    lm = BigramTable.random(v1 - 1, seed=9)
    kw = dict(beam_size=5, merge=merge, prune_threshold=6.0, beta=0.2, lm=lm, alpha_lm=0.5, track_beams=True)
    if flop:
        kw.update(flop_top_n=flop[0], flop_ratio=flop[1])
    search = CTCBeamSearch(**kw)
    batched = search(lp, lengths)
    for i in range(b):
        n = int(lengths[i])
        single = search(lp[i:i + 1, :max(n, 1)], lengths[i:i + 1])
        assert batched.tokens[i] == single.tokens[0]
        assert batched.token_frames[i] == single.token_frames[0]
        assert torch.allclose(batched.nbest_scores[i], single.nbest_scores[0], atol=1e-5)
        assert torch.allclose(batched.avg_beams[i], single.avg_beams[0])
        finite = torch.isfinite(single.nbest_scores[0]).tolist()
        assert [x for x, f in zip(batched.nbest_tokens[i], finite) if f] == \
               [x for x, f in zip(single.nbest_tokens[0], finite) if f]


@pytest.mark.parametrize("with_labels", [False, True])
def test_flop_without_pruning_is_the_exact_search(with_labels):
    lp = random_log_probs(4, 25, 6, seed=11, sharp=1.0)
    lengths = torch.tensor([25, 20, 12, 25])
    lm = BigramTable.random(5, seed=2, with_labels=with_labels)
    kw = dict(beam_size=4, beta=0.3, lm=lm, alpha_lm=0.6, prune_threshold=10.0)
    exact = CTCBeamSearch(**kw)(lp, lengths)
    full = CTCBeamSearch(flop_top_n=6, flop_ratio=None, **kw)(lp, lengths)
    assert full.nbest_tokens == exact.nbest_tokens
    assert torch.allclose(full.nbest_scores, exact.nbest_scores, atol=1e-5)


def test_flop_keeps_top_n_above_relative_threshold():
    from shardscribe.pipeline.decoding.ctc_beam.flop import prune_frame

    frame = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    values, tokens = prune_frame(frame, top_n=3, ratio=0.4)
    assert tokens.tolist() == [[0, 1, 2]]
    assert torch.isfinite(values).tolist() == [[True, True, False]]  # 0.15 < 0.4 * 0.5


def test_blank_position_is_only_a_permutation():
    lp = random_log_probs(2, 20, 6, seed=4, sharp=1.0)
    lengths = torch.tensor([20, 14])
    lm = BigramTable.random(5, seed=7)
    first = CTCBeamSearch(4, lm=lm, alpha_lm=0.5, beta=0.1)(lp, lengths)
    last_lp = torch.cat([lp[..., 1:], lp[..., :1]], dim=-1)   # blank moved to the end
    last = CTCBeamSearch(4, blank=5, lm=lm, alpha_lm=0.5, beta=0.1)(last_lp, lengths)
    assert [[c - 1 for c in toks] for toks in first.tokens] == last.tokens
    assert torch.allclose(first.nbest_scores, last.nbest_scores)


def test_pruning_threshold_kills_far_hypotheses():
    lp = random_log_probs(1, 15, 5, seed=8, sharp=3.0)
    wide = CTCBeamSearch(8, track_beams=True)(lp)
    narrow = CTCBeamSearch(8, prune_threshold=1.0, track_beams=True)(lp)
    assert float(narrow.avg_beams[0]) < float(wide.avg_beams[0])
    assert torch.all(narrow.nbest_scores[0, 1:][torch.isfinite(narrow.nbest_scores[0, 1:])]
                     >= narrow.scores[0] - 1.0 - 1e-5)
