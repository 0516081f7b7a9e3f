"""`shardscribe pseudo-label`: the keep rule, the cutting into utterances, the report's
numbers against hand computations, and one job (local runner, the embedded model with its
CTC head, so words carry times) over good, span and broken inputs, whose exports are read
back with the tools they are made for: the NeMo manifest against the audio (soundfile)
and the rows' segment times, the dataset folder with ``datasets.load_dataset``."""
from __future__ import annotations

import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from shardscribe.pipeline import output
from shardscribe.pipeline import pseudo_label as pl


def _stats(*rows):
    return [pl.row_stat(r) for r in rows]


def _row(i, conf, error=None, reasons=(), ref="a b c d", text="a b c d", words=None):
    """A row; ``words``: its word confidences (default: every word at the row's confidence)."""
    if words is None and conf is not None and text:
        words = [conf] * len(text.split())
    segs = [{"error": None, "words": [{"word": w, "confidence": c} for w, c in zip(text.split(), words)]}] \
        if words is not None else []
    return {"id": f"r{i}", "confidence": conf, "error": error, "filter_reasons": list(reasons),
            "reference": ref, "text": text, "segments": segs}


def test_keep_rule_never_keeps_bad_rows():
    rows = _stats(_row(0, 0.99, error="cannot decode: x"), _row(1, 0.98, reasons=["compression_ratio"]),
                  _row(2, 0.9), _row(3, 0.7), _row(4, 0.5), _row(5, None), _row(6, 0.6))
    assert pl.keep_flags(rows) == [False, False, True, True, True, True, True]
    assert pl.keep_flags(rows, min_confidence=0.6) == [False, False, True, True, False, False, True]
    # 5 eligible rows; F = 0.6 keeps the 3 most confident (the row without one cannot rank),
    # by either ranking (every row has 4 words here, so fewer expected errors = more confident).
    for rank_by in ("confidence", "excess_errors"):
        assert pl.keep_flags(rows, keep_fraction=0.6, rank_by=rank_by) == [False, False, True, True, False, False, True]
        assert pl.keep_flags(rows, keep_fraction=1.0, rank_by=rank_by) == [False, False, True, True, True, False, True]


def test_keep_fraction_keeps_the_rounded_share():
    """round(F x n) rows, halves up: 0.8 of 7 is 5.6, so 6 (floor kept 5)."""
    rows = _stats(*(_row(i, 0.9 - 0.1 * i) for i in range(7)))
    for rank_by in ("confidence", "excess_errors"):
        assert pl.keep_flags(rows, keep_fraction=0.8, rank_by=rank_by) == [True] * 6 + [False]
    assert [pl.kept_count(f, n) for f, n in ((0.8, 7), (0.5, 5), (0.5, 7), (0.29, 50), (0.1, 4), (1.0, 7))] == \
        [6, 3, 4, 15, 0, 7]


def test_excess_errors_ranking_by_hand():
    """Where P(no error) and expected excess errors disagree: a long row with one weak word
    against a short row with two middling ones. Hand values: long row (10 words, nine at
    0.99, one at 0.4): E = 0.09 + 0.6 = 0.69; short row (2 words at 0.7): E = 0.6; third row
    (4 words at 0.95): E = 0.2. w = 1.49 / 16; excess = E - w n: long 0.69 - 0.93125 =
    -0.24125, short 0.6 - 0.18625 = 0.41375, third 0.2 - 0.3725 = -0.1725."""
    long_ = _row(0, 0.35, ref=" ".join("abcdefghij"), text=" ".join("abcdefghij"), words=[0.99] * 9 + [0.4])
    short = _row(1, 0.49, ref="x y", text="x q", words=[0.7, 0.7])
    third = _row(2, 0.8, ref="p q r s", text="p q r s", words=[0.95] * 4)
    rows = _stats(long_, short, third)
    assert pl.expected_errors(pl.word_confidences(long_)) == (pytest.approx(0.69), 10)
    assert pl.rank_scores(rows) == pytest.approx([0.24125, -0.41375, 0.1725])
    # Keep 2 of 3: P(no error) drops the long row (most words, one error-prone word), the
    # excess ranking drops the short one.
    assert pl.keep_flags(rows, keep_fraction=0.67, rank_by="confidence") == [False, True, True]
    assert pl.keep_flags(rows, keep_fraction=0.67) == [True, False, True]
    curve = pl.kept_fraction_curve(rows)
    assert [p["wer"] for p in curve] == pytest.approx([0.0, 0.0, 1 / 16])
    assert [p["wer"] for p in pl.kept_fraction_curve(rows, "confidence")] == pytest.approx([0.0, 1 / 6, 1 / 16])
    with pytest.raises(ValueError, match="rank_by"):
        pl.rank_scores(rows, "nonsense")


