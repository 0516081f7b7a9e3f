"""The summary a job commits (``__shardscribe__/summary.json``), and the kinds of error rows.

- :func:`summarize` reconciles DST against the job's input: rows in and out, duplicates,
  missing ids, rows of other inputs (``extra_rows``), errors by kind, stages, audio, WER
  and this run's own figures. It reads the output a batch at a time and spills both sides
  by bucket (pipeline.id_buckets), so the driver holds one bucket of ids at a time. The
  job commit (pipeline.output.parts.commit_job) writes it, before the success marker.
- :func:`error_kind` maps an ``error`` message to one word of ERROR_KINDS by the fixed
  phrase it starts with, never by its path or detail, so a job's error kinds are a
  bounded set.
"""
from __future__ import annotations

import json
import posixpath
import re
from typing import Collection

import pyarrow as pa
import pyarrow.compute as pc

from ..id_buckets import IdBuckets
from ..metrics import word_error_counts
from .layout import SUMMARY_NAME
from .readers import _part_tables
from .resume import wanted_ids
from ..storage import url_to_fs

# The kinds of ``error`` a row can have: summary.json's ``errors_by_kind`` and the report's
# error table have these keys and no others, however many files fail in however many ways.
ERROR_KINDS = ("missing", "unreadable", "empty", "corrupt", "unsupported", "too_long", "timeout",
               "model_error", "other")
# What each error message starts with, in order (the first match wins). Messages put their
# fixed phrase first and the path or detail after it, so a kind never depends on a path.
# An AudioError's ``kind`` is the kind its message maps to here (tests check both ways).
_KIND_RULES = tuple((re.compile(pattern, re.IGNORECASE), kind) for pattern, kind in (
    (r"(missing|unreadable|empty|corrupt|unsupported|too_long|timeout|model_error|other):", None),  # "kind: ..."
    (r"file not found\b|no audio in \S+ \(null\)|offset \S+ s is at or past the end", "missing"),
    (r"cannot read\b|no audio bytes\b|file name is not valid UTF-8\b", "unreadable"),
    (r"empty file\b|audio has zero samples\b", "empty"),
    (r"cannot decode audio: unsupported\b|unsupported (sample rate|channel count)\b|MP3 without a length header\b",
     "unsupported"),
    (r"too long:", "too_long"),
    (r"read timeout\b", "timeout"),
    (r"cannot decode\b|truncated or corrupt\b|audio contains NaN\b", "corrupt"),
    # pipeline.segment_runner: "<Exception> while decoding: ...", "<Exception> in <finisher>: ..."
    (r"[A-Za-z_][\w.]* (while decoding|in [\w.-]+):", "model_error"),
))


def error_kind(message: str) -> str:
    """The kind of an ``error`` message: one word of ERROR_KINDS, from the fixed phrase the
    message starts with ("file not found: /a/x.wav" -> "missing", "cannot read /a/x.wav:
    [Errno 13] ..." -> "unreadable"); "other" for a message no rule knows. Never any part of
    the path or detail, so the kinds of a job's errors are a bounded set."""
    text = (message or "").lstrip()
    for pattern, kind in _KIND_RULES:
        found = pattern.match(text)
        if found:
            return kind or found.group(1).lower()
    return "other"


# What summarize keeps of each output row, spilled by bucket: text and reference only for
# a row whose WER counts.
_SUMMARY_SCHEMA = pa.schema([("id", pa.string()), ("duration_s", pa.float64()), ("stage", pa.string()),
                             ("kind", pa.string()), ("text", pa.string()), ("reference", pa.string()),
                             ("mismatch", pa.bool_())])
# The filter reason the closing lines warn about (pipeline.filters: speech in a language
# the model does not transcribe), counted in the summary's one pass over the rows.
LANGUAGE_MISMATCH = "language_mismatch"


def _summary_rows(dst: str, options: dict | None, untranscribed: Collection[str] = ()) -> IdBuckets:
    spill = IdBuckets(_SUMMARY_SCHEMA)
    skipped = pa.array(sorted(untranscribed), pa.string())
    for table in _part_tables(dst, ["id", "duration_s", "text", "reference", "stage", "error", "filter_reasons"],
                              options, 8192):
        errors = table.column("error").to_pylist()
        # A row of an untranscribed stage (shardscribe validate's) has no transcript to score.
        scored = pc.and_(pc.and_(pc.is_valid(table.column("reference")), pc.is_null(table.column("error"))),
                         pc.fill_null(pc.invert(pc.is_in(table.column("stage").cast(pa.string()), value_set=skipped)),
                                      True))
        scored = pc.and_(scored, pc.fill_null(pc.not_equal(table.column("reference"), ""), False))
        spill.add(pa.table({
            "id": table.column("id"), "duration_s": table.column("duration_s"), "stage": table.column("stage"),
            "kind": pa.array([error_kind(e) if e else None for e in errors], pa.string()),
            "text": pc.if_else(scored, pc.fill_null(table.column("text"), ""), None),
            "reference": pc.if_else(scored, table.column("reference"), None),
            "mismatch": pa.array([LANGUAGE_MISMATCH in (r or ()) for r in table.column("filter_reasons").to_pylist()],
                                 pa.bool_())}))
    return spill.finish()


