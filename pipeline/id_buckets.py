"""Id-keyed rows spilled to disk in hash buckets: the driver's checks over every id of a
corpus (duplicate ids, resume, the summary's reconciliation) read one bucket at a time, so
its memory does not grow with the corpus.

A row goes to the bucket of its id's *base*: the id less a distinct-id suffix
``~xxxxxxxx`` (eight hex digits, what resume appends to a recording whose id the output
already holds from another source; pipeline.resume), so an id and its suffixed variant
always meet in one bucket. Buckets are Arrow IPC streams in a temporary folder (under
TMPDIR), removed by ``close`` or when the object is collected.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BUCKETS = 64
SUFFIX_PATTERN = r"~[0-9a-f]{8}$"
FLUSH_ROWS = 1 << 16
# Random odd multipliers, one per byte position (mod 256): a cheap vectorised string hash
# whose only job is to spread ids evenly over the buckets.
_MULT = np.random.default_rng(0x5EED).integers(1, 2**63, 256, dtype=np.uint64) | np.uint64(1)


def _string_hash(arr: pa.Array) -> np.ndarray:
    """A uint64 hash of each string of ``arr`` (no nulls), computed over its buffers."""
    arr = arr.cast(pa.large_string()) if arr.type != pa.large_string() else arr
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    offsets = np.frombuffer(arr.buffers()[1], np.int64, n + 1, arr.offset * 8)
    data = arr.buffers()[2]
    lengths = np.diff(offsets)
    h = lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    total = int(offsets[-1] - offsets[0])
    if total:
        raw = np.frombuffer(data, np.uint8, total, int(offsets[0])).astype(np.uint64)
        starts = offsets[:-1] - offsets[0]
        pos = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
        products = (raw + np.uint64(1)) * _MULT[pos & 255]
        nonempty = lengths > 0
        h[nonempty] += np.add.reduceat(products, starts[nonempty])
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


def bucket_of(ids: pa.Array, buckets: int = BUCKETS) -> np.ndarray:
    """The bucket of each id (by its base: the id less a distinct-id suffix)."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    base = pc.replace_substring_regex(ids, pattern=SUFFIX_PATTERN, replacement="")
    return (_string_hash(base) % np.uint64(buckets)).astype(np.int64)


class IdBuckets:
    """Rows of ``schema`` (its ``id`` column a string) appended in pieces and spilled by
    bucket; ``read(b)`` gives bucket ``b``'s rows, in the order they were added."""

    def __init__(self, schema: pa.Schema, buckets: int = BUCKETS):
        self.schema, self.buckets = schema, buckets
        self.folder = tempfile.mkdtemp(prefix="shardscribe-ids-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)
        self._writers: dict[int, tuple] = {}     # bucket -> (writer, file)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.rows = 0
        self._finished = False

    def add(self, table: pa.Table) -> None:
        if self._finished:
            raise RuntimeError("IdBuckets: rows added after finish()")
        if table.num_rows:
            self._pending.append(table.select(self.schema.names).cast(self.schema))
            self._pending_rows += table.num_rows
            self.rows += table.num_rows
            if self._pending_rows >= FLUSH_ROWS:
                self._flush()

    def add_rows(self, columns: dict[str, list]) -> None:
        self.add(pa.table(columns, schema=self.schema))

    def _flush(self) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending).combine_chunks()
        self._pending, self._pending_rows = [], 0
        which = bucket_of(table.column("id"), self.buckets)
        order = np.argsort(which, kind="stable")
        table = table.take(pa.array(order))
        bounds = np.searchsorted(which[order], np.arange(self.buckets + 1))
        for b in range(self.buckets):
            lo, hi = int(bounds[b]), int(bounds[b + 1])
            if hi > lo:
                if b not in self._writers:
                    sink = pa.OSFile(self._path(b), "wb")
                    self._writers[b] = (pa.ipc.new_stream(sink, self.schema), sink)
                self._writers[b][0].write_table(table.slice(lo, hi - lo))

    def _path(self, b: int) -> str:
        return os.path.join(self.folder, f"{b:04d}.arrows")

    def finish(self) -> "IdBuckets":
        """Write what is pending; call before the first ``read``."""
        self._flush()
        self._finished = True
        for writer, sink in self._writers.values():
            writer.close()
            sink.close()
        self._writers.clear()
        return self

    def read(self, b: int) -> pa.Table:
        if not self._finished:
            self.finish()
        if not os.path.exists(self._path(b)):
            return self.schema.empty_table()
        with pa.OSFile(self._path(b), "rb") as source:
            return pa.ipc.open_stream(source).read_all().combine_chunks()

    def __iter__(self):
        for b in range(self.buckets):
            yield self.read(b)

    def close(self) -> None:
        self.finish()
        self._cleanup()
