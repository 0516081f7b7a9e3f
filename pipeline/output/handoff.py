"""Parts written by the workers, committed by the driver: the output protocol's commit
split across processes, so that no row passes through the driver.

A worker (a Ray model actor) holds its finished rows and, once the commit policy says so
(``output.rows_per_part`` rows, or ``output.commit_interval_s`` since its last part),
writes them as one part under a temporary name of the job (``.tmp-<job>-<worker>-<name>``)
and reports the temporary name, the final name and the ids: nothing else. The driver,
which holds the folder's lock, makes the part visible: it checks its fence and renames
(:func:`commit_written`), exactly as a part written in its own process is committed
(write, check, rename). So the guarantee is the same:

- a part the driver never renamed is not in the output (a worker that died after writing
  it, a report lost with its worker): its rows are redone, and the temporary file is
  removed at the job's end (:func:`remove_uncommitted`) or by the next job's sweep;
- a rename after another job took the folder over is refused (LockLost), and a temporary
  file that job swept fails the rename;
- a part's name is a function of its ids, so a part committed twice replaces itself.

The worker's temporary name carries a nonce of its own: a worker restarted with the same
rows, or a paused one, never writes over another's file.
"""
from __future__ import annotations

import posixpath
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from .layout import TMP_PREFIX
from .lock import _fence, _rename_fenced
from .parts import part_name
from ..storage import url_to_fs


@dataclass(frozen=True)
class WrittenPart:
    """A part a worker wrote and has not made visible: its temporary file and final name
    (both relative to DST) and the ids it holds, by the work unit they came from."""
    tmp: str
    name: str
    ids: dict          # unit number -> [ids]
    rows: int


class PartBuffer:
    """A worker's finished rows until the commit policy writes them as one part (same
    policy as pipeline.output.PartCommitter). ``unit``: the work unit each table came
    from, so the driver knows which units a part completes."""

    def __init__(self, dst: str, job_id: str, rows_per_part: int, interval_s: float | None,
                 options: dict | None = None, clock=time.monotonic):
        self.dst, self.job_id, self.options = dst, job_id, options
        self.rows_per_part, self.interval_s, self._clock = rows_per_part, interval_s, clock
        self.nonce = uuid.uuid4().hex[:8]
        self._tables: list[pa.Table] = []
        self._units: list[int] = []
        self.rows = 0
        self._since = clock()

    def add(self, table: pa.Table, units: list[int]) -> None:
        """``table``'s rows, and the work unit of each."""
        if table.num_rows:
            self._tables.append(table)
            self._units.append(units)
            self.rows += table.num_rows

    def due(self) -> bool:
        return self.rows >= self.rows_per_part or (
            self.rows > 0 and self.interval_s is not None and self._clock() - self._since >= self.interval_s)

    def write(self) -> WrittenPart | None:
        """Write what is held as one temporary part (no rename: the driver commits it)."""
        self._since = self._clock()
        if not self._tables:
            return None
        ids: dict[int, list[str]] = {}
        for t, units in zip(self._tables, self._units):
            for rid, unit in zip(t.column("id").to_pylist(), units):
                ids.setdefault(unit, []).append(rid)
        data = pa.concat_tables(self._tables)
        name = part_name([i for unit_ids in ids.values() for i in unit_ids])
        tmp = f"{TMP_PREFIX}{self.job_id}-{self.nonce}-{name}"
        fs, path = url_to_fs(self.dst, self.options)
        fs.makedirs(path, exist_ok=True)
        with fs.open(posixpath.join(path, tmp), "wb") as fh:
            pq.write_table(data, fh, write_page_checksum=True)
        self._tables, self._units, self.rows = [], [], 0
        return WrittenPart(tmp, name, ids, data.num_rows)


def commit_written(dst: str, job_id: str, part: WrittenPart, options: dict | None = None) -> None:
    """Make a worker's part visible: check this process's lock on DST, then rename
    (LockLost where the job no longer holds the folder; the temporary file is removed)."""
    fs, path = url_to_fs(dst, options)
    tmp = posixpath.join(path, part.tmp)
    lock = _fence(fs, path, job_id, tmp=tmp)
    _rename_fenced(fs, path, tmp, posixpath.join(path, part.name), lock)


def remove_uncommitted(dst: str, job_id: str, options: dict | None = None) -> int:
    """Remove the job's temporary parts that were never committed (their workers died
    after writing them); returns how many. Called once every worker has stopped."""
    fs, path = url_to_fs(dst, options)
    fs.invalidate_cache(path)
    prefix = f"{TMP_PREFIX}{job_id}-"
    stale = [p for p in fs.ls(path, detail=False) if posixpath.basename(p).startswith(prefix)] \
        if fs.exists(path) else []
    for p in stale:
        fs.rm(p)
    return len(stale)
