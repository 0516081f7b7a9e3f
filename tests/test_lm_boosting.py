"""GPU-PB boosting tree: golden scores computed by hand from the bonus rule.

Bonus of a phrase token at depth d with context score c: c at d = 1, c * s + ln(d) deeper
(s = depth_scaling). Tokens: a=0, b=1, c=2, d=3, x=4 (x is in no phrase).
"""
from __future__ import annotations

import math

import pytest
import torch

from shardscribe.pipeline.lm.boosting import BoostingTree

A, B, C, D, X = range(5)
V = 5


def bonus(depth: int, c: float = 1.0, s: float = 2.0) -> float:
    return c if depth == 1 else c * s + math.log(depth)


def walk(tree: BoostingTree, tokens: list[int], lst: int = 0) -> tuple[list[float], float]:
    """Step-by-step scores via the full-vocabulary advance, plus the final."""
    state = tree.init_states(1, lists=torch.tensor([lst]))
    scores = []
    for t in tokens:
        s, n = tree.advance(state)
        assert s.shape == (1, V) and n.dtype == torch.int64
        scores.append(s[0, t].item())
        state = n[:, t]
    return scores, tree.final(state).item()


@pytest.fixture()
def shared_prefix_tree():
    return BoostingTree.from_phrases([[[A, B, C], [A, B, D], [A, C]]], vocab_size=V)


def test_shared_prefix_spreads_bonus_along_depth(shared_prefix_tree):
    scores, final = walk(shared_prefix_tree, [A, B, C])
    assert scores == pytest.approx([bonus(1), bonus(2), bonus(3)])
    assert final == pytest.approx(0.0)
    scores, _ = walk(shared_prefix_tree, [A, B, D])  # the other branch of the shared "a b"
    assert scores == pytest.approx([bonus(1), bonus(2), bonus(3)])
    scores, _ = walk(shared_prefix_tree, [A, C])
    assert scores == pytest.approx([bonus(1), bonus(2)])


def test_failed_match_takes_bonus_back(shared_prefix_tree):
    scores, final = walk(shared_prefix_tree, [A, B, X])
    assert scores == pytest.approx([bonus(1), bonus(2), -(bonus(1) + bonus(2))])
    assert sum(scores) + final == pytest.approx(0.0)
    # An unfinished match at the end of the utterance is taken back by final().
    scores, final = walk(shared_prefix_tree, [X, A, B])
    assert scores == pytest.approx([0.0, bonus(1), bonus(2)])
    assert final == pytest.approx(-(bonus(1) + bonus(2)))


def test_fail_link_restarts_inside_failed_match(shared_prefix_tree):
    # "a a c": the second "a" fails out of "a" (take back 1) and starts "a" again (+1);
    # then "c" completes "a c".
    scores, final = walk(shared_prefix_tree, [A, A, C])
    assert scores == pytest.approx([bonus(1), -bonus(1) + bonus(1), bonus(2)])
    assert sum(scores) + final == pytest.approx(bonus(1) + bonus(2))
    # "a b a c": "a b" fails at the second "a" (take back a b), which restarts a match.
    scores, final = walk(shared_prefix_tree, [A, B, A, C, X])
    assert scores == pytest.approx([bonus(1), bonus(2), -(bonus(1) + bonus(2)) + bonus(1), bonus(2), 0.0])
    assert final == pytest.approx(0.0)


def test_completed_phrase_keeps_bonus(shared_prefix_tree):
    kept = bonus(1) + bonus(2) + bonus(3)
    scores, final = walk(shared_prefix_tree, [X, A, B, C, X, X])
    assert scores == pytest.approx([0.0, bonus(1), bonus(2), bonus(3), 0.0, 0.0])
    assert sum(scores) + final == pytest.approx(kept)
    scores, final = walk(shared_prefix_tree, [A, B, C, A, B, D])  # two phrases back to back
    assert sum(scores) + final == pytest.approx(2 * kept)


def test_nested_and_suffix_phrases():
    # Phrases "a b c d" and "b": "b" ends inside the unfinished "a b"; when "a b x" fails,
    # the credit of "a b" is taken back and the suffix phrase "b" is paid.
    tree = BoostingTree.from_phrases([[[A, B, C, D], [B]]], vocab_size=V)
    scores, final = walk(tree, [A, B, X])
    assert scores == pytest.approx([bonus(1), bonus(2), -(bonus(1) + bonus(2)) + bonus(1)])
    assert sum(scores) + final == pytest.approx(bonus(1))
    # "a b c d" completed: the longest phrase wins; the inner "b" is not paid again.
    scores, final = walk(tree, [A, B, C, D, X])
    assert sum(scores) + final == pytest.approx(sum(bonus(d) for d in range(1, 5)))
    # A phrase that is the prefix of a longer one keeps its bonus when the longer one fails.
    tree = BoostingTree.from_phrases([[[A, B], [A, B, C, D]]], vocab_size=V)
    scores, final = walk(tree, [A, B, C, X])
    assert scores == pytest.approx([bonus(1), bonus(2), bonus(3), -bonus(3)])
    assert sum(scores) + final == pytest.approx(bonus(1) + bonus(2))


