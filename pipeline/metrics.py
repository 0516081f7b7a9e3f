"""Word error rate with Whisper's English text normalisation (jiwer for the alignment)."""
from __future__ import annotations

import functools

import jiwer


@functools.lru_cache(maxsize=1)
def _normalizer():
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    # The British->American spelling map is not shipped with the embedded model; the
    # rest of Whisper's normalisation (numbers, punctuation, case, contractions) applies.
    return EnglishTextNormalizer({})


def normalize(text: str) -> str:
    return _normalizer()(text or "").strip()


def corpus_wer(references: list[str], hypotheses: list[str]) -> float | None:
    """Corpus-level WER after normalisation; None when no reference has words."""
    pairs = [(normalize(r), normalize(h)) for r, h in zip(references, hypotheses)]
    pairs = [(r, h) for r, h in pairs if r]
    if not pairs:
        return None
    return jiwer.wer([r for r, _ in pairs], [h for _, h in pairs])


def corpus_cer(references: list[str], hypotheses: list[str]) -> float | None:
    pairs = [(normalize(r), normalize(h)) for r, h in zip(references, hypotheses)]
    pairs = [(r, h) for r, h in pairs if r]
    if not pairs:
        return None
    return jiwer.cer([r for r, _ in pairs], [h for _, h in pairs])