def summarize(dst: str, input_ids, run: dict, run_ids: set[str] | None = None,
              options: dict | None = None, untranscribed: Collection[str] = ()) -> dict:
    """Reconcile DST against the input; returns the summary (``commit_job`` writes it).

    ``input_ids``: the input's ids (a list, with ``run_ids`` the ones this run read), or
    an IdBuckets of WANTED_SCHEMA (a job's: pipeline.resume). ``run`` holds this run's
    facts (``wall_seconds`` among them); the RTFx of the run is the audio of the rows it
    read over that wall time. ``untranscribed``: segment stages whose rows carry no
    transcript (the decoder kinds say which: pipeline.kinds.registry), left out of the
    WER. The output is read a batch at a time and both sides are spilled by bucket
    (pipeline.id_buckets): the driver holds one bucket of ids at a time."""
    wanted = input_ids if isinstance(input_ids, IdBuckets) else wanted_ids(input_ids, run_ids)
    found = _summary_rows(dst, options, untranscribed)
    rows_in = wanted.rows
    rows_out = duplicates = errors = run_rows = run_errors = extra = wer_errors = wer_words = wer_rows = mismatched = 0
    audio = run_audio = 0.0
    any_run = False
    stages: dict[str, int] = {}
    kinds: dict[str, int] = {}
    missing: list[str] = []
    try:
        for b in range(wanted.buckets):
            want, got = wanted.read(b), found.read(b)
            # Rows of ids this input does not hold (an earlier job's, into the same folder)
            # are counted, not described: the summary is about this input.
            mine = got.filter(pc.is_in(got.column("id"), value_set=want.column("id")))
            extra += got.num_rows - mine.num_rows
            rows_out += mine.num_rows
            duplicates += mine.num_rows - (pc.count_distinct(mine.column("id")).as_py() if mine.num_rows else 0)
            audio += pc.sum(mine.column("duration_s")).as_py() or 0.0
            for name, counter in (("stage", stages), ("kind", kinds)):
                counted = pc.value_counts(mine.column(name))
                for value, n in zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()):
                    if value is not None:
                        counter[value] = counter.get(value, 0) + n
            errors += pc.count(mine.column("kind")).as_py()
            mismatched += pc.sum(mine.column("mismatch")).as_py() or 0
            ran = want.filter(want.column("run")).column("id")
            any_run = any_run or len(ran) > 0
            theirs = mine.filter(pc.is_in(mine.column("id"), value_set=ran))
            run_rows += theirs.num_rows
            run_errors += pc.count(theirs.column("kind")).as_py()
            run_audio += pc.sum(theirs.column("duration_s")).as_py() or 0.0
            refs = mine.filter(pc.is_valid(mine.column("reference")))
            if refs.num_rows:
                e, w = word_error_counts(refs.column("reference").to_pylist(), refs.column("text").to_pylist())
                wer_errors, wer_words, wer_rows = wer_errors + e, wer_words + w, wer_rows + refs.num_rows
            lacking = want.column("id").filter(pc.invert(pc.is_in(want.column("id"), value_set=mine.column("id"))))
            if len(lacking):
                missing = sorted(missing + pc.take(lacking, pc.sort_indices(lacking)[:20]).to_pylist())[:20]
    finally:
        found.close()
        if wanted is not input_ids:
            wanted.close()
    summary = {
        "rows_in": rows_in,
        "rows_out": rows_out,
        "duplicate_rows": duplicates,
        "missing_ids": missing,
        "extra_rows": extra,
        "errors": errors,
        "errors_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "stages": stages,
        "audio_seconds": audio,
        "wer": wer_errors / wer_words if wer_words else None,
        "wer_rows": wer_rows,
        LANGUAGE_MISMATCH: mismatched,
        **run,
    }
    wall = run.get("wall_seconds") or 0.0
    summary["run_rows_out"] = run_rows
    summary["run_errors"] = run_errors
    summary["run_audio_seconds"] = run_audio
    summary["rtfx"] = run_audio / wall if any_run and wall > 0 else None
    return summary


def read_summary(dst: str, options: dict | None = None) -> dict:
    fs, path = url_to_fs(dst, options)
    with fs.open(posixpath.join(path, SUMMARY_NAME)) as fh:
        return json.load(fh)


def summary_exists(dst: str, options: dict | None = None) -> bool:
    """Whether a job committed in ``dst`` (it writes the summary at its end)."""
    fs, path = url_to_fs(dst, options)
    return fs.exists(posixpath.join(path, SUMMARY_NAME))
