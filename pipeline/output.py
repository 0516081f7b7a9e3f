"""The output folder's commit protocol: parts, lock, resume, quarantine and job commit.

- A part is written under a temporary name (``.tmp-<job>-<part>``) and renamed when
  complete, so a part that exists under its final name is whole.
- Its name is a hash of the ids it holds (``part-<sha256>.parquet``): a commit redone with
  the same rows (a write interrupted and flushed again) writes the same name and replaces
  its own part instead of adding a second copy.
- When to commit is :class:`PartCommitter`'s one policy for both runners: a part once
  ``output.rows_per_part`` rows are pending or ``output.commit_interval_s`` has passed
  since the last commit.
- One job at a time holds the lock, and every commit is fenced by it (below). A second
  job into the same folder is refused; a lock whose heartbeat stopped, or whose process is
  gone in the reader's own PID namespace, is stale and taken over.
- A job's start reads every part once, whole (all columns, page checksums verified;
  :func:`scan_output`), for all it needs: the config check, the rows already done (id and
  source, spilled to disk by bucket: pipeline.id_buckets), the error rows
  ``--retry-errors`` removes, the parts that fail. Once the job is sure to
  run, a part that fails is moved to the quarantine folder and its rows are redone. Only
  final part names are ever moved: temporary files belong to the job that holds the
  lock, and leftovers of a dead job are removed only by the job that took its lock over.
- The job commit writes the summary and then the success marker, last; a job starting in
  the folder removes the marker first, so it never outlives a change.
- ``--retry-errors`` removes the error rows of the job's input before the job starts, by
  rewriting their parts whole (:func:`drop_error_rows`), so those recordings are
  transcribed again and never have two rows.

Everything that is not a part is kept out of the Parquet readers' way: pyarrow and pandas
skip ``_`` and ``.`` names, but Hugging Face ``datasets.load_dataset("parquet",
data_dir=DST)`` reads every file under DST (a top-level ``_SUCCESS`` or a file in a
``_srt/`` folder breaks it) and skips only ``.`` names and files in ``__`` folders. So the
job's own files (summary, success marker, lock, quarantine, the job log, the report) live
in one folder, ``SIDECAR_DIR``; what is made from the rows for people and other tools (the
``--format`` files, the pseudo-label exports) sits beside the parts, one ``__<name>``
folder each (:func:`export_dir`); temporary parts start with ``.``.

The lock and the fence (exactly once against paused writers and containers)
---------------------------------------------------------------------------
The lock is two kinds of sidecar object:

- ``LOCK.<epoch>``, the *claim*: created with the storage's exclusive create (below) by
  the job that takes the folder, holding its job id. The epoch is one more than any the
  folder shows (the highest claim, LOCK's own), so it grows with every takeover; of two
  jobs claiming one epoch exactly one succeeds. The claim with the highest epoch is the
  holder, and nothing else is: a job *owns* the folder while the highest claim is its own
  (epoch and job id). The taker removes the claims below its own.
- ``LOCK``, the holder's description for everyone else: job, epoch, host, boot id
  (``/proc/sys/kernel/random/boot_id``), PID namespace (``/proc/self/ns/pid``), pid and
  heartbeat, rewritten every HEARTBEAT_S. A lock is stale once its heartbeat is
  STALE_AFTER_S old. Its process being gone makes it stale at once only where host, boot
  id and PID namespace are all the reader's own: a job in another container (docker
  ``--network host``, Kubernetes ``hostNetwork``: the same host name, other pids) is
  judged by its heartbeat alone. A lock written without those fields (an older version) is
  judged by its heartbeat alone too.

The heartbeat never takes the lock again: it renews LOCK only after finding the highest
claim still its own; otherwise it marks the lock lost and stops. Every commit (a part,
drop_error_rows' rewrite, a quarantine move, ``--overwrite``'s removal, begin_job, the
summary and the success marker) checks ownership right before it becomes visible and
raises :class:`LockLost` (an OutputBusy, one line) otherwise, committing nothing; so does
everything after. The commit order is: write the temporary file, check, rename. A job
taking a folder over removes every other job's temporary files (parts and sidecar) right
after its claim and before it reads the folder's parts. So a writer paused anywhere in a
commit either checks after the claim (refused), or renames before the sweep (its part is
there when the new holder reads the folder: counted done, never redone), or renames after
the sweep (its temporary file is gone: the rename fails, the commit is refused).

The one assumption is the storage's atomic primitive, and the guarantee follows it:

- Local and POSIX filesystems: the claim is ``link(2)`` of a written temporary file
  (atomic, exclusive); renames are atomic. No duplicate rows, whatever the pause and
  wherever it falls. A heartbeat is fenced the same way (temporary file, check, rename), so
  a paused one never overwrites another job's LOCK either. On NFS the same holds as far as
  the server makes link and rename atomic and a listing shows what was renamed before it
  (close-to-open consistency; a client's attribute cache can delay that).
- S3 (s3fs): the claim is a conditional PUT (``If-None-Match: *``; AWS S3, MinIO and moto
  honour it; a store that ignores the header degrades to check-then-write, which the claim
  reads back). A rename is a copy then a delete: a copy already in flight when the new
  holder sweeps and lists may land after its listing, so one commit in flight at the
  takeover is the remaining window. A heartbeat is check-then-PUT: a paused one can
  overwrite LOCK once; the holder (who owns by its claim, not by LOCK) restores it, and
  the paused job stops at its next check.
- Other fsspec stores: the claim uses ``pipe_file(mode="create")`` where the backend
  implements it, else fsspec's check-then-write, read back: two jobs starting within the
  same instant may both think they claimed, and the later check refuses one of them.

A job that finds another job's lock (epoch, job) where its own should be stops with
LockLost at its next commit; the rows it committed before stay and count as done.
STALE_AFTER_S and HEARTBEAT_S are read from the environment at import
(``SHARDSCRIBE_LOCK_STALE_S``, ``SHARDSCRIBE_LOCK_HEARTBEAT_S``; tests shorten them);
the heartbeat defaults to a quarter of the staleness, at most 5 s.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from pipeline.id_buckets import IdBuckets
from pipeline.metrics import word_error_counts
from pipeline.storage import redact_uri, url_to_fs

log = logging.getLogger(__name__)
SIDECAR_DIR = "__shardscribe__"
SUMMARY_NAME = f"{SIDECAR_DIR}/summary.json"
SUCCESS_NAME = f"{SIDECAR_DIR}/_SUCCESS"
LOCK_NAME = f"{SIDECAR_DIR}/LOCK"
QUARANTINE_DIR = f"{SIDECAR_DIR}/quarantine"
TMP_PREFIX = ".tmp-"
PART_PREFIX = "part-"
CLAIM_PREFIX = "LOCK."          # the claims: __shardscribe__/LOCK.<epoch>
# An export's folder beside the parts: "__" is the one prefix every Parquet reader skips
# (module docstring), so DST still reads as exactly the rows.
EXPORT_PREFIX = "__"
PSEUDO_LABEL_EXPORT = "pseudo_label"
STALE_ENV = "SHARDSCRIBE_LOCK_STALE_S"
HEARTBEAT_ENV = "SHARDSCRIBE_LOCK_HEARTBEAT_S"
STALE_AFTER_S = float(os.environ.get(STALE_ENV) or 60.0)
HEARTBEAT_S = float(os.environ.get(HEARTBEAT_ENV) or min(5.0, STALE_AFTER_S / 4))


class OutputBusy(RuntimeError):
    """Another live job holds the output folder."""


class LockLost(OutputBusy):
    """This job's lock on the output folder was taken over (its heartbeat stopped for
    STALE_AFTER_S: a paused, suspended or partitioned process): the commit was refused and
    nothing more is committed by this job. The message is one line."""


def new_job_id() -> str:
    return uuid.uuid4().hex[:12]


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


def sidecar_path(dst: str, name: str) -> str:
    """URL of ``name`` in DST's sidecar folder (any fsspec URL)."""
    return posixpath.join(dst.rstrip("/"), SIDECAR_DIR, name)


