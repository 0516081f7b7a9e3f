"""Speculative rounds in greedy decoding (SSD fallback with ssd.lookahead), on real audio
and the real model: the greedy rule gives exactly plain greedy decoding whatever the draft,
and the tau_slm rule equals an uncached one-token-at-a-time reference of the same rule."""
from __future__ import annotations

import math
import random

import pytest
import torch

from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
from shardscribe.pipeline.decoding.drafting.draft_sync import advance, proposal
from shardscribe.pipeline.decoding.drafting.drafters import CTCLookahead
from shardscribe.pipeline.decoding.ssd.decoder import SelfSpeculativeDecoder

from conftest import full_product_greedy


@pytest.fixture(scope="module")
def encoded(whisper_adapter, sample_audio):
    audios = [sample_audio[k] for k in sorted(sample_audio)]
    enc = whisper_adapter.encode(audios)
    return enc, full_product_greedy(whisper_adapter, enc.states)   # the rounds pick through the screen


def _corrupt(tokens: list[int], rng: random.Random, vocab: int) -> list[int]:
    """Substitutions, deletions and insertions, as a CTC draft's errors look after re-tokenising."""
    out = []
    for tok in tokens:
        u = rng.random()
        if u < 0.15:
            out.append(rng.randrange(vocab))
        elif u < 0.25:
            continue
        elif u < 0.35:
            out += [rng.randrange(vocab), tok]
        else:
            out.append(tok)
    return out


def test_advance_follows_matches_and_recovers_from_each_error_kind():
    d = [10, 11, 12, 13, 14, 15]
    assert advance(d, 0, 10) == 1                      # match
    assert advance(d, 1, 99) == 2                      # substitution: skip one draft token
    assert advance(d, 2, 11, prev=99) == 2             # decoder inserted a token: back by one
    assert advance(d, 1, 12) == 3                      # draft has an extra token: ahead by one
    assert advance(d, 0, 14, prev=13) == 5             # far, but anchored by the previous token
    assert advance(d, 0, 14, prev=77) == 1             # far and unanchored: treated as substitution
    assert advance(d, 6, 99) == 6                      # end of draft stays there
    assert proposal(d, 4, 8) == [14, 15] and proposal(d, 2, 0) == []


@pytest.mark.parametrize("lookahead", [1, 4])
def test_greedy_rounds_equal_plain_greedy_for_any_draft(whisper_adapter, encoded, lookahead):
    enc, full = encoded
    rng = random.Random(lookahead)
    vocab = whisper_adapter.vocab_size
    kinds = [full, [_corrupt(f, rng, vocab) for f in full], [[] for _ in full],
             [[rng.randrange(vocab) for _ in range(12)] for _ in full]]
    for drafts in kinds:
        got = greedy_decode(whisper_adapter, enc.states, drafter=CTCLookahead(drafts, lookahead=lookahead))
        assert got == full
    # With forced prefixes (SSD's verified tokens < j), the draft read from position j on.
    prefixes = [f[:i % 3] for i, f in enumerate(full)]
    plain = greedy_decode(whisper_adapter, enc.states, prefixes=prefixes)
    drafts = [_corrupt(f, rng, vocab) for f in full]
    got = greedy_decode(whisper_adapter, enc.states, prefixes=prefixes,
                        drafter=CTCLookahead(drafts, [len(p) for p in prefixes], lookahead))
    assert got == plain


def test_greedy_rounds_stop_at_the_token_limit_like_plain_greedy(whisper_adapter, encoded):
    enc, full = encoded
    for limit in (1, 2, 5):
        plain = greedy_decode(whisper_adapter, enc.states, max_new_tokens=limit)
        got = greedy_decode(whisper_adapter, enc.states, max_new_tokens=limit, drafter=CTCLookahead(full, lookahead=8))
        assert got == plain and all(len(g) <= limit for g in got)


def test_oracle_draft_needs_few_rounds(whisper_adapter, encoded):
    enc, full = encoded
    timer = {}
    greedy_decode(whisper_adapter, enc.states, drafter=CTCLookahead(full, lookahead=8), timer=timer)
    tokens = sum(len(f) for f in full)
    # Every guess is right: a round decides up to 9 tokens (first token excluded).
    assert timer["kept"] == timer["guessed"]
    assert timer["rounds"] <= sum(math.ceil((len(f) - 1) / 9) + 1 for f in full) < tokens


def _reference_rounds(adapter, states, prefix, draft, lookahead, accept, limit):
    """The tau_slm rule one token at a time, each distribution from an uncached pass."""
    prompt = list(adapter.prompt_ids)

    def dist(seq):
        hidden, _ = adapter.decoder_hidden(torch.tensor([prompt + seq]), states, None, None, None)
        logits = adapter.logits(hidden[:, -1])[0]
        logits[adapter.suppress_mask] = -math.inf
        if not seq:
            logits[adapter.begin_suppress_ids] = -math.inf
        return logits.softmax(-1)

    out, ptr = [], len(prefix)
    nxt = int(dist(prefix).argmax())
    while nxt != adapter.eot_id:
        out.append(nxt)
        if len(out) >= limit:
            break
        prev = out[-2] if len(out) > 1 else (prefix[-1] if prefix else None)
        ptr = advance(draft, ptr, nxt, prev)
        for guess in proposal(draft, ptr, min(lookahead, limit - len(out) - 1)):
            if float(dist(prefix + out)[guess]) <= accept:
                break
            out.append(guess)
            ptr += 1
        nxt = int(dist(prefix + out).argmax())
    return out


def test_tau_rule_rounds_equal_the_uncached_reference(whisper_adapter, encoded):
    enc, full = encoded
    rng = random.Random(7)
    rows = [0, 2, 4]
    drafts = [_corrupt(full[i], rng, whisper_adapter.vocab_size) for i in rows]
    prefixes = [drafts[0][:2], [], drafts[2][:1]]
    limit = 20
    got = greedy_decode(whisper_adapter, enc.states[rows], prefixes=prefixes,
                        drafter=CTCLookahead(drafts, [len(p) for p in prefixes], 3, accept_prob=0.01),
                        max_new_tokens=limit)
    plain = greedy_decode(whisper_adapter, enc.states[rows], prefixes=prefixes, max_new_tokens=limit)
    assert got != plain  # the rule kept some guess that is not the argmax
    for n, i in enumerate(rows):
        ref = _reference_rounds(whisper_adapter, enc.states[i:i + 1], prefixes[n], drafts[n], 3, 0.01, limit)
        assert got[n] == ref, n


def test_ssd_fallback_with_greedy_rounds_equals_plain_fallback(whisper_adapter, encoded):
    enc, full = encoded
    rng = random.Random(3)
    texts = [whisper_adapter.text(_corrupt(f, rng, 2000)) for f in full]
    entropy = torch.ones(len(texts))
    plain = SelfSpeculativeDecoder(whisper_adapter, 0.0, 0.5).decode(enc.states, texts, entropy)
    rounds = SelfSpeculativeDecoder(whisper_adapter, 0.0, 0.5, lookahead=4).decode(enc.states, texts, entropy)
    assert any(r.stage == "ar_fallback" and r.prefix for r in plain)
    assert [(r.stage, r.tokens, r.prefix) for r in rounds] == [(r.stage, r.tokens, r.prefix) for r in plain]
    with pytest.raises(ValueError, match="lookahead_rule"):
        SelfSpeculativeDecoder(whisper_adapter, 0.0, 0.5, lookahead=4, lookahead_rule="sampled")
