"""A job's start: one read of every part, quarantine, and ``--retry-errors``' rewrites.

- A job's start reads every part once, whole (all columns, page checksums verified;
  :func:`scan_output`), for all it needs: the config check, the rows already done (id and
  source, spilled to disk by bucket: pipeline.id_buckets), the error rows
  ``--retry-errors`` removes, the parts that fail. Nothing is moved or written by the read.
- Once the job is sure to run (holding the lock), a part that fails is moved to the
  quarantine folder and its rows are redone (:func:`quarantine_unreadable`). Only final
  part names are ever moved: temporary files belong to the job that holds the lock, and
  leftovers of a dead job are removed only by the job that took its lock over
  (pipeline.output.lock).
- ``--retry-errors`` removes the error rows of the job's input before the job starts, by
  rewriting their parts whole under their own names (:func:`drop_error_rows`,
  :func:`drop_rows`; temporary name, fence, rename, as any part), so those recordings are
  transcribed again and never have two rows.
- The input side of the summary's reconciliation (:func:`wanted_ids`), spilled the same way.
"""
from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..id_buckets import IdBuckets
from .layout import QUARANTINE_DIR
from .lock import _fence
from .parts import _parts, _put_part
from .readers import read_part
from ..storage import url_to_fs

log = logging.getLogger(__name__)


def _quarantine(fs, path: str, part: str, job_id: str, reason: Exception) -> None:
    target = posixpath.join(path, QUARANTINE_DIR, f"{posixpath.basename(part)}.{job_id}")
    _fence(fs, path, job_id)
    log.warning("unreadable output part %s (%s: %s); moved to %s and its rows will be redone",
                posixpath.basename(part), type(reason).__name__, str(reason)[:200], target)
    fs.makedirs(posixpath.dirname(target), exist_ok=True)
    fs.mv(part, target)


# Columns of the first output version: a part without them is not one of ours.
_COLUMNS_SINCE_FIRST = ("id", "audio", "duration_s", "text", "segments", "stage", "error")
# A stored row's id and source (what resume matches an input row by), whether it holds an
# error, and its part (an index into OutputScan.parts).
_SCAN_SCHEMA = pa.schema([("id", pa.string()), ("audio", pa.string()), ("stamp", pa.string()),
                          ("offset_s", pa.float64()), ("error", pa.bool_()), ("part", pa.int32())])


@dataclass
class OutputScan:
    """DST's committed parts as a job's start judges them, from one read of each part.

    - ``index``: every row of the parts that read whole (page checksums verified) and hold
      every column of the first output version, spilled to disk by bucket
      (pipeline.id_buckets): its ``id`` and source (``audio``, ``audio_stamp`` as ``stamp``,
      ``offset_s``), whether it holds an ``error``, and its ``part`` (an index into
      ``parts``). These rows are what the job may find done (pipeline.resume).
    - ``unreadable``: the other parts, and why; resume quarantines them and redoes their rows.
    - ``config_hashes``: rows per ``config_hash`` (None: parts written before the column),
      over every part that reads at all, unreadable ones included: their rows are another
      config's all the same, and a refused job leaves them where they are.
    """
    parts: list[str]
    index: IdBuckets
    unreadable: dict[str, Exception]
    config_hashes: dict[str | None, int]

    @property
    def rows(self) -> pa.Table:
        """``index`` whole, in memory: for small folders (tests, tools)."""
        tables = [t for t in self.index if t.num_rows]
        return pa.concat_tables(tables) if tables else _SCAN_SCHEMA.empty_table()

    @property
    def row_count(self) -> int:
        return self.index.rows

    def done_ids(self) -> pa.Array:
        """The distinct ids of ``rows`` (in memory: for small folders)."""
        return pc.unique(self.rows.column("id"))

    def close(self) -> None:
        self.index.close()


def scan_output(dst: str, options: dict | None = None) -> OutputScan:
    """Read each committed part of ``dst`` once, whole, and judge it as resume does;
    nothing is moved or written (a dry run and a refused job use it too). The caller
    closes the scan (its spill folder)."""
    fs, path = url_to_fs(dst, options)
    parts = _parts(fs, path)
    spill, unreadable, counts = IdBuckets(_SCAN_SCHEMA), {}, {}
    for index, part in enumerate(parts):
        rows, hashes, reason = _scan_part(fs, part, index)
        for value, n in hashes.items():
            counts[value] = counts.get(value, 0) + n
        if reason is None:
            spill.add(rows)
        else:
            unreadable[part] = reason
    return OutputScan(parts, spill.finish(), unreadable, counts)


def _column_or_nulls(table: pa.Table, name: str, type_: pa.DataType):
    return table.column(name).cast(type_) if name in table.column_names else pa.nulls(table.num_rows, type_)


