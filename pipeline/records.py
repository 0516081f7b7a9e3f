"""Row schemas between stages and of the output Parquet (the data contract in DESIGN.md).

One output row per input recording: the transcript, its segments with the stage that
produced each, the error (null when fine) and per-stage timings. Explicit Arrow schemas
keep blocks with only nulls or only errors compatible with the rest.
"""
from __future__ import annotations

import time

import pyarrow as pa

# Per segment: the text, the stage that produced it (ar / ctc_greedy / ctc_gate /
# llm_verify / ar_fallback / beam / error) and its evidence: max CTC frame entropy (nats,
# valid frames), min verified token probability, accepted prefix length j, decoder tokens
# drafted and generated; ``words`` [{word, start, end}] (seconds in the recording) where
# the decoder has an alignment (the CTC decoders, Whisper with model.word_timestamps),
# else null; ``filter_reasons``: the pseudo-label filters it fails (pipeline.filters; []
# when it passes or errored). ``start``/``end`` are always the VAD segment's; a Whisper
# decode with model.timestamps also cuts the segment's text into ``spans``
# [{start, end, text}] (seconds in the recording) at its timestamp tokens, else null.
# ``language`` and ``language_prob``: the language Whisper decoded in (model.language)
# and, where it was detected (auto), its probability among the language tokens.
# ``confidence``: the calibrated P(word correct) of a word, P(no error) of a segment and of
# a row (pipeline.confidence); null where there is no evidence (errors, empty text).
WORD_TYPE = pa.struct([("word", pa.string()), ("start", pa.float64()), ("end", pa.float64()),
                       ("confidence", pa.float64())])
SPAN_TYPE = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string())])
SEGMENT_TYPE = pa.struct([
    ("start", pa.float64()), ("end", pa.float64()), ("text", pa.string()),
    ("stage", pa.string()), ("tokens", pa.int32()), ("max_entropy", pa.float64()),
    ("min_prob", pa.float64()), ("prefix_len", pa.int32()), ("drafted", pa.int32()),
    ("generated", pa.int32()), ("error", pa.string()), ("words", pa.list_(WORD_TYPE)),
    ("filter_reasons", pa.list_(pa.string())),
    ("spans", pa.list_(SPAN_TYPE)), ("language", pa.string()), ("language_prob", pa.float64()),
    ("confidence", pa.float64()),
])

# offset_s / duration_s: the span of the file that is the recording (NeMo manifests'
# offset and duration); null: from the start / to the end. error: what the source
# already knows is wrong with the row (a file name that is not UTF-8); the row goes
# through the plan as an error row. audio_stamp: "<size>:<mtime>" of a listed audio file
# as its folder's listing showed it (null for manifest and table rows); the output row
# keeps it, and resume compares it (pipeline.resume).
INPUT_SCHEMA = pa.schema([
    ("id", pa.string()), ("audio", pa.string()), ("audio_bytes", pa.binary()),
    ("reference", pa.string()), ("key_phrases", pa.list_(pa.string())),
    ("offset_s", pa.float64()), ("duration_s", pa.float64()), ("error", pa.string()),
    ("audio_stamp", pa.string()),
])

PREPARED_SCHEMA = pa.schema([
    ("id", pa.string()), ("audio", pa.string()), ("reference", pa.string()),
    ("key_phrases", pa.list_(pa.string())), ("offset_s", pa.float64()), ("duration_s", pa.float64()),
    ("seg_start", pa.list_(pa.float64())), ("seg_end", pa.list_(pa.float64())),
    ("seg_audio", pa.list_(pa.list_(pa.float32()))), ("error", pa.string()),
    ("t_prepare_s", pa.float64()), ("audio_stamp", pa.string()),
    # A long recording leaves the audio stage in pieces (pipeline.prepare_stream): the
    # piece's number, the count of pieces (on the last one only) and the share of the
    # recording it covers; a recording in one piece: 0, 1, 1.0 (null: the same).
    ("piece", pa.int32()), ("pieces", pa.int32()), ("share", pa.float64()),
])

OUTPUT_SCHEMA = pa.schema([
    # offset_s: where the recording starts in ``audio`` (a NeMo span; null: at the start);
    # duration_s: the seconds decoded from there (null for a row that failed to decode).
    ("id", pa.string()), ("audio", pa.string()), ("offset_s", pa.float64()), ("duration_s", pa.float64()),
    ("text", pa.string()), ("reference", pa.string()), ("segments", pa.list_(SEGMENT_TYPE)),
    ("stage", pa.string()), ("error", pa.string()), ("decoder", pa.string()),
    ("t_prepare_s", pa.float64()), ("t_encode_s", pa.float64()), ("t_decode_s", pa.float64()),
    ("t_fallback_s", pa.float64()),
    # Which configuration made the row (pipeline.config.config_hash) and when it was
    # finished (Unix seconds): a rerun with another config is told apart, and the report
    # plots throughput over time from it.
    ("config_hash", pa.string()), ("finished_at", pa.float64()),
    # The pseudo-label filters the row fails: its own and its segments' (pipeline.filters);
    # [] when it passes, and for an error row (never kept in any case).
    ("filter_reasons", pa.list_(pa.string())),
    # The recording's language (Whisper, model.language set): the one its segments'
    # speech was decoded in the longest; with auto, the duration-weighted mean of those
    # segments' detection probabilities. Null otherwise.
    ("language", pa.string()), ("language_prob", pa.float64()),
    ("confidence", pa.float64()),
    # The source's "<size>:<mtime>" where its listing had them (INPUT_SCHEMA); with the
    # id, audio and offset_s it is what resume matches a row by. Null in rows written
    # before the column, and for manifest and table rows: resume then matches by the rest.
    ("audio_stamp", pa.string()),
])

