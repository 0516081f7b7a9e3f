"""Row schemas between stages and of the output Parquet (the data contract in DESIGN.md).

One output row per input recording: the transcript, its segments with the stage that
produced each, the error (null when fine) and per-stage timings. Explicit Arrow schemas
keep blocks with only nulls or only errors compatible with the rest.
"""
from __future__ import annotations

import pyarrow as pa

SEGMENT_TYPE = pa.struct([
    ("start", pa.float64()), ("end", pa.float64()), ("text", pa.string()),
    ("stage", pa.string()), ("tokens", pa.int32()),
])

INPUT_SCHEMA = pa.schema([
    ("id", pa.string()), ("audio", pa.string()), ("audio_bytes", pa.binary()),
    ("reference", pa.string()), ("key_phrases", pa.list_(pa.string())),
])

PREPARED_SCHEMA = pa.schema([
    ("id", pa.string()), ("audio", pa.string()), ("reference", pa.string()),
    ("key_phrases", pa.list_(pa.string())), ("duration_s", pa.float64()),
    ("seg_start", pa.list_(pa.float64())), ("seg_end", pa.list_(pa.float64())),
    ("seg_audio", pa.list_(pa.list_(pa.float32()))), ("error", pa.string()),
    ("t_prepare_s", pa.float64()),
])

OUTPUT_SCHEMA = pa.schema([
    ("id", pa.string()), ("audio", pa.string()), ("duration_s", pa.float64()),
    ("text", pa.string()), ("reference", pa.string()), ("segments", pa.list_(SEGMENT_TYPE)),
    ("stage", pa.string()), ("error", pa.string()), ("decoder", pa.string()),
    ("t_prepare_s", pa.float64()), ("t_encode_s", pa.float64()), ("t_decode_s", pa.float64()),
])

ERROR_STAGE = "error"


def table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)


def recording_stage(segment_stages: list[str], error: str | None) -> str:
    if error:
        return ERROR_STAGE
    if not segment_stages:
        return "no_speech"
    first = segment_stages[0]
    return first if all(s == first for s in segment_stages) else "mixed"


def prepared_rows(batch: pa.Table) -> list[dict]:
    """Rows of a prepared table, with `seg_audio` as float32 numpy views (no Python floats)."""
    rows = batch.drop_columns(["seg_audio"]).to_pylist()
    column = batch.column("seg_audio").combine_chunks()
    for i, row in enumerate(rows):
        segs = column[i]
        if not segs.is_valid:
            row["seg_audio"] = []
            continue
        inner = segs.values  # ListArray of segments
        row["seg_audio"] = [inner[j].values.to_numpy(zero_copy_only=False) for j in range(len(inner))]
    return rows