def test_long_segment_is_cut_between_words():
    words = [{"word": f"w{i}", "start": 10.0 + i, "end": 10.0 + i + 0.6} for i in range(50)]
    row = {"id": "long", "audio": "/a.wav", "confidence": 0.9,
           "segments": [{"start": 10.0, "end": 60.0, "text": "ignored when cut", "error": None, "words": words},
                        {"start": 61.0, "end": 91.0, "text": "no word times", "error": None, "words": None},
                        {"start": 92.0, "end": 94.0, "text": "short one", "error": None, "words": None}]}
    utts, lost = pl.utterances(row, 20.0, offset_s=100.0)
    assert lost == 1                                   # the 30-s segment without word times
    assert utts[-1]["text"] == "short one" and utts[-1]["offset"] == 192.0 and utts[-1]["duration"] == 2.0
    cut = utts[:-1]
    assert " ".join(u["text"] for u in cut) == " ".join(w["word"] for w in words)
    assert all(u["duration"] <= 20.0 for u in cut) and len(cut) == 3
    assert cut[0]["offset"] == 110.0 and cut[-1]["offset"] + cut[-1]["duration"] == pytest.approx(160.0)
    for u in cut:                                      # every word lies inside its utterance
        for w in u["text"].split():
            i = int(w[1:])
            assert u["offset"] <= 100.0 + words[i]["start"] and 100.0 + words[i]["end"] <= u["offset"] + u["duration"]
    # Consecutive pieces meet in the middle of the pause between two words.
    assert cut[1]["offset"] == pytest.approx(cut[0]["offset"] + cut[0]["duration"])
    assert cut[1]["offset"] - 100.0 == pytest.approx((words[int(cut[1]["text"].split()[0][1:]) - 1]["end"]
                                                      + words[int(cut[1]["text"].split()[0][1:])]["start"]) / 2)


def test_a_long_segment_whose_words_have_no_times_is_left_out_and_counted():
    """An attention decoder's words without model.word_timestamps carry confidences and
    null times: no cut can be placed, so the segment is counted, not a crash."""
    words = [{"word": w, "start": None, "end": None, "confidence": 0.8} for w in "a b c d".split()]
    row = {"id": "r", "audio": "/a.wav", "confidence": 0.9,
           "segments": [{"start": 0.0, "end": 28.0, "text": "a b c d", "error": None, "words": words},
                        {"start": 29.0, "end": 31.0, "text": "fits", "error": None, "words": words[:1]}]}
    utts, lost = pl.utterances(row, 20.0)
    assert lost == 1 and [u["text"] for u in utts] == ["fits"]


def test_curve_and_reliability_by_hand(tmp_path):
    rows = _stats(_row(0, 0.95, ref="red green blue black", text="red green blue black"),   # 0 errors / 4
                  _row(1, 0.85, ref="red green blue black", text="red green blue white"),   # 1 / 4
                  _row(2, 0.15, ref="alpha beta", text="gamma delta"),                      # 2 / 2
                  _row(3, 0.99, error="cannot decode: x", ref="x y", text=None))
    curve = pl.kept_fraction_curve(rows)
    assert [p["kept_fraction"] for p in curve] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert [p["wer"] for p in curve] == pytest.approx([0.0, 1 / 8, 3 / 10])
    rel = pl.reliability(rows, 10)
    # Bins against rows with no error: 0.9-1.0 holds 1 (right) at 0.95, 0.8-0.9 holds 0 (one
    # error) at 0.85, 0.1-0.2 holds 0 at 0.15.
    assert [(b["low"], b["rows"], b["accuracy"]) for b in rel["bins"]] == [(0.1, 1, 0.0), (0.8, 1, 0.0), (0.9, 1, 1.0)]
    assert rel["ece"] == pytest.approx((0.15 + 0.85 + 0.05) / 3)
    # --keep-fraction 0.5 of the three good rows keeps round(1.5) = 2 rows (halves up): the
    # two most confident.
    kept = pl.keep_flags(rows, keep_fraction=0.5)
    assert kept == [True, True, False, False]
    data = pl.report_data(rows, kept, pl.UtteranceTally(), {"keep_fraction": 0.5}, 10)
    assert data["wer_all"] == pytest.approx(3 / 10) and data["wer_kept"] == pytest.approx(1 / 8)
    assert data["kept_point"] == {"kept_fraction": pytest.approx(2 / 3), "wer": pytest.approx(1 / 8)}
    written = pl.write_exports(str(tmp_path), [], data)
    assert (tmp_path / pl.PLOT_NAME).read_bytes()[:4] == b"\x89PNG" and len(written) == 4
    assert (tmp_path / pl.MANIFEST_NAME).read_text() == ""


