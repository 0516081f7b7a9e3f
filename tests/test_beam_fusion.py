"""Beam search with the real fusion models of pipeline.lm: the GPU-PB boosting tree
(exhaustive search vs brute force, per-utterance phrase lists) and NGPU-LM + tree together."""
from __future__ import annotations

import pytest
import torch

from beam_reference import BigramTable, brute_force
from shardscribe.pipeline.decoding.ctc_beam import CTCBeamSearch
from shardscribe.pipeline.lm import boosting

torch.set_num_threads(1)


class TreeSentence:
    """brute_force's view of a boosting tree: total bonus of a token sequence incl. final."""

    def __init__(self, tree, list_index=0):
        self.tree, self.list_index = tree, list_index

    def sentence(self, lm_tokens):
        toks = torch.tensor([lm_tokens or [0]], dtype=torch.int64)
        lengths = torch.tensor([len(lm_tokens)])
        return float(self.tree.score_sentences(toks, lengths, lists=torch.tensor([self.list_index])).sum())


def random_log_probs(b, t, v1, seed, sharp=1.0):
    g = torch.Generator().manual_seed(seed)
    return (sharp * torch.randn(b, t, v1, generator=g)).log_softmax(-1)


@pytest.mark.parametrize("seed", range(3))
def test_exhaustive_search_with_boosting_tree_equals_brute_force(seed):
    t, v1 = 5, 4
    tree = boosting.BoostingTree.from_phrases([[[0, 1], [2, 2, 0], [1]]], vocab_size=v1 - 1, context_score=1.5)
    lm = BigramTable.random(v1 - 1, seed)
    lp = random_log_probs(1, t, v1, seed)
    ref = brute_force(lp[0], beta=0.1, fusion=[(lm, 0.5), (TreeSentence(tree), 0.7)])
    res = CTCBeamSearch(v1 ** t, beta=0.1, lm=lm, alpha_lm=0.5, boost=tree, alpha_boost=0.7)(lp)
    assert tuple(res.tokens[0]) == ref[0][0]
    assert float(res.scores[0]) == pytest.approx(ref[0][1], abs=1e-4)


@pytest.mark.parametrize("dense", [0, 2 ** 28])
def test_per_utterance_phrase_lists_equal_single_runs(dense):
    v1 = 6
    tree = boosting.BoostingTree.from_phrases([[[0, 1, 2]], [[3, 4], [4, 0]]], vocab_size=v1 - 1, context_score=2.0)
    lp = random_log_probs(2, 20, v1, seed=5)
    lengths = torch.tensor([20, 15])
    search = CTCBeamSearch(6, alpha_boost=1.0, prune_threshold=10.0, dense_fusion_max_bytes=dense)
    both = search(lp, lengths, boost=tree.with_lists([0, 1]))
    for i in range(2):
        single = search(lp[i:i + 1, :int(lengths[i])], lengths[i:i + 1], boost=tree.with_lists([i]))
        assert both.nbest_tokens[i] == single.nbest_tokens[0]
        assert torch.allclose(both.nbest_scores[i], single.nbest_scores[0], atol=1e-5)


def test_boosting_recovers_an_ambiguous_phrase():
    # frames: token 1 sure, then tokens 2 / 3 nearly tied (2 slightly ahead)
    probs = torch.full((4, 4), 0.01)
    probs[0, 1], probs[1, 0], probs[2, 2], probs[2, 3], probs[3, 0] = 0.97, 0.97, 0.5, 0.47, 0.97
    lp = (probs / probs.sum(-1, keepdim=True)).log()[None]
    assert CTCBeamSearch(4)(lp).tokens[0] == [1, 2]
    tree = boosting.BoostingTree.from_phrases([[[0, 2]]], vocab_size=3, context_score=1.0)  # CTC ids 1, 3
    assert CTCBeamSearch(4, boost=tree, alpha_boost=1.0)(lp).tokens[0] == [1, 3]
