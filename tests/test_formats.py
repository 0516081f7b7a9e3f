"""Subtitle and manifest outputs: SRT and WebVTT read back with real parsers (srt,
webvtt-py), every cue within the length limits, in time order without overlap, and no
word lost or reordered; JSON, TSV, plain text and the NeMo manifest from a real output
folder."""
from __future__ import annotations

import io
import json
import random

import pyarrow.parquet as pq
import pytest
import srt
import webvtt

from shardscribe.pipeline.formats import (
    MAX_CHARS,
    MAX_CUE_S,
    MIN_CUE_S,
    captions,
    parse_formats,
    safe_name,
    segment_words,
    to_srt,
    to_vtt,
    write_formats,
)
from shardscribe.pipeline.records import OUTPUT_SCHEMA, table

WORDS = ("the pump was checked twice before lunch and the readings were normal except for one tank "
         "which was drained cleaned and refilled supercalifragilisticexpialidociousnessandthensomemoreletters "
         "okay. Then the team left.").split()


def _segments(rng: random.Random, with_words: bool) -> list[dict]:
    """Segments as VAD cuts them: up to 30 s, gaps between them; some with word times."""
    segs, t = [], rng.uniform(0, 2)
    for _ in range(rng.randint(1, 5)):
        n = rng.randint(0, 60)
        words = [rng.choice(WORDS) for _ in range(n)]
        length = rng.uniform(0.5, 30.0)
        seg = {"start": t, "end": t + length, "text": " ".join(words), "stage": "ar", "error": None}
        if with_words and words:
            cuts = sorted(rng.uniform(t, t + length) for _ in range(2 * len(words)))
            seg["words"] = [{"word": w, "start": cuts[2 * i], "end": cuts[2 * i + 1]} for i, w in enumerate(words)]
        segs.append(seg)
        t += length + rng.uniform(0.0, 3.0)
    return segs


def _check(cues_parsed: list[tuple[float, float, str]], segments: list[dict]) -> None:
    words = " ".join(s["text"] for s in segments).split()
    text = " ".join(c[2] for c in cues_parsed).split()
    # Words longer than a line are cut into pieces: compare the letters in order.
    assert "".join(text) == "".join(words)
    for start, end, content in cues_parsed:
        assert 0 < end - start <= MAX_CUE_S + 1e-3, (start, end, content)
        lines = content.split("\n")
        assert 1 <= len(lines) <= 2 and all(0 < len(line) <= MAX_CHARS for line in lines), lines
    for (s0, e0, _), (s1, _, _) in zip(cues_parsed, cues_parsed[1:]):
        assert s0 < s1 and e0 <= s1 + 1e-6


@pytest.mark.parametrize("seed", range(12))
def test_captions_parse_and_keep_the_limits(seed):
    rng = random.Random(seed)
    segments = _segments(rng, with_words=seed % 2 == 0)
    cues = captions(segments)
    parsed_srt = [(c.start.total_seconds(), c.end.total_seconds(), c.content)
                  for c in srt.parse(to_srt(cues))]
    parsed_vtt = [(_secs(c.start), _secs(c.end), c.text) for c in webvtt.from_buffer(io.StringIO(to_vtt(cues)))]
    assert len(parsed_srt) == len(parsed_vtt) == len(cues)
    for parsed in (parsed_srt, parsed_vtt):
        _check(parsed, segments)
    # Each cue lies within the segment its words came from, except that a short one stays
    # on screen for MIN_CUE_S (into the pause after its segment).
    for c in cues:
        assert any(s["start"] - 1e-3 <= c.start and c.end <= max(s["end"], c.start + MIN_CUE_S) + 1e-3
                   for s in segments)


def _secs(stamp: str) -> float:
    h, m, s = stamp.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def test_measured_word_times_are_used_and_others_split_by_characters():
    seg = {"start": 10.0, "end": 14.0, "text": "ab abcd", "words": None}
    words, measured = segment_words(seg)
    # 3 and 5 characters (with their space) of 8 share the 4 s.
    assert not measured and [(w, round(s, 6), round(e, 6)) for w, s, e in words] == \
        [("ab", 10.0, 11.5), ("abcd", 11.5, 14.0)]
    seg["words"] = [{"word": " ab", "start": 10.2, "end": 10.4}, {"word": "abcd", "start": 12.0, "end": 13.0}]
    assert segment_words(seg) == ([("ab", 10.2, 10.4), ("abcd", 12.0, 13.0)], True)
    (cue,) = captions([seg])
    assert (cue.start, cue.end, cue.text) == (10.2, 13.0, "ab abcd")


def test_a_sentence_end_closes_a_long_enough_cue():
    seg = {"start": 0.0, "end": 6.0, "text": "Ever tried, ever failed. No matter, try again."}
    assert [c.text for c in captions([seg])] == ["Ever tried, ever failed.", "No matter, try again."]


def test_format_names_and_file_names():
    assert parse_formats("srt, VTT,srt,txt") == ["srt", "vtt", "txt"]
    with pytest.raises(ValueError, match="--format docx"):
        parse_formats("srt,docx")
    taken: set[str] = set()
    names = [safe_name(i, taken) for i in ("a/b.wav", "a_b.wav", "../x#12.5", "")]
    assert names == ["a_b.wav", "a_b.wav-2", "x_12.5", "recording"]