def test_custom_context_score_and_depth_scaling():
    tree = BoostingTree.from_phrases([[([A, B, C], 3.0)]], vocab_size=V, depth_scaling=1.5)
    scores, _ = walk(tree, [A, B, C])
    assert scores == pytest.approx([3.0, 3.0 * 1.5 + math.log(2), 3.0 * 1.5 + math.log(3)])


def test_text_phrases_through_a_tokenizer():
    tokenize = lambda text: ["abcdx".index(ch) for ch in text]  # noqa: E731
    tree = BoostingTree.from_phrases([["abc", "ad"]], vocab_size=V, tokenize=tokenize)
    scores, _ = walk(tree, [A, D])
    assert scores == pytest.approx([bonus(1), bonus(2)])


def test_per_utterance_lists_in_one_batch():
    lists = [[[A, B]], [[B, C]], []]
    tree = BoostingTree.from_phrases(lists, vocab_size=V)
    states = tree.init_states(3, lists=torch.tensor([0, 1, 2]))
    rows = torch.arange(3)
    got = torch.zeros(3, 3)
    for step, tok in enumerate([A, B, C]):
        s, n = tree.advance(states)
        got[:, step] = s[rows, tok]
        states = n[rows, tok]
    expected = torch.tensor([
        [bonus(1), bonus(2), 0.0],  # list 0: "a b" completes, "c" is neutral
        [0.0, bonus(1), bonus(2)],  # list 1: "b c" completes
        [0.0, 0.0, 0.0],            # no phrases
    ])
    assert torch.allclose(got, expected)
    # Each row scored alone gives the same as in the batch; score_sentences agrees too.
    for i in range(3):
        alone, _ = walk(tree, [A, B, C], lst=i)
        assert alone == pytest.approx(got[i].tolist())
    tokens = torch.tensor([[A, B, C]] * 3)
    per_token = tree.score_sentences(tokens, torch.tensor([3, 3, 3]), lists=torch.tensor([0, 1, 2]))
    assert torch.allclose(per_token[:, :3], expected)
    assert torch.allclose(per_token[:, 3], torch.zeros(3))