def _scan_part(fs, part: str, index: int) -> tuple[pa.Table | None, dict[str | None, int], Exception | None]:
    """(the part's ``OutputScan.rows``, its rows per config_hash, why resume rejects it)."""
    try:
        # One GET of the whole file from an object store; a Parquet reader over the open
        # file asks for the footer first, then for the rest.
        with fs.open(part, "rb") as fh:
            data = pa.py_buffer(fh.read())
    except Exception as exc:
        return None, {}, exc
    try:
        table = pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
    except Exception as exc:
        try:
            # Pages that fail their checksum may still decode: their config's rows count.
            return None, _config_hash_counts(pq.read_table(pa.BufferReader(data))), exc
        except Exception:
            return None, {}, exc
    hashes = _config_hash_counts(table)
    missing = set(_COLUMNS_SINCE_FIRST) - set(table.column_names)
    if missing:
        return None, hashes, ValueError(f"columns missing: {sorted(missing)}")
    rows = pa.table([table.column("id"), table.column("audio").cast(pa.string()),
                     _column_or_nulls(table, "audio_stamp", pa.string()),
                     _column_or_nulls(table, "offset_s", pa.float64()), pc.is_valid(table.column("error")),
                     pa.repeat(pa.scalar(index, pa.int32()), table.num_rows)], schema=_SCAN_SCHEMA)
    return rows, hashes, None


def _config_hash_counts(table: pa.Table) -> dict[str | None, int]:
    if "config_hash" not in table.column_names:
        return {None: table.num_rows} if table.num_rows else {}
    counted = pc.value_counts(table.column("config_hash"))
    return dict(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()))


def quarantine_unreadable(dst: str, scan: OutputScan, job_id: str, options: dict | None = None) -> None:
    """Move the parts ``scan`` found unreadable to the quarantine folder; their rows are
    redone. Call it only while holding the folder's lock, once the job is sure to run."""
    fs, path = url_to_fs(dst, options)
    for part, reason in scan.unreadable.items():
        _quarantine(fs, path, part, job_id, reason)


def drop_error_rows(dst: str, scan: OutputScan, ids: pa.Array, job_id: str,
                    options: dict | None = None) -> OutputScan:
    """Remove the committed rows of ``ids`` that hold an ``error`` (``--retry-errors``), so
    that the job finds those recordings missing and transcribes them again; returns the
    scan as the folder now is (those rows gone). Call it only while holding the folder's
    lock.

    Only the parts ``scan`` found holding such rows are read again, whole, and each is
    rewritten whole under its own name (temporary name, then rename, as any part), so a
    crash leaves either the old part or the new one: its error rows are retried by the
    next run, or they are gone and the recordings are missing, which a rerun redoes. A
    recording never has two rows. The rewritten part keeps its name, the hash of the ids it
    was written with: no later block can hold those ids again (they are done), so no write
    can collide with it. A part that no longer reads is quarantined, and its rows redone."""
    rows = scan.rows
    retried = pc.and_(rows.column("error"), pc.is_in(rows.column("id"), value_set=ids))
    hits = rows.filter(retried)
    if not hits.num_rows:
        return scan
    lost = drop_rows(dst, scan, hits, job_id, options)
    gone = pc.or_(retried, pc.is_in(rows.column("part"), value_set=pa.array(lost, pa.int32())))
    index = IdBuckets(_SCAN_SCHEMA)
    index.add(rows.filter(pc.invert(gone)))
    return replace(scan, index=index.finish())


def drop_rows(dst: str, scan: OutputScan, hits: pa.Table, job_id: str, options: dict | None = None) -> list[int]:
    """Remove the committed error rows ``hits`` (columns ``part``, ``id``: pipeline.resume
    found them, ``--retry-errors``) by rewriting their parts whole, as drop_error_rows does;
    returns the parts (indices into ``scan.parts``) that no longer read and were
    quarantined: their rows are redone."""
    fs, path = url_to_fs(dst, options)
    lost = []
    for index in pc.unique(hits.column("part")).to_pylist():
        part = scan.parts[index]
        try:
            table = read_part(fs, part)
        except Exception as exc:
            _quarantine(fs, path, part, job_id, exc)
            lost.append(index)
            continue
        mine = hits.filter(pc.equal(hits.column("part"), index)).column("id").combine_chunks()
        drop = pc.and_(pc.is_valid(table.column("error")), pc.is_in(table.column("id"), value_set=mine))
        kept = table.filter(pc.invert(drop))
        if kept.num_rows:
            _put_part(fs, path, posixpath.basename(part), kept, job_id)
        else:
            _fence(fs, path, job_id)
            fs.rm(part)
    return lost


# The input side of summarize: each id the input holds, and whether this run read it.
WANTED_SCHEMA = pa.schema([("id", pa.string()), ("run", pa.bool_())])


def wanted_ids(input_ids, run_ids=None) -> IdBuckets:
    """``input_ids`` (and whether each is in ``run_ids``) spilled as summarize reads them."""
    ids = [str(i) for i in input_ids]
    spill = IdBuckets(WANTED_SCHEMA)
    spill.add_rows({"id": ids, "run": [bool(run_ids) and i in run_ids for i in ids]})
    return spill.finish()