def export_dir(name: str) -> str:
    """The folder, relative to DST, of the export ``name``: a ``--format`` (``srt``,
    ``nemo``, ...) or ``pseudo_label``."""
    return f"{EXPORT_PREFIX}{name}"


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


def read_part(fs, part: str) -> pa.Table:
    """A part read whole (every column, every page checksum): raises if any of it is bad."""
    with fs.open(part, "rb") as fh:
        return pq.read_table(fh, page_checksum_verification=True)


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


def _part_tables(dst: str, columns: list[str], options: dict | None, batch_rows: int | None = None):
    """DST's committed rows, part by part (or ``batch_rows`` at a time), as tables of
    ``columns``: a part written before a column was added gets nulls there."""
    from pipeline.records import OUTPUT_SCHEMA

    fs, path = url_to_fs(dst, options)
    for p in _parts(fs, path):
        with fs.open(p, "rb") as fh:
            pf = pq.ParquetFile(fh)
            have = [c for c in columns if c in pf.schema_arrow.names]
            pieces = ([pf.read(columns=have)] if batch_rows is None else
                      (pa.Table.from_batches([b]) for b in pf.iter_batches(batch_size=batch_rows, columns=have)))
            for table in pieces:
                for name in columns:
                    if name not in table.column_names and name in OUTPUT_SCHEMA.names:
                        field = OUTPUT_SCHEMA.field(name)
                        table = table.append_column(field, pa.nulls(table.num_rows, field.type))
                yield table.select([c for c in columns if c in table.column_names])