def test_cli_checks_the_rule_before_running(capsys):
    from shardscribe.jobs.cli import main

    for bad in (["--min-confidence", "1.5"], ["--keep-fraction", "0"],
                ["--min-confidence", "0.5", "--keep-fraction", "0.5"]):
        with pytest.raises(SystemExit) as exc:
            main(["pseudo-label", "--input", "x", "--output", "y", *bad])
        assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.fixture(scope="module")
def job(tmp_path_factory, samples_dir, sample_manifest, model_cache):
    """One pseudo-label job over three samples, a NeMo span of a fourth, silence and broken
    files (the set of tests/test_broken_inputs.py, a missing file among them)."""
    from shardscribe.jobs.cli import main

    root = tmp_path_factory.mktemp("plabel")
    by_id = {m["id"]: m for m in sample_manifest}
    buf = io.BytesIO()
    sf.write(buf, np.zeros(24000, dtype=np.float32), 16000, format="WAV", subtype="PCM_16")
    broken = {"empty.wav": b"", "random.wav": bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8)),
              "text_renamed.flac": b"just some text, not audio\n" * 10, "silence.wav": buf.getvalue()}
    for name, data in broken.items():
        (root / name).write_bytes(data)
    lines = [{"id": i, "audio": str(samples_dir / by_id[i]["audio"]), "text": by_id[i]["text"]}
             for i in ("fox_flite_slt", "pump_flite_rms", "beckett_human")]
    lines.append({"id": "beckett_span", "audio_filepath": str(samples_dir / by_id["beckett_human"]["audio"]),
                  "offset": 2.0, "duration": 6.0})
    lines += [{"id": name, "audio": str(root / name)} for name in [*broken, "missing.wav"]]
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    dst = root / "out"
    code = main(["pseudo-label", "--input", str(manifest), "--output", str(dst), "--runner", "local",
                 "--config", "ctc_greedy", "--set", f"model.cache_dir={model_cache}",
                 "--set", "pseudo_label.max_utterance_s=4", "--set", "filters.phrases=[pump filter]",
                 "--set", "filters.phrase_match=contains"])
    rows = {r["id"]: r for r in pq.read_table(dst).to_pylist()}
    return {"code": code, "dst": dst, "rows": rows, "lines": lines, "spans": {"beckett_span": 2.0}}


def _utterances(dst):
    return pq.read_table(dst / pl.DATASET_FILE).to_pylist()