def test_advance_labels_equals_full_advance():
    gen = torch.Generator().manual_seed(0)
    phrases = [[torch.randint(0, 7, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
                for _ in range(6)] for _ in range(3)]
    tree = BoostingTree.from_phrases(phrases, vocab_size=7)
    states = torch.arange(tree.graph.num_states).repeat(7)
    labels = torch.arange(7).repeat_interleave(tree.graph.num_states)
    full_s, full_n = tree.advance(states)
    s, n = tree.advance_labels(states, labels)
    rows = torch.arange(states.numel())
    assert torch.allclose(s, full_s[rows, labels]) and torch.equal(n, full_n[rows, labels])


def test_batch_phrase_lists_share_roots_and_merge_config_phrases(tmp_path):
    from shardscribe.pipeline.lm.boosting import batch_phrase_lists, read_phrase_file

    path = tmp_path / "phrases.txt"
    path.write_text("# key phrases\nab\n\nad\n")
    shared = read_phrase_file(str(path))
    lists, rows = batch_phrase_lists(shared, [["bc"], None, ["bc", " "], [""]])
    # a phrase of white space alone (it would boost the word separator) is dropped
    assert lists == [["ab", "ad", "bc"], ["ab", "ad"]]
    assert rows.tolist() == [0, 1, 0, 1]
    tokenize = lambda text: ["abcdx".index(ch) for ch in text]  # noqa: E731
    tree = BoostingTree.from_phrases(lists, vocab_size=V, tokenize=tokenize)
    per_token = tree.score_sentences(torch.tensor([[B, C]] * 4), torch.tensor([2] * 4), lists=rows)
    assert per_token[:, :2].sum(1).tolist() == pytest.approx([bonus(1) + bonus(2), 0.0] * 2)


def test_bound_lists_repeat_per_beam():
    tree = BoostingTree.from_phrases([[[A, B]], [[B, C]]], vocab_size=V).with_lists(torch.tensor([1, 0]))
    states = tree.init_states(2 * 3, bos=True)  # batch 2 x beam 3, as a beam search asks
    assert states.tolist() == [tree.roots[1].item()] * 3 + [tree.roots[0].item()] * 3
    scores, _ = tree.advance(states)
    assert scores[:3, B].tolist() == [bonus(1)] * 3 and scores[3:, A].tolist() == [bonus(1)] * 3
    with pytest.raises(ValueError):
        tree.init_states(5)


def test_case_variants_flip_the_first_letter_only_for_lower_or_title_words():
    from shardscribe.pipeline.lm.boosting import case_variants

    got = case_variants(["check", "The supervisor", "RPM", "iPhone", ("pump", 2.5), [1, 2], "check", "3 mm"])
    assert got == ["check", "Check", "The supervisor", "the supervisor", "RPM", "iPhone",
                   ("pump", 2.5), ("Pump", 2.5), [1, 2], "3 mm"]


def test_case_variant_tree_boosts_the_sentence_initial_spelling():
    """A tree from "check" gives "Check" nothing; with case variants both spellings earn
    the same bonus sequence (the one the bonus rule gives a 5-token phrase)."""
    from shardscribe.pipeline.lm.boosting import case_variants

    alphabet = "checkChx"
    tokenize = lambda text: [alphabet.index(ch) for ch in text]  # noqa: E731
    plain = BoostingTree.from_phrases([["check"]], vocab_size=len(alphabet), tokenize=tokenize)
    both = BoostingTree.from_phrases([case_variants(["check"])], vocab_size=len(alphabet), tokenize=tokenize)
    want = [bonus(d) for d in range(1, 6)]

    def walk_text(tree, text):
        state = tree.init_states(1)
        scores = []
        for t in tokenize(text):
            s, n = tree.advance(state)
            scores.append(s[0, t].item())
            state = n[:, t]
        return scores, tree.final(state).item()

    assert walk_text(plain, "check")[0] == pytest.approx(want)
    assert sum(walk_text(plain, "Check")[0]) + walk_text(plain, "Check")[1] == pytest.approx(0.0)
    for text in ("check", "Check"):
        scores, final = walk_text(both, text)
        assert scores == pytest.approx(want) and final == pytest.approx(0.0)


def test_the_charset_spells_a_key_phrase_exactly_or_not_at_all():
    """The embedded head's printable ASCII: a phrase that would lose a letter ("dög", "é")
    or keep only the space is not spelt; punctuation it lacks (curly quotes) is left out,
    punctuation it has is kept."""
    from shardscribe.pipeline.text import charset
    from shardscribe.pipeline.text.ctc_vocabulary import CharsetVocabulary

    vocab = CharsetVocabulary()
    for phrase in ("lazy dög", "é é", "naïve", " ", "", "“ ”"):
        assert vocab.phrase_token_ids(phrase) is None, phrase
    assert vocab.phrase_token_ids("lazy dog.") == charset.lm_token_ids("lazy dog.")
    assert vocab.phrase_token_ids("“lazy” dog") == charset.lm_token_ids("lazy dog")
    assert vocab.phrase_token_ids("Pump 4 – off") == charset.lm_token_ids("Pump 4 off")


def _walk_text(tree, text):
    """The summed bonus along ``text``'s characters plus the final weight."""
    from shardscribe.pipeline.text import charset

    tokens = torch.tensor([charset.lm_token_ids(text)])
    return tree.score_sentences(tokens, torch.tensor([tokens.shape[1]])).sum().item()


def test_a_phrase_the_vocabulary_cannot_spell_is_not_boosted_misspelt(caplog):
    """"lazy dög" was boosted as "lazy dg" and "é é" as the lone space; now a shared one is
    named in one warning, a row's are counted, and the rest still boost."""
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.lm.boosting import KeyPhrases, batch_boosting_tree
    from shardscribe.pipeline.text.ctc_vocabulary import CharsetVocabulary

    vocab = CharsetVocabulary()
    beam = load_config("ctc_beam", ['beam.key_phrases=["lazy dög", "pump"]']).beam
    assert batch_boosting_tree(["lazy dög"], [["é é"], None], vocab, beam, "cpu") is None
    with caplog.at_level("WARNING", logger="shardscribe.pipeline.lm.boosting"):
        phrases = KeyPhrases(beam, vocab)
    assert phrases.shared == ["pump"] and "'lazy dög'" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="shardscribe.pipeline.lm.boosting"):
        tree = phrases.tree([["é é", "lazy dog"], ["naïve"]], "cpu")
    assert phrases.dropped_row_phrases == 2 and "'é é'" in caplog.text and "'naïve'" in caplog.text
    row = torch.tensor([0])
    assert _walk_text(tree.with_lists(row), "the lazy dg.") == pytest.approx(0.0, abs=1e-4)
    assert _walk_text(tree.with_lists(row), " ") == pytest.approx(0.0, abs=1e-4)
    assert _walk_text(tree.with_lists(row), "the lazy dog.") > 0
    assert _walk_text(tree.with_lists(torch.tensor([1])), "pump") > 0
