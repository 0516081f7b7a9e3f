"""The pseudo-label filters (pipeline.filters): each on a text where it must fire and one
where it must not; the compression ratio against a hand computation with zlib; the
marking of rows (error rows get no reasons, pending rows wait); the config's checks."""
from __future__ import annotations

import zlib

import pytest

from shardscribe.pipeline.config import ConfigError, FiltersConfig, load_config
from shardscribe.pipeline.filters import (compression_ratio, longest_repeat, mark_rows, row_reasons, text_reasons,
                              unique_word_share, words_of)

CFG = FiltersConfig()
# A Whisper-style loop: the decoder repeats its last sentence until the token limit.
LOOP = "I'm going to go to the store. " + "And then I went home. " * 12
CLEAN = "Please replace the pump filter before Monday morning, then call the office about the invoice."


def test_compression_ratio_is_whispers():
    text = "abcabcabcabcabcabc"
    data = text.encode("utf-8")
    # zlib's default level on 18 bytes: a literal "abc" then one back-reference; Whisper's
    # ratio divides the raw byte count by the compressed one.
    assert compression_ratio(text) == pytest.approx(len(data) / len(zlib.compress(data)))
    assert len(data) == 18
    assert compression_ratio("") == 0.0
    assert compression_ratio(LOOP) > 2.4 > compression_ratio(CLEAN)


def test_repetition_loop_fires_and_clean_text_does_not():
    loop = text_reasons(LOOP, 20.0, CFG)
    assert {"compression_ratio", "repeated_ngram", "low_unique_words"} <= set(loop), loop
    assert text_reasons(CLEAN, 6.0, CFG) == []


def test_repeated_ngram_counts_back_to_back_repeats():
    assert longest_repeat("a b a b a b c".split(), 4) == 3
    assert longest_repeat("a a b".split(), 1) == 2
    assert longest_repeat("she sells sea shells by the sea shore".split(), 4) == 1
    # The same phrase said 5 times in a row, each time 3 words: only a 3-gram sees it.
    words = "x " + "go to bed " * 5
    assert longest_repeat(words.split(), 2) == 1 and longest_repeat(words.split(), 3) == 5
    assert "repeated_ngram" in text_reasons("we will " + "go to bed " * 5, 6.0, CFG)
    assert "repeated_ngram" not in text_reasons("we will go to bed, go to bed, go to bed now", 6.0, CFG)


def test_unique_word_share():
    words = "no no no yes yes no no yes yes no no no".split()
    assert unique_word_share(words) == pytest.approx(2 / 12)
    cfg = FiltersConfig(max_ngram_repeats=None, max_compression_ratio=None)
    assert text_reasons(" ".join(words), 5.0, cfg) == ["low_unique_words"]
    # Below unique_words_min_count words the share is not judged: "no no" is a real answer.
    assert text_reasons("no no", 1.0, cfg) == []


def test_very_long_word_and_words_of():
    assert words_of("It's a dog-day, isn't it?") == ["it's", "a", "dog", "day", "isn't", "it"]
    # Granary's limit: a word of 25 characters or more.
    assert "very_long_word" not in text_reasons("internationalization matters", 3.0, CFG)
    assert "very_long_word" not in text_reasons("a" * 24 + " indeed", 3.0, CFG)
    assert "very_long_word" in text_reasons("a" * 25 + " indeed", 3.0, CFG)
    # Chinese and Thai put no space between words: a clause is not one long word.
    clause = "我们今天在会议上讨论了关于明年公司发展战略的一些重要问题。"
    assert len(words_of(clause)[0]) > 25 and "very_long_word" not in text_reasons(clause, 6.0, CFG)
    thai = "ภาษาไทยเขียนติดกันโดยไม่มีช่องว่างระหว่างคำเลยครับ"
    assert "very_long_word" not in text_reasons(thai, 5.0, CFG)


def test_phrase_list():
    whole = FiltersConfig(phrases=["Thank you for watching"])
    assert text_reasons("Thank you for watching!", 2.0, whole) == ["phrase"]
    # Granary's rule: the whole text is the phrase; a sentence that holds it is speech.
    assert text_reasons("And thank you for watching the kids.", 2.0, whole) == []
    contains = FiltersConfig(phrases=["Thank you for watching"], phrase_match="contains")
    assert text_reasons("And thank you for watching the kids.", 2.0, contains) == ["phrase"]
    assert text_reasons("Thank you for your watching.", 2.0, contains) == []
    assert text_reasons("Thank you for watching!", 2.0, CFG) == []


def test_characters_per_second():
    # "hello world": 10 letters.
    assert text_reasons("hello world", 0.2, CFG) == ["too_fast"]       # 50 chars/s
    assert text_reasons("hello world", 20.0, CFG) == ["too_slow"]      # 0.5 chars/s
    assert text_reasons("hello world", 1.0, CFG) == []


def _row(texts, error=None, language=None):
    segs = [{"start": 2.0 * i, "end": 2.0 * i + 2.0, "text": t, "error": None, "words": None}
            for i, t in enumerate(texts)]
    return {"id": "r", "text": " ".join(t for t in texts if t), "segments": segs, "error": error,
            "language": language}


def test_row_reasons_empty_no_speech_language():
    assert row_reasons(_row([]), CFG) == ["no_speech"]
    assert mark_rows([_row(["", " "])], CFG)[0]["filter_reasons"] == ["empty"]
    # Whisper's "." on a second of silence has no word in it.
    assert mark_rows([_row(["."])], CFG)[0]["filter_reasons"] == ["empty"]
    cfg = FiltersConfig(language="en")
    assert row_reasons(_row(["guten morgen"], language="de"), cfg) == ["language_mismatch"]
    assert row_reasons(_row(["good morning"], language="EN"), cfg) == []
    assert row_reasons(_row(["good morning"]), cfg) == []          # no language known
    assert row_reasons(_row(["guten morgen"], language="de"), CFG) == []   # none expected


def test_mark_rows():
    loop, clean = _row(["fine words here", LOOP]), _row(["fine words here"])
    broken = _row([LOOP], error="cannot decode: x")
    pending = dict(_row([""]), pending_index=[0])
    mark_rows([loop, clean, broken, pending], CFG)
    assert loop["segments"][0]["filter_reasons"] == [] and "compression_ratio" in loop["segments"][1]["filter_reasons"]
    assert set(loop["segments"][1]["filter_reasons"]) == set(loop["filter_reasons"])
    assert clean["filter_reasons"] == [] and clean["segments"][0]["filter_reasons"] == []
    assert broken["filter_reasons"] == [] and broken["segments"][0]["filter_reasons"] == []
    assert "filter_reasons" not in pending


def test_filters_config_is_validated_in_one_place():
    cfg = load_config("ar", ["filters.phrases=[thank you for watching]", "filters.max_compression_ratio=null"])
    assert cfg.filters.phrases == ["thank you for watching"] and cfg.filters.max_compression_ratio is None
    for bad, key in [("filters.min_unique_word_share=2", "filters.min_unique_word_share"),
                     ("filters.max_chars_per_second=0", "filters.max_chars_per_second"),
                     ("filters.phrases=['']", "filters.phrases"),
                     ("filters.phrase_match=prefix", "filters.phrase_match"),
                     ("pseudo_label.max_utterance_s=0", "pseudo_label.max_utterance_s")]:
        with pytest.raises(ConfigError, match=key):
            load_config("ar", [bad])