def test_job_keeps_rows_in_equal_rows_out_and_never_keeps_bad_rows(job):
    assert job["code"] == 0
    rows, dst = job["rows"], job["dst"]
    assert sorted(rows) == sorted(x["id"] for x in job["lines"])
    for bad in ("empty.wav", "random.wav", "text_renamed.flac", "missing.wav"):
        assert rows[bad]["error"] and rows[bad]["filter_reasons"] == []
    # Silence: a segment whose text is empty.
    assert rows["silence.wav"]["error"] is None and rows["silence.wav"]["filter_reasons"] == ["empty"]
    # The phrase filter, set on the command line, ran in the pass.
    assert "phrase" in rows["pump_flite_rms"]["filter_reasons"]
    assert rows["pump_flite_rms"]["segments"][0]["filter_reasons"] == ["phrase"]
    kept = {u["source_id"] for u in _utterances(dst)}
    assert kept == {"fox_flite_slt", "beckett_human", "beckett_span"}
    report = json.loads((dst / pl.REPORT_NAME).read_text())
    assert report["rows"] == len(job["lines"]) and report["errors"] == 4 and report["kept"] == 3
    assert report["kept_with_error"] == 0 and report["filter_reasons"] == {"phrase": 1, "empty": 1}
    # A CTC "word" longer than 4 s (two words run together) fits no utterance; it is counted.
    too_long = sum(1 for i in kept for s in rows[i]["segments"] if s["end"] - s["start"] > 4.0
                   for w in s["words"] if w["end"] - w["start"] > 4.0)
    assert report["left_out_too_long"] == too_long and report["longest_utterance_s"] <= 4.0
    assert (dst / pl.PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (dst / output.SUCCESS_NAME).exists()


def test_nemo_manifest_matches_the_audio_and_the_segments(job):
    dst, rows = job["dst"], job["rows"]
    lines = [json.loads(x) for x in (dst / pl.MANIFEST_NAME).read_text().splitlines()]
    utts = _utterances(dst)
    assert len(lines) == len(utts) >= 4
    audio_of = {x["id"]: x.get("audio") or x.get("audio_filepath") for x in job["lines"]}
    for line, utt in zip(lines, utts):
        assert set(line) >= {"audio_filepath", "offset", "duration", "text"} and line["text"].strip()
        assert line["audio_filepath"] == audio_of[utt["source_id"]]
        info = sf.info(line["audio_filepath"])
        assert 0.0 <= line["offset"] and line["offset"] + line["duration"] <= info.duration + 1e-3
        assert 0.0 < line["duration"] <= 4.0 + 1e-6
        # The span lies inside one of its row's segments, in file time.
        base = job["spans"].get(utt["source_id"], 0.0)
        segs = rows[utt["source_id"]]["segments"]
        assert any(base + s["start"] - 1e-3 <= line["offset"] and line["offset"] + line["duration"]
                   <= base + s["end"] + 1e-3 for s in segs), (line, segs)
        # It holds speech: the cut is read back at its offset and is not silence.
        samples, rate = sf.read(line["audio_filepath"], start=int(line["offset"] * info.samplerate),
                                frames=int(line["duration"] * info.samplerate))
        assert len(samples) > 0.9 * line["duration"] * rate and np.sqrt(np.mean(samples ** 2)) > 1e-3
    # The 10-s recordings were cut at word boundaries into pieces of at most 4 s, which
    # together hold their words, less any single word longer than that.
    for source in ("beckett_human", "beckett_span"):
        pieces = [u for u in utts if u["source_id"] == source]
        words = [w["word"].strip() for s in rows[source]["segments"] for w in s["words"]
                 if w["end"] - w["start"] <= 4.0]
        assert len(pieces) >= (2 if source == "beckett_human" else 1)
        assert " ".join(u["text"] for u in pieces).split() == words
    span = [u for u in utts if u["source_id"] == "beckett_span"]
    assert span and min(u["offset"] for u in span) >= 2.0 and max(u["offset"] + u["duration"] for u in span) <= 8.0 + 1e-3


def test_dataset_folder_loads_with_datasets(job, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    dst = job["dst"]
    loaded = datasets.load_dataset("parquet", data_dir=str(dst / pl.DATASET_DIR), split="train",
                                   cache_dir=str(tmp_path / "hf"))
    utts = _utterances(dst)
    assert loaded.num_rows == len(utts) and loaded["text"] == [u["text"] for u in utts]
    assert set(loaded.column_names) >= {"audio_filepath", "offset", "duration", "text", "confidence"}
    # DST itself still loads (every row; the exports in DST/__pseudo_label/ are skipped).
    everything = datasets.load_dataset("parquet", data_dir=str(dst), split="train", cache_dir=str(tmp_path / "hf2"))
    assert everything.num_rows == len(job["lines"]) and "filter_reasons" in everything.column_names


def test_export_streams_an_output_folder_written_by_hand(tmp_path, capsys):
    """The export over committed parts, without a model: a row whose audio came as bytes in
    a Parquet table has no file to point at (counted, not exported); a NeMo span is placed
    at its offset, from the output's ``offset_s`` or, in a part written before that column
    existed, from the manifest; a filtered row and an error row are never exported."""
    import argparse

    import pyarrow as pa

    from shardscribe.jobs.pseudo_label import export
    from shardscribe.pipeline.records import OUTPUT_SCHEMA, table

    def row(rid, audio, conf=0.9, offset=None, error=None, reasons=()):
        seg = {"start": 0.5, "end": 1.5, "text": "hello there", "error": None, "filter_reasons": list(reasons),
               "words": [{"word": "hello", "start": 0.5, "end": 0.9, "confidence": conf},
                         {"word": "there", "start": 1.0, "end": 1.5, "confidence": conf}]}
        return {"id": rid, "audio": audio, "offset_s": offset, "duration_s": 2.0, "text": "hello there",
                "confidence": conf, "error": error, "filter_reasons": list(reasons),
                "segments": [] if error else [seg]}

    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(pa.table({"audio": [b"RIFF....", None], "text": ["a", "b"]}), src / "data.parquet")
    dst = tmp_path / "out"
    dst.mkdir()
    table_file = str(src / "data.parquet")
    new = [row("t0", f"{table_file}#0"), row("file", "/a/b.wav"), row("span_new", "/a/long.wav", offset=10.0),
           row("bad", "/a/x.wav", error="cannot decode: x"), row("loop", "/a/y.wav", reasons=["repeated_ngram"])]
    pq.write_table(table(new, OUTPUT_SCHEMA), dst / "part-00000.parquet")
    # A part from before offset_s: its span's offset is only in the input manifest.
    old = table([row("span_old", "/a/long.wav")], OUTPUT_SCHEMA).drop_columns(["offset_s"])
    pq.write_table(old, dst / "part-00001.parquet")

    def run(input_uri):
        args = argparse.Namespace(input=input_uri, output=str(dst), audio_column=None, text_column=None,
                                  config="default", overrides=[], model=None, min_confidence=None,
                                  keep_fraction=None)
        assert export(args) == 0
        return [json.loads(x) for x in (dst / pl.MANIFEST_NAME).read_text().splitlines()], \
            json.loads((dst / pl.REPORT_NAME).read_text())

    lines, report = run(str(src))
    assert [x["audio_filepath"] for x in lines] == ["/a/b.wav", "/a/long.wav", "/a/long.wav"]
    assert [x["offset"] for x in lines] == [0.5, 10.5, 0.5]
    assert report["kept"] == 4 and report["left_out_no_audio_path"] == 1 and report["utterances"] == 3
    assert report["errors"] == 1 and report["filtered"] == 1 and report["utterance_seconds"] == 3.0
    assert [(u["source_id"], u["offset"], u["text"]) for u in _utterances(dst)] == \
        [("file", 0.5, "hello there"), ("span_new", 10.5, "hello there"), ("span_old", 0.5, "hello there")]

    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"id": "span_old", "audio_filepath": "/a/long.wav", "offset": 30.0,
                                    "duration": 5.0}) + "\n")
    lines, report = run(str(manifest))
    assert [x["offset"] for x in lines if x["audio_filepath"] == "/a/long.wav"] == [10.5, 30.5]
    assert report["left_out_no_audio_path"] == 0        # not a table input: t0's audio is a path