def read_output(dst: str, columns: list[str], options: dict | None = None):
    tables = list(_part_tables(dst, columns, options))
    return pa.concat_tables(tables, promote_options="default") if tables else None


# -- the folder lock -------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _identity() -> dict:
    """This process's host, boot and PID namespace: a lock's pid means something to a
    reader only where all three are the reader's own. Read each time (a forked child may
    be in a namespace of its own)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip() or None
    except OSError:
        boot = None
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = None
    return {"host": socket.gethostname(), "boot_id": boot, "pid_ns": ns}


def _same_pid_namespace(info: dict) -> bool:
    """Whether ``info``'s pid is a pid of this process's namespace: same host, same boot,
    same PID namespace, all recorded. A container with the host's name (docker
    ``--network host``, Kubernetes ``hostNetwork``) has another namespace; a lock of an
    older version records neither."""
    me = _identity()
    return (info.get("host") == me["host"] and me["boot_id"] is not None and me["pid_ns"] is not None
            and info.get("boot_id") == me["boot_id"] and info.get("pid_ns") == me["pid_ns"])


def lock_is_stale(info: dict, now: float | None = None) -> bool:
    """A lock is stale when its heartbeat stopped (STALE_AFTER_S), or when its process is
    gone and that process was in this reader's own PID namespace (_same_pid_namespace)."""
    now = time.time() if now is None else now
    if now - float(info.get("heartbeat", 0)) > STALE_AFTER_S:
        return True
    return _same_pid_namespace(info) and not _pid_alive(int(info.get("pid", -1)))


# The locks this process holds, by folder: a commit into a folder whose lock this process
# holds is fenced by it (write_part and PartCommitter have the job id, commit_job not even
# that). A commit into a folder this process holds no lock on is not fenced (a benchmark, a
# test writing parts).
_HELD: dict[tuple[str, str], dict[str, "OutputLock"]] = {}    # folder -> job id -> lock
_HELD_GUARD = threading.Lock()


def _folder_key(fs, path: str) -> tuple[str, str]:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol, posixpath.normpath(path.rstrip("/") or "/")


def _held_lock(fs, path: str, job_id: str | None = None) -> "OutputLock | None":
    """The lock this process holds on the folder for ``job_id`` (None: the one taken
    last); None where it holds none there. LockLost where it holds the folder for another
    job only."""
    with _HELD_GUARD:
        locks = dict(_HELD.get(_folder_key(fs, path), {}))
    if not locks:
        return None
    if job_id is None:
        return list(locks.values())[-1]
    if job_id not in locks:
        raise LockLost(f"output {redact_uri(path)}: a commit of job {job_id} into a folder whose lock this process "
                       f"holds for job {', '.join(locks)} only; nothing was committed")
    return locks[job_id]


def _fence(fs, path: str, job_id: str | None = None, tmp: str | None = None) -> "OutputLock | None":
    """Before a commit into ``path`` becomes visible: LockLost unless the lock this process
    holds on the folder (if any) is still the folder's (its claim the highest) and is
    ``job_id``'s. ``tmp``, the commit's temporary file, is removed on refusal."""
    try:
        lock = _held_lock(fs, path, job_id)
        if lock is None:
            return None
        lock.check()
    except LockLost:
        if tmp is not None:
            with contextlib.suppress(Exception):
                fs.rm(tmp)
        raise
    return lock


