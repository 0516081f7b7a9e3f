"""Pseudo-label filters: named reasons why a transcript is not fit to train on.

Each check is a pure function of a text (or a segment, or a row) and ``FiltersConfig``;
``mark_rows`` runs them inside the job's pass and writes ``filter_reasons`` on every
finished row and segment. The checks:

- ``compression_ratio``: Whisper's measure of a repetition loop ("Robust Speech
  Recognition via Large-Scale Weak Supervision", its long-form decoding heuristics): the
  UTF-8 bytes of the text over the bytes of their zlib compression; Whisper treats a
  30-s window above 2.4 as a failed decode.
- ``low_unique_words`` and ``very_long_word``: the hallucination filters of Granary
  ("Granary: Speech Recognition and Translation Dataset in 25 European Languages"): the
  share of distinct words in a segment, and a word longer than any real one.
- ``repeated_ngram``: the same n-gram said several times in a row (a decoder loop that
  the ratio misses in short texts).
- ``phrase``: a configured phrase list (Granary-style: "thank you for watching", ...):
  the whole text is one of them (Granary's rule), or, with ``phrase_match: contains``,
  it holds one as whole words. Case and punctuation are ignored.
- ``too_fast`` / ``too_slow``: characters per second of speech out of range for the
  segment's duration.
- ``empty`` (a segment or row without a letter or digit), ``no_speech`` (a recording where VAD found
  no speech) and ``language_mismatch``: the row's detected ``language``, where a decoder
  writes one, differs from ``filters.language``; or a segment's language is ``und``, an
  English-only model's decode that failed Whisper's rule (pipeline.models.whisper.language_check:
  speech it cannot transcribe).

The text checks run per segment (at most one model window, as Whisper's ratio is
defined), never over a whole long recording, whose text compresses well because it is
long. A row's reasons are its own checks plus every reason of its segments; a row with
an ``error`` gets none (it is never kept anyway).
"""
from __future__ import annotations

import re
import unicodedata
import zlib

# The language an English-only model's segment is written with when its decode failed
# (pipeline.models.whisper.language_check, which imports this module: defined here).
UNDETERMINED = "und"
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*", re.UNICODE)
# Scripts written without spaces between words: a "word" there is a whole clause, so the
# longest-word check does not apply to it.
_UNSPACED = ("CJK", "HIRAGANA", "KATAKANA", "THAI", "LAO", "KHMER", "MYANMAR", "TIBETAN")


def _unspaced(word: str) -> bool:
    return any(unicodedata.name(c, "").startswith(_UNSPACED) for c in word)


def words_of(text: str) -> list[str]:
    """Lower-cased words, punctuation stripped (apostrophes inside a word kept)."""
    return [w.lower() for w in _WORD.findall(text or "")]


def compression_ratio(text: str) -> float:
    """Whisper's compression ratio: len(utf-8 bytes) / len(zlib.compress(bytes))."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def unique_word_share(words: list[str]) -> float:
    return len(set(words)) / len(words) if words else 1.0


def longest_repeat(words: list[str], max_n: int) -> int:
    """The most consecutive repetitions of any n-gram (n <= ``max_n``) in ``words``: 1 when
    nothing repeats back to back."""
    best = 1
    for n in range(1, max_n + 1):
        for start in range(n):
            run = 1
            for i in range(start + n, len(words) - n + 1, n):
                if words[i:i + n] == words[i - n:i]:
                    run += 1
                    best = max(best, run)
                else:
                    run = 1
    return best


def _has_phrase(words: list[str], phrase: list[str]) -> bool:
    n = len(phrase)
    return n > 0 and any(words[i:i + n] == phrase for i in range(len(words) - n + 1))


def text_reasons(text: str, duration_s: float | None, cfg) -> list[str]:
    """The reasons ``text`` (spoken over ``duration_s`` seconds) fails ``cfg``
    (FiltersConfig), in a fixed order; [] when it passes."""
    stripped = (text or "").strip()
    if not any(c.isalnum() for c in stripped):   # nothing, or punctuation alone (Whisper's "." on silence)
        return ["empty"]
    words = words_of(stripped)
    reasons = []
    if cfg.max_compression_ratio is not None and compression_ratio(stripped) > cfg.max_compression_ratio:
        reasons.append("compression_ratio")
    if (cfg.min_unique_word_share is not None and len(words) >= cfg.unique_words_min_count
            and unique_word_share(words) < cfg.min_unique_word_share):
        reasons.append("low_unique_words")
    if cfg.max_ngram_repeats is not None and longest_repeat(words, cfg.ngram_max_n) > cfg.max_ngram_repeats:
        reasons.append("repeated_ngram")
    if cfg.max_word_chars is not None and any(len(w) > cfg.max_word_chars and not _unspaced(w) for w in words):
        reasons.append("very_long_word")
    phrases = [words_of(p) for p in cfg.phrases]
    if cfg.phrase_match == "whole" and words in phrases or (
            cfg.phrase_match == "contains" and any(_has_phrase(words, p) for p in phrases)):
        reasons.append("phrase")
    if duration_s and duration_s > 0:
        # Characters of speech: letters and digits, so punctuation and spaces do not count.
        cps = sum(1 for c in stripped if c.isalnum()) / duration_s
        if cfg.max_chars_per_second is not None and cps > cfg.max_chars_per_second:
            reasons.append("too_fast")
        if cfg.min_chars_per_second is not None and cps < cfg.min_chars_per_second:
            reasons.append("too_slow")
    return reasons


def segment_reasons(segment: dict, cfg) -> list[str]:
    if segment.get("error"):
        return []
    start, end = segment.get("start"), segment.get("end")
    duration = end - start if start is not None and end is not None else None
    reasons = text_reasons(segment.get("text") or "", duration, cfg)
    if segment.get("language") == UNDETERMINED:
        reasons.append("language_mismatch")
    return reasons


def row_reasons(row: dict, cfg) -> list[str]:
    """The row's own checks (no speech, empty, language), then its segments' reasons, each
    reason once."""
    if row.get("error"):
        return []
    segments = row.get("segments") or []
    reasons = []
    if not segments:
        reasons.append("no_speech")
    elif not (row.get("text") or "").strip():
        reasons.append("empty")
    language = row.get("language")
    if cfg.language is not None and language is not None and language.lower() != cfg.language.lower():
        reasons.append("language_mismatch")
    for seg in segments:
        reasons.extend(seg.get("filter_reasons") or [])
    return list(dict.fromkeys(reasons))


def mark_rows(rows: list[dict], cfg) -> list[dict]:
    """Write ``filter_reasons`` on every finished row of ``rows`` and on its segments;
    rows still waiting for a second stage (``pending_index``) are left for it."""
    for row in rows:
        if row.get("pending_index"):
            continue
        error = bool(row.get("error"))
        for seg in row.get("segments") or []:
            seg["filter_reasons"] = [] if error else segment_reasons(seg, cfg)
        row["filter_reasons"] = row_reasons(row, cfg)
    return rows
