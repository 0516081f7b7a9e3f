"""Parts and the commits: how rows become visible in DST, and how a job ends.

- A part is written under a temporary name (``.tmp-<job>-<part>``) and renamed when
  complete, so a part that exists under its final name is whole. Page checksums are
  written with it, so resume tells a page-corrupt part from a good one.
- Its name is a hash of the ids it holds (``part-<sha256>.parquet``): a commit redone with
  the same rows (a write interrupted and flushed again) writes the same name and replaces
  its own part instead of adding a second copy. Only those names are parts: any other
  Parquet file in the folder is never read as rows, quarantined or removed.
- When to commit is :class:`PartCommitter`'s one policy for both runners: a part once
  ``output.rows_per_part`` rows are pending or ``output.commit_interval_s`` has passed
  since the last commit.
- Every commit is fenced by the folder's lock (pipeline.output.lock): temporary file,
  check, rename.
- A job starting in the folder removes the success marker first (:func:`begin_job`), so
  it never outlives a change, and with it the temporary files of dead jobs. The job commit
  (:func:`commit_job`) writes the summary and then the success marker, last.
- ``--overwrite`` removes the parts, the exports and the sidecar files, but not the lock
  (:func:`clear_output`).
"""
from __future__ import annotations

import hashlib
import json
import posixpath
import re
import time

import pyarrow as pa
import pyarrow.parquet as pq

from .layout import (CLAIM_PREFIX, LOCK_NAME, PART_PREFIX, SIDECAR_DIR, SUCCESS_NAME,
                     SUMMARY_NAME, TMP_PREFIX)
from .lock import _fence, _held_lock, _rename_fenced
from ..storage import url_to_fs


def part_name(ids) -> str:
    """The part's name: a function of the set of ids it holds, nothing else."""
    # JSON, not a separator join: ids may hold any character, NUL included, and two sets
    # must never encode alike (a name collision would replace one part with the other).
    digest = hashlib.sha256(json.dumps(sorted(ids)).encode()).hexdigest()
    return f"{PART_PREFIX}{digest[:32]}.parquet"


def _is_part(path: str) -> bool:
    # Only our own names: any other Parquet file in the folder (a user's table, an input)
    # is never read as rows, quarantined or removed by --overwrite.
    name = posixpath.basename(path)
    return name.startswith(PART_PREFIX) and name.endswith(".parquet")


def _parts(fs, path: str) -> list[str]:
    """Committed parts directly under ``path`` (not in the sidecar folder, no temporary files)."""
    # Object-store listings are cached per filesystem; other processes wrote the parts.
    fs.invalidate_cache(path)
    if not fs.exists(path):
        return []
    return sorted(p for p in fs.ls(path, detail=False) if _is_part(p))


def write_part(table: pa.Table, dst: str, job_id: str, options: dict | None = None) -> str:
    """Write ``table`` as one part of ``dst``: temporary name, then rename. Returns the
    part's name. Page checksums let resume tell a page-corrupt part from a good one."""
    fs, path = url_to_fs(dst, options)
    name = part_name(table.column("id").to_pylist())
    fs.makedirs(path, exist_ok=True)
    _put_part(fs, path, name, table, job_id)
    return name


def _put_part(fs, path: str, name: str, table: pa.Table, job_id: str) -> None:
    """``table`` as the part ``name`` of the folder ``path``: written under this job's
    temporary name, checked against the folder's lock (LockLost where this process holds
    it no more), then renamed over any part of that name."""
    tmp = posixpath.join(path, f"{TMP_PREFIX}{job_id}-{name}")
    with fs.open(tmp, "wb") as fh:
        pq.write_table(table, fh, write_page_checksum=True)
    lock = _fence(fs, path, job_id, tmp=tmp)
    _rename_fenced(fs, path, tmp, posixpath.join(path, name), lock)