# Between a model pool and a second pool: the segments still waiting, each with its
# decoder's pending state packed by that state's own class (pipeline.kinds.base
# PendingState: safetensors bytes) and travelling through the object store (the CPU
# offload of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts"). The
# prepare stage's error and the row's key phrases ride along for the second stage.
PENDING_FIELDS = [
    ("pending_index", pa.list_(pa.int32())),
    # large_binary: 64-bit offsets, so a block of long segments' states may pass 2 GiB.
    ("pending_state", pa.list_(pa.large_binary())),
    ("prepare_error", pa.string()),
    ("key_phrases", pa.list_(pa.string())),
]
INTERMEDIATE_SCHEMA = pa.schema(list(OUTPUT_SCHEMA) + PENDING_FIELDS)

ERROR_STAGE = "error"


def table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)


def segment_dict(start: float, end: float, res) -> dict:
    """One ``segments`` entry of an output row from a decoder's SegmentResult."""
    return {"start": start, "end": end, "text": res.text, "stage": res.stage,
            "tokens": res.tokens, "max_entropy": res.max_entropy, "min_prob": res.min_prob,
            "prefix_len": res.prefix_len, "drafted": res.drafted, "generated": res.generated,
            "error": res.error, "words": shift_words(res.words, start, end),
            "spans": shift_words(res.spans, start, end),
            "language": res.language, "language_prob": res.language_prob,
            "confidence": getattr(res, "confidence", None)}


def shift_words(words: list[dict] | None, offset: float, end: float) -> list[dict] | None:
    """Segment-relative word (or span) times -> recording times (null times stay null),
    kept inside the segment [``offset``, ``end``]: a decoder times a word in model frames,
    and the model's last frame also covers the padding after the audio, so a last word's
    end (or a word in that frame) can fall past the segment and the recording."""
    if words is None:
        return None
    return [{**w, "start": _recording_time(w.get("start"), offset, end),
             "end": _recording_time(w.get("end"), offset, end)} for w in words]


def _recording_time(t: float | None, offset: float, end: float) -> float | None:
    if t is None:
        return None
    # clamped after rounding, so that rounding cannot step outside the segment either
    return min(max(round(t + offset, 3), offset), end)


def recording_language(segments: list[dict]) -> tuple[str | None, float | None]:
    """(language, probability) of a recording from its segments' (records.OUTPUT_SCHEMA)."""
    seconds: dict[str, float] = {}
    for sg in segments:
        if sg.get("language"):
            seconds[sg["language"]] = seconds.get(sg["language"], 0.0) + max(sg["end"] - sg["start"], 1e-3)
    if not seconds:
        return None, None
    language = max(seconds, key=seconds.get)
    probs = [(sg["language_prob"], max(sg["end"] - sg["start"], 1e-3)) for sg in segments
             if sg.get("language") == language and sg.get("language_prob") is not None]
    if not probs:
        return language, None
    return language, sum(p * w for p, w in probs) / sum(w for _, w in probs)


def finalize_row(row: dict) -> dict:
    """Fill text, stage and error of an output row from its segments."""
    segments = row["segments"]
    error = row.get("prepare_error") or next((sg["error"] for sg in segments if sg.get("error")), None)
    row["error"] = error
    row["text"] = None if error else " ".join(sg["text"] for sg in segments if sg["text"])
    row["stage"] = recording_stage([sg["stage"] for sg in segments], error)
    row["language"], row["language_prob"] = (None, None) if error else recording_language(segments)
    return row


def stamp(rows: list[dict], config_hash: str) -> list[dict]:
    """Mark ``rows`` as made by the config ``config_hash``, finished now."""
    now = time.time()
    for row in rows:
        row["config_hash"], row["finished_at"] = config_hash, now
    return rows


def clear_pending(row: dict) -> None:
    for key in ("pending_index", "pending_state"):
        row[key] = []


def recording_stage(segment_stages: list[str], error: str | None) -> str:
    if error:
        return ERROR_STAGE
    if not segment_stages:
        return "no_speech"
    first = segment_stages[0]
    return first if all(s == first for s in segment_stages) else "mixed"


def rows_with_arrays(batch: pa.Table, column: str) -> list[dict]:
    """Rows of ``batch`` with the list<list<float32>> ``column`` as numpy arrays (no Python
    floats)."""
    columns = [column] if column in batch.column_names else []
    rows = batch.drop_columns(columns).to_pylist()
    for col in columns:
        values = batch.column(col).combine_chunks()
        for i, row in enumerate(rows):
            segs = values[i]
            if not segs.is_valid:
                row[col] = []
                continue
            inner = segs.values
            row[col] = [inner[j].values.to_numpy(zero_copy_only=False) for j in range(len(inner))]
    return rows


def prepared_rows(batch: pa.Table) -> list[dict]:
    return rows_with_arrays(batch, "seg_audio")
