"""Words of a segment and their confidence features.

``segment_words`` is the one place words are made: the decoder's own words where it has an
alignment (the CTC decoders' timed words, an AR decoder's cross-attention timings), else
the text split on white space with null times. Token features become word features by
mapping each token to the word its text ends in (``token_word_index``, decoding growing
prefixes, so any tokenizer's spacing rule holds) and aggregating per word (mean, min and the
product, as a sum of logs).

Each word also carries its neighbours' weakest token probability (``prev_prob_min``,
``next_prob_min``, 1.0 past the segment's ends, and their minimum ``ctx_min``): errors come
in runs (a misheard phrase spans words), so a confident word between two doubtful ones is
less likely right than its own tokens say. Beyond "Fast Entropy-Based Methods of
Word-Level Confidence Estimation for End-to-End Automatic Speech Recognition", whose
measures are per word; chosen by 5-fold cross-validation on the calibration's fit split
(docs/confidence.md).

Agreement of two texts (the CTC draft and the decoder's text) and the N-best posterior of a
beam decoder both align word sequences by edit distance (rapidfuzz's Levenshtein opcodes,
the alignment jiwer's WER uses): a word agrees where it is aligned to an equal word.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

AGGREGATIONS = ("mean", "min")


def segment_words(text: str, timed: list[dict] | None = None) -> list[dict]:
    """``[{word, start, end}]`` of a segment: ``timed`` where the decoder has word timings
    for as many words as ``text`` has (Whisper's alignment keeps a word's punctuation and
    spacing its own way), else the words of ``text`` with null times."""
    if timed is not None and len(timed) == len(text.split()):
        return [dict(w) for w in timed]
    return [{"word": w, "start": None, "end": None} for w in text.split()]


def token_word_index(decode: Callable[[list[int]], str], tokens: Sequence[int]) -> list[int]:
    """The index of the word (of ``decode(tokens).split()``) each token's text falls in;
    a token that adds no visible character belongs to the word before it (the first word
    when none is)."""
    out, count = [], 0
    for i in range(len(tokens)):
        count = len(decode(list(tokens[:i + 1])).split())
        out.append(max(count - 1, 0))
    return out


def aggregate(token_values: dict[str, np.ndarray], word_of: Sequence[int], n_words: int) -> list[dict]:
    """Per word: each token measure's mean and min over the word's tokens, the log-product
    of the emitted tokens' probabilities (``prob_logprod``) and the token count."""
    word_of = np.asarray(word_of, dtype=np.int64)
    out = [{} for _ in range(n_words)]
    for w in range(n_words):
        idx = np.nonzero(word_of == w)[0]
        feats = out[w]
        feats["n_tokens"] = float(len(idx))
        for name, values in token_values.items():
            vals = np.asarray(values, dtype=np.float64)[idx] if len(idx) else np.array([np.nan])
            feats[f"{name}_mean"] = float(np.mean(vals))
            feats[f"{name}_min"] = float(np.min(vals))
            if name == "prob":
                feats["prob_logprod"] = float(np.sum(np.log(np.clip(vals, 1e-12, 1.0))))
    _with_context(out)
    return out


def _with_context(feats: list[dict]) -> None:
    """The neighbours' ``prob_min`` on each word of one segment (1.0 past its ends)."""
    weakest = [f.get("prob_min", math.nan) for f in feats]
    for i, f in enumerate(feats):
        prev = weakest[i - 1] if i > 0 else 1.0
        nxt = weakest[i + 1] if i + 1 < len(feats) else 1.0
        known = [x for x in (prev, nxt) if not math.isnan(x)]
        f["prev_prob_min"], f["next_prob_min"], f["ctx_min"] = prev, nxt, min(known, default=math.nan)


def _norm(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


def matched(words: Sequence[str], other: Sequence[str]) -> list[bool]:
    """For each word of ``words``: whether the edit-distance alignment with ``other`` pairs it
    with an equal word (case and punctuation ignored)."""
    from rapidfuzz.distance import Levenshtein

    a, b = [_norm(w) for w in words], [_norm(w) for w in other]
    out = [False] * len(a)
    if not a or not b:
        return out
    for op in Levenshtein.opcodes(a, b):
        if op.tag == "equal":
            for i in range(op.src_start, op.src_end):
                out[i] = True
    return out


def agreement(words: Sequence[str], other_text: str) -> list[float]:
    """1.0 where a word of ``words`` agrees with ``other_text`` (a second decoder's), else 0."""
    return [float(m) for m in matched(words, other_text.split())]


def nbest_posterior(words: Sequence[str], nbest_texts: Sequence[str], scores: Sequence[float]) -> tuple[list[float], float]:
    """Per word of the best hypothesis ``words``: the total posterior (softmax over the
    N-best ``scores``, log domain) of the hypotheses whose alignment keeps the word; and the
    best hypothesis's own posterior (the first in ``nbest_texts``)."""
    finite = [(t, s) for t, s in zip(nbest_texts, scores) if s is not None and math.isfinite(s)]
    if not finite:
        return [1.0] * len(words), 1.0
    s = np.array([x[1] for x in finite], dtype=np.float64)
    post = np.exp(s - s.max())
    post /= post.sum()
    total = np.zeros(len(words))
    for (text, _), p in zip(finite, post):
        total += p * np.array(matched(words, text.split()), dtype=np.float64)
    return total.tolist(), float(post[0])