def test_write_formats_from_an_output_folder(tmp_path):
    rows = [
        {"id": "dir/one.wav", "audio": "/data/dir/one.wav", "duration_s": 4.0, "text": "hello there. general",
         "reference": "Hello there, general.", "stage": "ar", "error": None,
         "segments": [{"start": 0.5, "end": 3.5, "text": "hello there. general", "stage": "ar"}]},
        {"id": "bad.wav", "audio": "/data/bad.wav", "duration_s": None, "text": None, "reference": None,
         "stage": "error", "error": "file not found: /data/bad.wav", "segments": []},
        # a NeMo span of a long file: the manifest must say where it starts
        {"id": "/data/long.wav#600", "audio": "/data/long.wav", "offset_s": 600.0, "duration_s": 30.0,
         "text": "later on", "reference": None, "stage": "ar", "error": None,
         "segments": [{"start": 1.0, "end": 2.0, "text": "later on", "stage": "ar"}]},
    ]
    pq.write_table(table(rows, OUTPUT_SCHEMA), tmp_path / "part-0.parquet")
    written = write_formats(str(tmp_path), ["srt", "vtt", "json", "tsv", "txt", "nemo"])
    # beside the parts, each format in its "__" folder
    assert written == ["__srt/", "__vtt/", "__json/", "__tsv/", "__txt/", "__nemo/manifest.nemo.jsonl"]
    side = {fmt: tmp_path / f"__{fmt}" for fmt in ("srt", "vtt", "json", "tsv", "txt", "nemo")}
    subs = list(srt.parse((side["srt"] / "dir_one.wav.srt").read_text()))
    assert [s.content for s in subs] == ["hello there. general"]
    assert (side["srt"] / "bad.wav.srt").read_text() == ""
    doc = json.loads((side["json"] / "dir_one.wav.json").read_text())
    assert doc["word_times"] == "proportional" and [w["word"] for w in doc["segments"][0]["words"]] == \
        ["hello", "there.", "general"]
    assert json.loads((side["json"] / "bad.wav.json").read_text())["error"].startswith("file not found")
    assert (side["tsv"] / "dir_one.wav.tsv").read_text() == "start\tend\ttext\n500\t3500\thello there. general\n"
    # txt: the recording's text alone, one file per recording beside the other formats
    assert sorted(p.name for p in side["txt"].iterdir()) == ["bad.wav.txt", "data_long.wav_600.txt", "dir_one.wav.txt"]
    assert (side["txt"] / "dir_one.wav.txt").read_text() == "hello there. general\n"
    assert (side["txt"] / "bad.wav.txt").read_text() == ""
    nemo = [json.loads(line) for line in (side["nemo"] / "manifest.nemo.jsonl").read_text().splitlines()]
    assert nemo[0] == {"audio_filepath": "/data/dir/one.wav", "duration": 4.0, "text": "Hello there, general.",
                       "pred_text": "hello there. general", "id": "dir/one.wav"}
    # the unreadable file has no duration, which NeMo's readers need: it is left out
    assert [x["id"] for x in nemo] == ["dir/one.wav", "/data/long.wav#600"]
    assert nemo[1]["offset"] == 600.0 and nemo[1]["duration"] == 30.0 and nemo[1]["audio_filepath"] == "/data/long.wav"


def test_a_word_with_no_length_keeps_its_cue():
    """Whisper's last word often ends where it starts: its cue gets screen time instead of
    being dropped, and a cue squeezed to nothing shows its words with the next one."""
    words = [("It", 0.0, 0.3), ("rained", 0.3, 0.8), ("all", 0.8, 1.0), ("day", 1.0, 1.3), ("and", 1.3, 1.5),
             ("night.", 1.5, 2.0), ("Yes.", 2.0, 2.0)]
    seg = {"start": 0.0, "end": 2.0, "text": " ".join(w for w, _, _ in words), "stage": "ar",
           "words": [{"word": w, "start": a, "end": b} for w, a, b in words]}
    subs = list(srt.parse(to_srt(captions([seg]))))
    assert " ".join(s.content for s in subs).split() == [w for w, _, _ in words]
    assert all(s.end > s.start for s in subs)
    # two segments that start at the same instant, the first with no length
    same = [{"start": 5.0, "end": 5.0, "text": "first", "stage": "ar"},
            {"start": 5.0, "end": 6.0, "text": "second", "stage": "ar"}]
    assert [(c.start, c.end, c.lines) for c in captions(same)] == [(5.0, 6.0, ["first", "second"])]


def test_vtt_escapes_markup_characters():
    cues = captions([{"start": 0.0, "end": 2.0, "text": "AT&T <3 you > me", "stage": "ar"}])
    vtt = to_vtt(cues)
    assert "AT&amp;T &lt;3 you &gt; me" in vtt
    parsed = webvtt.read_buffer(io.StringIO(vtt))
    assert len(parsed.captions) == 1


def test_long_ids_get_short_distinct_names(tmp_path):
    taken: set[str] = set()
    a, b = "中文字幕" * 40 + "-a", "中文字幕" * 40 + "-b"
    na, nb = safe_name(a, taken), safe_name(b, taken)
    assert na != nb and len(na.encode()) <= 200 and len(nb.encode()) <= 200
    assert safe_name(a, set()) == na           # a name depends on its id, not on the order
    row = {"id": a, "audio": "/x.wav", "duration_s": 1.0, "text": "ünïcödé text", "reference": None,
           "stage": "ar", "error": None, "segments": [{"start": 0.0, "end": 1.0, "text": "ünïcödé text"}]}
    pq.write_table(table([row], OUTPUT_SCHEMA), tmp_path / "part-0.parquet")
    write_formats(str(tmp_path), ["srt", "json"])
    (out,) = (tmp_path / "__json").iterdir()
    assert json.loads(out.read_text(encoding="utf-8"))["text"] == "ünïcödé text"