def _rename_fenced(fs, path: str, tmp: str, target: str, lock: "OutputLock | None") -> None:
    """Rename a checked commit into place. Where the temporary file is gone, a job that
    took the folder over removed it (its sweep): the commit is refused as LockLost."""
    try:
        fs.mv(tmp, target)
    except FileNotFoundError:
        if lock is not None and not lock.owned():
            raise lock.lost_error() from None
        raise


class OutputLock:
    """The output folder's lock, held for the job's life with a heartbeat thread: a claim
    ``LOCK.<epoch>`` (exclusive create) and ``LOCK`` (see the module's docstring)."""

    def __init__(self, dst: str, job_id: str, options: dict | None = None):
        self.fs, self.path = url_to_fs(dst, options)
        self.dst, self.job_id = dst, job_id
        self.side = posixpath.join(self.path, SIDECAR_DIR)
        self.lock = posixpath.join(self.path, LOCK_NAME)
        self.epoch: int | None = None
        self.lost: str | None = None    # why, once this job found another holder
        self._local = isinstance(self.fs, LocalFileSystem)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -------------------------------------------------------------------------
    def _info(self) -> dict:
        return {"job": self.job_id, "epoch": self.epoch, **_identity(), "pid": os.getpid(),
                "heartbeat": time.time()}

    def _read_json(self, path: str) -> dict | None:
        try:
            with self.fs.open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        try:
            value = json.loads(data or b"{}")
        except ValueError:
            return {}   # half-written by a process that died: no heartbeat, so stale
        return value if isinstance(value, dict) else {}

    def _read(self) -> dict | None:
        return self._read_json(self.lock)

    def _claims(self) -> dict[int, str]:
        """The folder's claims, by epoch."""
        self.fs.invalidate_cache(self.side)
        try:
            names = self.fs.ls(self.side, detail=False)
        except FileNotFoundError:
            return {}
        claims = {}
        for p in names:
            found = re.fullmatch(re.escape(CLAIM_PREFIX) + r"(\d+)", posixpath.basename(p.rstrip("/")))
            if found:
                claims[int(found.group(1))] = p
        return claims

    def _holder(self) -> tuple[int, dict | None]:
        """(the highest claim's epoch, its content), (0, None) where there is none."""
        claims = self._claims()
        if not claims:
            return 0, None
        top = max(claims)
        return top, self._read_json(claims[top])

    def owned(self) -> bool:
        """Whether the folder's highest claim is still this lock's (epoch and job id)."""
        if self.epoch is None:
            return False
        top, claim = self._holder()
        return top == self.epoch and (claim or {}).get("job") == self.job_id

    def lost_error(self) -> LockLost:
        top, claim = self._holder()
        info = self._read() or {}
        holder = (claim or {}).get("job") or info.get("job")
        now = (f"job {holder} (epoch {top}) holds it now" if holder and top
               else "no job holds it now (the job that took it over has finished)")
        return LockLost(f"output {redact_uri(self.dst)}: job {self.job_id} lost the folder's lock (epoch "
                        f"{self.epoch}): its heartbeat stopped for over {STALE_AFTER_S:g} s (a paused or suspended "
                        f"process?) and {now}; this job commits nothing more, the rows it committed before stay")

    def check(self) -> None:
        """LockLost unless this job still holds the folder (its claim the highest)."""
        if self.lost is None and not self.owned():
            self.lost = "taken over"
        if self.lost is not None:
            raise self.lost_error()

    # -- judging the folder ----------------------------------------------------------------
    def _busy(self, info: dict) -> OutputBusy:
        age = time.time() - float(info.get("heartbeat", info.get("time", 0)))
        return OutputBusy(
            f"output {redact_uri(self.dst)} is in use by job {info.get('job')} (pid {info.get('pid')} "
            f"on {info.get('host')}, heartbeat {age:.0f} s ago); wait for it to finish, or write elsewhere "
            f"(a lock whose heartbeat is over {STALE_AFTER_S:g} s old is taken over)")

    def _live_holder(self) -> tuple[dict | None, int, int]:
        """(the live holder's description or None, the highest claim, LOCK's epoch)."""
        info = self._read()
        top, claim = self._holder()
        epoch = int((info or {}).get("epoch") or 0)
        if info is not None and not lock_is_stale(info):
            return info, top, epoch
        if top > epoch and claim is not None:
            # A claim newer than LOCK: a job between its claim and its LOCK, or one that died
            # there; its claim's time stands in for the heartbeat.
            if time.time() - float(claim.get("time", 0)) <= STALE_AFTER_S:
                return {"job": claim.get("job"), "time": claim.get("time", time.time())}, top, epoch
        return None, top, epoch

    def check_free(self) -> None:
        """OutputBusy where a live job holds the folder; writes nothing (a dry run)."""
        holder, _, _ = self._live_holder()
        if holder is not None and holder.get("job") != self.job_id:
            raise self._busy(holder)

    # -- writing ---------------------------------------------------------------------------
    def _create_claim(self, epoch: int) -> None:
        """``LOCK.<epoch>`` holding this job's id, created only if absent (FileExistsError
        otherwise), with the storage's exclusive create."""
        claim = posixpath.join(self.side, f"{CLAIM_PREFIX}{epoch}")
        data = json.dumps({"job": self.job_id, "time": time.time()}).encode()
        if self._local:
            # link(2) of a whole file: atomic and exclusive, and no reader sees it half-written.
            tmp = posixpath.join(self.side, f"{TMP_PREFIX}{self.job_id}-{CLAIM_PREFIX}{epoch}")
            with open(tmp, "wb") as fh:
                fh.write(data)
            try:
                os.link(tmp, claim)
            finally:
                os.unlink(tmp)
            return
        try:
            self.fs.pipe_file(claim, data, mode="create")
        except TypeError:   # a backend without modes: check-then-write, read back below
            if self.fs.exists(claim):
                raise FileExistsError(claim) from None
            self.fs.pipe_file(claim, data)
        if (self._read_json(claim) or {}).get("job") != self.job_id:
            raise FileExistsError(claim)

    def _write_lock(self, check: bool) -> bool:
        """Write LOCK (this job's description); with ``check``, only while the folder is
        still this job's (False, nothing written, otherwise)."""
        data = json.dumps(self._info()).encode()
        if self._local:
            # Temporary file, check, rename: a heartbeat paused after its check finds its
            # temporary file swept by the job that took over, and never replaces its LOCK.
            tmp = posixpath.join(self.side, f"{TMP_PREFIX}{self.job_id}-LOCK")
            with open(tmp, "wb") as fh:
                fh.write(data)
            if check and not self.owned():
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                return False
            os.replace(tmp, self.lock)
            return True
        if check and not self.owned():
            return False
        self.fs.pipe_file(self.lock, data)
        return True

    def _sweep(self) -> None:
        """Once this job holds the folder: the claims below its own, and every other job's
        temporary files (parts and sidecar), go; a job that lost the folder and is paused in
        a commit then finds its temporary file gone and commits nothing. Before the folder's
        parts are read (run_job scans after acquire)."""
        for epoch, claim in self._claims().items():
            if epoch < self.epoch:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm(claim)
        mine = f"{TMP_PREFIX}{self.job_id}-"
        for folder in (self.path, self.side):
            self.fs.invalidate_cache(folder)
            try:
                names = self.fs.ls(folder, detail=False)
            except FileNotFoundError:
                continue
            for p in names:
                name = posixpath.basename(p.rstrip("/"))
                if name.startswith(TMP_PREFIX) and not name.startswith(mine):
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm(p, recursive=True)

    def acquire(self) -> "OutputLock":
        self.fs.makedirs(self.side, exist_ok=True)
        for _ in range(5):
            holder, top, epoch = self._live_holder()
            if holder is not None:
                raise self._busy(holder)
            previous = self._read()
            if previous is not None or top:
                log.warning("taking over a stale lock on %s (job %s, epoch %s, pid %s on %s)", redact_uri(self.dst),
                            (previous or {}).get("job"), max(top, epoch), (previous or {}).get("pid"),
                            (previous or {}).get("host"))
            try:
                self._create_claim(max(top, epoch) + 1)
            except FileExistsError:
                continue    # another job claimed that epoch first: judged again above
            self.epoch = max(top, epoch) + 1
            self._write_lock(check=False)
            if self.owned():
                break
            self.epoch = None
        else:
            raise OutputBusy(f"output {redact_uri(self.dst)}: could not take the folder's lock")
        self._sweep()
        with _HELD_GUARD:
            _HELD.setdefault(_folder_key(self.fs, self.path), {})[self.job_id] = self
        self._thread = threading.Thread(target=self._beat, name="output-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        """Renew LOCK while the folder is this job's; never take it again. On finding
        another holder: mark the lock lost (the next commit refuses) and stop."""
        while not self._stop.wait(HEARTBEAT_S):
            try:
                if not self._write_lock(check=True):
                    # Said once, by the commit that refuses (LockLost): here only the log.
                    self.lost = "taken over"
                    log.warning("lock heartbeat on %s stopped: job %s (epoch %s) no longer holds the folder",
                                redact_uri(self.dst), self.job_id, self.epoch)
                    return
            except Exception as exc:   # a missed beat only ages the lock
                log.warning("lock heartbeat on %s failed: %s", redact_uri(self.dst), exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with _HELD_GUARD:
            locks = _HELD.get(_folder_key(self.fs, self.path), {})
            if locks.get(self.job_id) is self:
                del locks[self.job_id]
            if not locks:
                _HELD.pop(_folder_key(self.fs, self.path), None)
        if self.epoch is None or self.lost is not None or not self.owned():
            return      # another job's lock now: not ours to remove
        if (self._read() or {}).get("job") == self.job_id:
            self.fs.rm(self.lock)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(posixpath.join(self.side, f"{CLAIM_PREFIX}{self.epoch}"))

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


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


def iter_output(dst: str, columns: list[str], options: dict | None = None, batch_rows: int = 8192):
    """DST's committed rows as lists of dicts, ``batch_rows`` at a time, part by part, so a
    reader never holds more than one batch of a million-row output. Every row has every
    column of ``columns`` that the output schema knows (null in a part written before it)."""
    for table in _part_tables(dst, columns, options, batch_rows):
        yield table.to_pylist()


# What summarize keeps of each output row, spilled by bucket: text and reference only for
# a row whose WER counts.
_SUMMARY_SCHEMA = pa.schema([("id", pa.string()), ("duration_s", pa.float64()), ("stage", pa.string()),
                             ("kind", pa.string()), ("text", pa.string()), ("reference", pa.string()),
                             ("mismatch", pa.bool_())])
# The filter reason the closing lines warn about (pipeline.filters: speech in a language
# the model does not transcribe), counted in the summary's one pass over the rows.
LANGUAGE_MISMATCH = "language_mismatch"
# The input side of summarize: each id the input holds, and whether this run read it.
WANTED_SCHEMA = pa.schema([("id", pa.string()), ("run", pa.bool_())])


def wanted_ids(input_ids, run_ids=None) -> IdBuckets:
    """``input_ids`` (and whether each is in ``run_ids``) spilled as summarize reads them."""
    ids = [str(i) for i in input_ids]
    spill = IdBuckets(WANTED_SCHEMA)
    spill.add_rows({"id": ids, "run": [bool(run_ids) and i in run_ids for i in ids]})
    return spill.finish()


def _summary_rows(dst: str, options: dict | None) -> IdBuckets:
    spill = IdBuckets(_SUMMARY_SCHEMA)
    for table in _part_tables(dst, ["id", "duration_s", "text", "reference", "stage", "error", "filter_reasons"],
                              options, 8192):
        errors = table.column("error").to_pylist()
        # An audit row (shardscribe validate) has no transcript to score.
        scored = pc.and_(pc.and_(pc.is_valid(table.column("reference")), pc.is_null(table.column("error"))),
                         pc.fill_null(pc.not_equal(table.column("stage"), "audit"), True))
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
              options: dict | None = None) -> dict:
    """Reconcile DST against the input; returns the summary (``commit_job`` writes it).

    ``input_ids``: the input's ids (a list, with ``run_ids`` the ones this run read), or
    an IdBuckets of WANTED_SCHEMA (a job's: pipeline.resume). ``run`` holds this run's
    facts (``wall_seconds`` among them); the RTFx of the run is the audio of the rows it
    read over that wall time. The output is read a batch at a time and both sides are
    spilled by bucket (pipeline.id_buckets): the driver holds one bucket of ids at a time."""
    wanted = input_ids if isinstance(input_ids, IdBuckets) else wanted_ids(input_ids, run_ids)
    found = _summary_rows(dst, options)
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