def test_curve_is_thinned_but_keeps_its_ends():
    rows = _stats(*[_row(i, 1.0 - i / 5000, ref="a b", text="a b" if i % 3 else "a c") for i in range(2500)])
    curve = pl.kept_fraction_curve(rows, "confidence")
    assert len(curve) <= pl.CURVE_POINTS + 1 and curve[-1]["kept_fraction"] == 1.0
    assert curve[-1]["wer"] == pytest.approx(sum(1 for i in range(2500) if not i % 3) / 5000)
    assert curve[0]["kept_fraction"] == pytest.approx(3 / 2500)     # a step of 3 rows


def test_filter_unit_segment_keeps_a_long_recording_without_its_flagged_segment():
    """A one-hour recording with one looping segment: filter_unit=row drops all of it,
    filter_unit=segment keeps its other segments; a reason about the whole row (the
    language) still drops it."""
    def seg(start, text, reasons=()):
        return {"start": start, "end": start + 2.0, "text": text, "error": None, "filter_reasons": list(reasons),
                "words": [{"word": w, "start": start, "end": start + 1.0, "confidence": 0.9} for w in text.split()]}

    segs = [seg(0.0, "good one"), seg(5.0, "loop loop loop loop", ["repeated_ngram"]), seg(9.0, "good two")]
    long_row = {"id": "long", "audio": "/a.wav", "confidence": 0.8, "error": None, "text": "x",
                "filter_reasons": ["repeated_ngram"], "segments": segs, "reference": None}
    foreign = dict(long_row, id="foreign", filter_reasons=["language_mismatch"], segments=segs[:1])
    silent = dict(long_row, id="silent", filter_reasons=["empty"], segments=[seg(0.0, " ", ["empty"])])
    stats = _stats(long_row, foreign, silent)
    assert pl.keep_flags(stats) == [False, False, False]
    assert pl.keep_flags(stats, filter_unit="segment") == [True, False, False]
    tally = pl.UtteranceTally()
    utts, _ = pl.utterances(long_row, 30.0, tally=tally)
    assert [u["text"] for u in utts] == ["good one", "good two"] and tally.left_out_filtered_segments == 1
    # The looping segment's words do not weigh on the row's expected errors.
    assert pl.expected_errors(pl.word_confidences(long_row)) == (pytest.approx(0.4), 4)
