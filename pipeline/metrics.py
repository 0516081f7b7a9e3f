"""Transcript metrics: word/character error rates (jiwer for the alignment) and the
key-phrase F-score of boosting benchmarks.

Two WERs, on purpose: ``corpus_wer`` applies Whisper's English text normalisation (the
job summary and the model benchmarks); ``corpus_wer_lowercase`` only lower-cases and
splits on white space (bench ctc-beam: Whisper's normaliser deletes parenthesised text,
which its Python-reference sentences are full of).
"""
from __future__ import annotations

import functools
import re
from collections import Counter

import jiwer


@functools.lru_cache(maxsize=1)
def _normalizer():
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    # The British->American spelling map is not shipped with the embedded model; the
    # rest of Whisper's normalisation (numbers, punctuation, case, contractions) applies.
    return EnglishTextNormalizer({})


def normalize(text: str) -> str:
    return _normalizer()(text or "").strip()


def _normalized_pairs(references, hypotheses, norm=normalize) -> tuple[list[str], list[str]]:
    """(references, hypotheses) after ``norm``, without the pairs whose reference is empty."""
    pairs = [(norm(r), norm(h)) for r, h in zip(references, hypotheses)]
    pairs = [(r, h) for r, h in pairs if r]
    return [r for r, _ in pairs], [h for _, h in pairs]


def corpus_wer(references: list[str], hypotheses: list[str]) -> float | None:
    """Corpus-level WER after normalisation; None when no reference has words."""
    errors, words = word_error_counts(references, hypotheses)
    return errors / words if words else None


def word_error_counts(references: list[str], hypotheses: list[str]) -> tuple[int, int]:
    """(word errors, reference words) after normalisation: summed over batches, their
    ratio is ``corpus_wer`` of all the pairs."""
    refs, hyps = _normalized_pairs(references, hypotheses)
    if not refs:
        return 0, 0
    out = jiwer.process_words(refs, hyps)
    return (out.substitutions + out.deletions + out.insertions,
            out.substitutions + out.deletions + out.hits)


def corpus_cer(references: list[str], hypotheses: list[str]) -> float | None:
    """Corpus-level CER after normalisation; None when no reference has words."""
    refs, hyps = _normalized_pairs(references, hypotheses)
    return jiwer.cer(refs, hyps) if refs else None


def _lowercase(text: str) -> str:
    return " ".join(text.lower().split())


def corpus_wer_lowercase(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER on lower-cased, whitespace-split text, pairs with an empty reference left
    out. Not Whisper's normaliser (``corpus_wer``): that deletes parenthesised text, which
    the Python reference is full of. Raises (jiwer) when no reference has words."""
    return jiwer.wer(*_normalized_pairs(references, hypotheses, _lowercase))


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_%]+", text.lower())


def phrase_fscore(refs: list[str], hyps: list[str], phrases: list[str]) -> float:
    """F-score (0-100) of boosted phrase occurrences, per utterance: a phrase counts where
    its lower-cased word sequence occurs (multi-word phrases included)."""
    targets = [tuple(_words(p)) for p in phrases]
    targets = [p for p in dict.fromkeys(targets) if p]

    def count(text):
        w = _words(text)
        c = Counter()
        for p in targets:
            n = sum(1 for i in range(len(w) - len(p) + 1) if tuple(w[i:i + len(p)]) == p)
            if n:
                c[p] = n
        return c

    tp = n_ref = n_hyp = 0
    for r, h in zip(refs, hyps):
        rc, hc = count(r), count(h)
        tp += sum(min(n, hc[w]) for w, n in rc.items())
        n_ref += sum(rc.values())
        n_hyp += sum(hc.values())
    if tp == 0:
        return 0.0
    p, r = tp / n_hyp, tp / n_ref
    return 100.0 * 2 * p * r / (p + r)