class PartCommitter:
    """A job's finished rows, committed as parts (:func:`write_part`) once ``rows_per_part``
    rows are pending or ``interval_s`` has passed since the last commit, whichever comes
    first (``interval_s`` None: by count only). The one commit policy of both runners: a
    killed job loses the rows since its last commit, about ``interval_s`` of work (or one
    batch, where a batch takes longer), not up to ``rows_per_part`` rows.

    The interval runs from the last commit, not from a batch's arrival, so a batch that
    takes longer than it is committed as soon as it is added. A part committed at the
    interval may hold few rows; that is the price of the bound."""

    def __init__(self, dst: str, job_id: str, rows_per_part: int, interval_s: float | None,
                 options: dict | None = None, clock=time.monotonic):
        self.dst, self.job_id, self.options = dst, job_id, options
        self.rows_per_part, self.interval_s, self._clock = rows_per_part, interval_s, clock
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.committed_rows = 0
        self.committed_parts = 0
        self._committed_at = clock()

    def add(self, table: pa.Table) -> None:
        """Hold ``table``'s rows: from now on a :meth:`flush` (an interrupt's included)
        commits them. Call :meth:`commit_if_due` after."""
        if table.num_rows:
            self._pending.append(table)
            self._pending_rows += table.num_rows

    def commit_if_due(self) -> None:
        """Commit what is pending if the policy says so."""
        if self._pending_rows >= self.rows_per_part or (
                self.interval_s is not None and self._clock() - self._committed_at >= self.interval_s):
            self.flush()

    def flush(self) -> None:
        """Commit every pending row as one part now (the job's end, an interrupt)."""
        if self._pending:
            write_part(pa.concat_tables(self._pending), self.dst, self.job_id, self.options)
            self.committed_rows += self._pending_rows
            self.committed_parts += 1
            self._pending, self._pending_rows = [], 0
        self._committed_at = self._clock()


def clear_output(dst: str, options: dict | None = None, exports: tuple[str, ...] = ()) -> int:
    """Remove DST's parts, the export folders ``exports`` (pipeline.formats.export_dirs),
    and the sidecar files (``--overwrite``), except the lock (LOCK and its claims); returns
    the parts removed. Refused (LockLost) where this process's job no longer holds the folder."""
    fs, path = url_to_fs(dst, options)
    _fence(fs, path)
    parts = _parts(fs, path)
    for part in parts:
        fs.rm(part)
    for folder in exports:     # made from the rows just removed
        if fs.exists(posixpath.join(path, folder)):
            fs.rm(posixpath.join(path, folder), recursive=True)
    side = posixpath.join(path, SIDECAR_DIR)
    held = _held_lock(fs, path)
    mine = f"{TMP_PREFIX}{held.job_id}-" if held is not None else None
    for p in fs.ls(side, detail=False) if fs.exists(side) else []:
        name = posixpath.basename(p.rstrip("/"))
        lock_file = name == posixpath.basename(LOCK_NAME) or re.fullmatch(re.escape(CLAIM_PREFIX) + r"\d+", name)
        if not lock_file and not (mine and name.startswith(mine)):     # nor the heartbeat's temporary LOCK
            fs.rm(p, recursive=True)
    return len(parts)


def begin_job(dst: str, job_id: str, options: dict | None = None) -> None:
    """With the lock held: the folder is about to change, so its success marker goes, and
    temporary files of dead jobs (no other job can be live here) are removed."""
    fs, path = url_to_fs(dst, options)
    _fence(fs, path, job_id)
    marker = posixpath.join(path, SUCCESS_NAME)
    if fs.exists(marker):
        fs.rm(marker)
    for p in fs.ls(path, detail=False) if fs.exists(path) else []:
        name = posixpath.basename(p)
        if name.startswith(TMP_PREFIX) and not name.startswith(f"{TMP_PREFIX}{job_id}-"):
            fs.rm(p)


def _write_atomic(fs, path: str, data: bytes, folder: str | None = None) -> None:
    """``data`` as ``path``: temporary name, then rename; fenced by the lock this process
    holds on ``folder`` (the output folder), if any."""
    lock = _held_lock(fs, folder) if folder is not None else None
    scope = f"{lock.job_id}-" if lock is not None else ""
    tmp = posixpath.join(posixpath.dirname(path), f"{TMP_PREFIX}{scope}{posixpath.basename(path)}")
    with fs.open(tmp, "wb") as fh:
        fh.write(data)
    if folder is not None:
        lock = _fence(fs, folder, tmp=tmp)
    _rename_fenced(fs, path, tmp, path, lock)


def commit_job(dst: str, summary: dict, success: bool, options: dict | None = None) -> None:
    """The job commit: the summary, then the success marker (only when every input row has
    exactly one output row), last. Each is refused (LockLost) where this process's job no
    longer holds the folder."""
    fs, path = url_to_fs(dst, options)
    _fence(fs, path)
    fs.makedirs(posixpath.join(path, SIDECAR_DIR), exist_ok=True)
    _write_atomic(fs, posixpath.join(path, SUMMARY_NAME), json.dumps(summary, indent=2).encode(), path)
    if success:
        _write_atomic(fs, posixpath.join(path, SUCCESS_NAME), b"", path)
