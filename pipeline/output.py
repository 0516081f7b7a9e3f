"""Output directory: resume by input id, reconciliation and the job summary.

Parquet parts are written with fresh names on every run, so a rerun must not decode a
recording that already has a row: we read the `id` column of the parts already in DST and
skip those ids. A part that cannot be read (a run killed mid-write) is moved aside to
`<name>.corrupt` and its rows are redone.

Everything that is not a Parquet part (the summary, the job log, subtitles, the report)
lives in one folder, ``SIDECAR_DIR``, so that every standard reader opens DST as a
dataset: pyarrow and pandas skip paths starting with ``_`` or ``.``, but Hugging Face
``datasets.load_dataset("parquet", data_dir=DST)`` reads every file beside the parts
(a top-level ``_summary.json`` or ``_SUCCESS`` breaks it) and skips only ``.`` names and
folders whose name starts with ``__``.
"""
from __future__ import annotations

import json
import logging
import posixpath
import re

import fsspec
import pyarrow.parquet as pq

from pipeline.metrics import corpus_wer

log = logging.getLogger(__name__)
SIDECAR_DIR = "__shardscribe__"
SUMMARY_NAME = f"{SIDECAR_DIR}/summary.json"


def _parts(fs, path: str) -> list[str]:
    if not fs.exists(path):
        return []
    return sorted(p for p in fs.find(path) if p.endswith(".parquet") and f"/{SIDECAR_DIR}/" not in p)


def sidecar_path(dst: str, name: str) -> str:
    """URL of ``name`` in DST's sidecar folder (any fsspec URL)."""
    return posixpath.join(dst.rstrip("/"), SIDECAR_DIR, name)


def existing_config_hashes(dst: str) -> dict[str | None, int]:
    """Rows already in DST per ``config_hash`` (None: parts written before the column)."""
    fs, path = fsspec.core.url_to_fs(dst)
    counts: dict[str | None, int] = {}
    for part in _parts(fs, path):
        try:
            schema = pq.read_schema(part, filesystem=fs)
            if "config_hash" in schema.names:
                values = pq.read_table(part, columns=["config_hash"], filesystem=fs).column(0).to_pylist()
            else:
                values = [None] * pq.read_metadata(part, filesystem=fs).num_rows
        except Exception:
            continue  # existing_ids moves unreadable parts aside
        for v in values:
            counts[v] = counts.get(v, 0) + 1
    return counts


def clear_output(dst: str) -> int:
    """Remove DST's parts and sidecar folder (``--overwrite``); returns the parts removed."""
    fs, path = fsspec.core.url_to_fs(dst)
    parts = _parts(fs, path)
    for part in parts:
        fs.rm(part)
    side = posixpath.join(path, SIDECAR_DIR)
    if fs.exists(side):
        fs.rm(side, recursive=True)
    return len(parts)


def error_kind(message: str) -> str:
    """The kind of an ``error`` message: its words before the first colon or parenthesis
    ("file not found: x.wav" -> "file not found")."""
    head = re.split(r"[:(]", message or "", maxsplit=1)[0].strip()
    return head or "error"


def existing_ids(dst: str) -> set[str]:
    fs, path = fsspec.core.url_to_fs(dst)
    ids: set[str] = set()
    for part in _parts(fs, path):
        try:
            ids.update(pq.read_table(part, columns=["id"], filesystem=fs).column("id").to_pylist())
        except Exception as exc:
            log.warning("unreadable output part %s (%s); moving it aside and redoing its rows", part, exc)
            fs.mv(part, part + ".corrupt")
    return ids


def read_output(dst: str, columns: list[str]):
    import pyarrow as pa

    fs, path = fsspec.core.url_to_fs(dst)
    tables = [pq.read_table(p, columns=columns, filesystem=fs) for p in _parts(fs, path)]
    return pa.concat_tables(tables) if tables else None


def summarize(dst: str, input_ids: list[str], run: dict, run_ids: set[str] | None = None) -> dict:
    """Reconcile DST against the input and write summary.json; returns the summary.

    ``run`` holds this run's facts (``wall_seconds`` among them); the RTFx of the run is
    the audio of the rows it decoded (``run_ids``) over that wall time."""
    out = read_output(dst, ["id", "duration_s", "text", "reference", "stage", "error"])
    rows = out.to_pylist() if out is not None else []
    wanted = set(input_ids)
    out_ids = [r["id"] for r in rows if r["id"] in wanted]
    missing = sorted(wanted - set(out_ids))
    stages: dict[str, int] = {}
    for r in rows:
        stages[r["stage"]] = stages.get(r["stage"], 0) + 1
    refs = [(r["reference"], r["text"] or "") for r in rows if r["reference"] and not r["error"]]
    summary = {
        "rows_in": len(input_ids),
        "rows_out": len(out_ids),
        "duplicate_rows": len(out_ids) - len(set(out_ids)),
        "missing_ids": missing[:20],
        "errors": sum(1 for r in rows if r["error"]),
        "errors_by_kind": _count(error_kind(r["error"]) for r in rows if r["error"]),
        "stages": stages,
        "audio_seconds": sum(r["duration_s"] or 0.0 for r in rows),
        "wer": corpus_wer([a for a, _ in refs], [b for _, b in refs]) if refs else None,
        "wer_rows": len(refs),
        **run,
    }
    run_audio = sum(r["duration_s"] or 0.0 for r in rows if run_ids and r["id"] in run_ids)
    wall = run.get("wall_seconds") or 0.0
    summary["run_audio_seconds"] = run_audio
    summary["rtfx"] = run_audio / wall if run_ids and wall > 0 else None
    fs, path = fsspec.core.url_to_fs(dst)
    fs.makedirs(posixpath.join(path, SIDECAR_DIR), exist_ok=True)
    with fs.open(posixpath.join(path, SUMMARY_NAME), "w") as fh:
        json.dump(summary, fh, indent=2)
    return summary


def read_summary(dst: str) -> dict:
    fs, path = fsspec.core.url_to_fs(dst)
    with fs.open(posixpath.join(path, SUMMARY_NAME)) as fh:
        return json.load(fh)


def _count(items) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
