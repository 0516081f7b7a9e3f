"""The output folder's commit protocol: parts, lock, resume, quarantine and job commit.

- A part is written under a temporary name (``.tmp-<job>-<part>``) and renamed when
  complete, so a part that exists under its final name is whole.
- Its name is a hash of the ids it holds (``part-<sha256>.parquet``): a commit redone with
  the same rows (a write interrupted and flushed again) writes the same name and replaces
  its own part instead of adding a second copy.
- When to commit is :class:`PartCommitter`'s one policy for both runners: a part once
  ``output.rows_per_part`` rows are pending or ``output.commit_interval_s`` has passed
  since the last commit.
- One job at a time holds the lock (job id, host, pid, heartbeat). A second job into the
  same folder is refused; a lock whose process is gone (same host) or whose heartbeat
  stopped is stale and taken over.
- A job's start reads every part once, whole (all columns, page checksums verified;
  :func:`scan_output`), for all it needs: the config check, the ids already done, the
  error rows ``--retry-errors`` removes, the parts that fail. Once the job is sure to
  run, a part that fails is moved to the quarantine folder and its rows are redone. Only
  final part names are ever moved: temporary files belong to the job that holds the
  lock, and leftovers of a dead job are removed only by the job that took its lock over.
- The job commit writes the summary and then the success marker, last; a job starting in
  the folder removes the marker first, so it never outlives a change.
- ``--retry-errors`` removes the error rows of the job's input before the job starts, by
  rewriting their parts whole (:func:`drop_error_rows`), so those recordings are
  transcribed again and never have two rows.

Everything that is not a part (summary, success marker, lock, quarantine, the job log,
subtitles, the report) lives in one folder, ``SIDECAR_DIR``, and temporary parts start
with ``.``: pyarrow and pandas skip ``_`` and ``.`` names, but Hugging Face
``datasets.load_dataset("parquet", data_dir=DST)`` reads every file beside the parts (a
top-level ``_SUCCESS`` breaks it) and skips only ``.`` names and ``__`` folders.
"""
from __future__ import annotations

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
HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0


class OutputBusy(RuntimeError):
    """Another live job holds the output folder."""


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


def clear_output(dst: str, options: dict | None = None) -> int:
    """Remove DST's parts and sidecar files (``--overwrite``), except the lock this job
    holds; returns the parts removed."""
    fs, path = url_to_fs(dst, options)
    parts = _parts(fs, path)
    for part in parts:
        fs.rm(part)
    side = posixpath.join(path, SIDECAR_DIR)
    lock = posixpath.join(path, LOCK_NAME)
    for p in fs.ls(side, detail=False) if fs.exists(side) else []:
        if p.rstrip("/") != lock:
            fs.rm(p, recursive=True)
    return len(parts)


def error_kind(message: str) -> str:
    """The kind of an ``error`` message: its words before the first colon or parenthesis
    ("file not found: x.wav" -> "file not found")."""
    head = re.split(r"[:(]", message or "", maxsplit=1)[0].strip()
    return head or "error"


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
    temporary name, then renamed over any part of that name."""
    tmp = posixpath.join(path, f"{TMP_PREFIX}{job_id}-{name}")
    with fs.open(tmp, "wb") as fh:
        pq.write_table(table, fh, write_page_checksum=True)
    fs.mv(tmp, posixpath.join(path, name))


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
    log.warning("unreadable output part %s (%s: %s); moved to %s and its rows will be redone",
                posixpath.basename(part), type(reason).__name__, str(reason)[:200], target)
    fs.makedirs(posixpath.dirname(target), exist_ok=True)
    fs.mv(part, target)


# Columns of the first output version: a part without them is not one of ours.
_COLUMNS_SINCE_FIRST = ("id", "audio", "duration_s", "text", "segments", "stage", "error")
_SCAN_SCHEMA = pa.schema([("id", pa.string()), ("error", pa.bool_()), ("part", pa.int32())])


@dataclass(frozen=True)
class OutputScan:
    """DST's committed parts as a job's start judges them, from one read of each part.

    - ``rows``: every row of the parts that read whole (page checksums verified) and hold
      every column of the first output version: its ``id``, whether it holds an ``error``,
      and its ``part`` (an index into ``parts``). These rows are what the job finds done.
    - ``unreadable``: the other parts, and why; resume quarantines them and redoes their rows.
    - ``config_hashes``: rows per ``config_hash`` (None: parts written before the column),
      over every part that reads at all, unreadable ones included: their rows are another
      config's all the same, and a refused job leaves them where they are.
    """
    parts: list[str]
    rows: pa.Table
    unreadable: dict[str, Exception]
    config_hashes: dict[str | None, int]

    def done_ids(self) -> pa.Array:
        """The distinct ids of ``rows``: the recordings the job skips."""
        return pc.unique(self.rows.column("id"))


def scan_output(dst: str, options: dict | None = None) -> OutputScan:
    """Read each committed part of ``dst`` once, whole, and judge it as resume does;
    nothing is moved or written (a dry run and a refused job use it too)."""
    fs, path = url_to_fs(dst, options)
    parts = _parts(fs, path)
    tables, unreadable, counts = [], {}, {}
    for index, part in enumerate(parts):
        rows, hashes, reason = _scan_part(fs, part, index)
        for value, n in hashes.items():
            counts[value] = counts.get(value, 0) + n
        if reason is None:
            tables.append(rows)
        else:
            unreadable[part] = reason
    rows = pa.concat_tables(tables) if tables else _SCAN_SCHEMA.empty_table()
    return OutputScan(parts, rows, unreadable, counts)


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
    rows = pa.table([table.column("id"), pc.is_valid(table.column("error")),
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
            fs.rm(part)
    gone = pc.or_(retried, pc.is_in(rows.column("part"), value_set=pa.array(lost, pa.int32())))
    return replace(scan, rows=rows.filter(pc.invert(gone)))


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


def lock_is_stale(info: dict, now: float | None = None) -> bool:
    """A lock is stale when its heartbeat stopped, or (on this host) its process is gone."""
    now = time.time() if now is None else now
    if now - float(info.get("heartbeat", 0)) > STALE_AFTER_S:
        return True
    return info.get("host") == socket.gethostname() and not _pid_alive(int(info.get("pid", -1)))


class OutputLock:
    """The output folder's lock (``LOCK_NAME``), held for the job's life with a heartbeat thread."""

    def __init__(self, dst: str, job_id: str, options: dict | None = None):
        self.fs, self.path = url_to_fs(dst, options)
        self.dst, self.job_id = dst, job_id
        self.lock = posixpath.join(self.path, LOCK_NAME)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _info(self) -> dict:
        return {"job": self.job_id, "host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time()}

    def _read(self) -> dict | None:
        try:
            with self.fs.open(self.lock, "rb") as fh:
                return json.loads(fh.read() or b"{}")
        except FileNotFoundError:
            return None
        except ValueError:
            return {}   # half-written by a process that died: no heartbeat, so stale

    def _write(self, exclusive: bool) -> None:
        data = json.dumps(self._info()).encode()
        if isinstance(self.fs, LocalFileSystem):
            if exclusive:
                # O_EXCL: of two jobs racing for a free folder, exactly one creates the lock.
                fd = os.open(self.lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                return
            tmp = posixpath.join(posixpath.dirname(self.lock), f".LOCK.{self.job_id}")
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.replace(tmp, self.lock)
            return
        # Object stores have no exclusive create here: write, then read back that the lock
        # is ours (a racing job that wrote last wins and the other is refused).
        with self.fs.open(self.lock, "wb") as fh:
            fh.write(data)

    def _busy(self, info: dict) -> OutputBusy:
        age = time.time() - float(info.get("heartbeat", 0))
        return OutputBusy(
            f"output {redact_uri(self.dst)} is in use by job {info.get('job')} (pid {info.get('pid')} "
            f"on {info.get('host')}, heartbeat {age:.0f} s ago); wait for it to finish, or write elsewhere "
            f"(a lock whose heartbeat is over {STALE_AFTER_S:g} s old is taken over)")

    def check_free(self) -> None:
        """OutputBusy where a live job holds the folder; writes nothing (a dry run)."""
        info = self._read()
        if info is not None and not lock_is_stale(info) and info.get("job") != self.job_id:
            raise self._busy(info)

    def acquire(self) -> "OutputLock":
        self.fs.makedirs(posixpath.dirname(self.lock), exist_ok=True)
        for _ in range(3):
            info = self._read()
            if info is not None and not lock_is_stale(info):
                if info.get("job") == self.job_id:
                    break
                raise self._busy(info)
            if info is not None:
                log.warning("taking over a stale lock on %s (job %s, pid %s on %s)", redact_uri(self.dst),
                            info.get("job"), info.get("pid"), info.get("host"))
                # Rename first: of two jobs taking over one stale lock, only one rename works.
                aside = posixpath.join(self.path, f"{LOCK_NAME}.stale-{self.job_id}")
                try:
                    self.fs.mv(self.lock, aside)
                    self.fs.rm(aside)
                except FileNotFoundError:
                    continue
            try:
                self._write(exclusive=True)
            except FileExistsError:
                continue
            if (self._read() or {}).get("job") == self.job_id:
                break
        else:
            raise OutputBusy(f"output {redact_uri(self.dst)}: could not take the folder's lock")
        self._thread = threading.Thread(target=self._beat, name="output-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._write(exclusive=False)
            except Exception as exc:   # a missed beat only ages the lock
                log.warning("lock heartbeat on %s failed: %s", redact_uri(self.dst), exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if (self._read() or {}).get("job") == self.job_id:
            self.fs.rm(self.lock)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def begin_job(dst: str, job_id: str, options: dict | None = None) -> None:
    """With the lock held: the folder is about to change, so its success marker goes, and
    temporary files of dead jobs (no other job can be live here) are removed."""
    fs, path = url_to_fs(dst, options)
    marker = posixpath.join(path, SUCCESS_NAME)
    if fs.exists(marker):
        fs.rm(marker)
    for p in fs.ls(path, detail=False) if fs.exists(path) else []:
        name = posixpath.basename(p)
        if name.startswith(TMP_PREFIX) and not name.startswith(f"{TMP_PREFIX}{job_id}-"):
            fs.rm(p)


def _write_atomic(fs, path: str, data: bytes) -> None:
    tmp = posixpath.join(posixpath.dirname(path), f"{TMP_PREFIX}{posixpath.basename(path)}")
    with fs.open(tmp, "wb") as fh:
        fh.write(data)
    fs.mv(tmp, path)


def commit_job(dst: str, summary: dict, success: bool, options: dict | None = None) -> None:
    """The job commit: the summary, then the success marker (only when every input row has
    exactly one output row), last."""
    fs, path = url_to_fs(dst, options)
    fs.makedirs(posixpath.join(path, SIDECAR_DIR), exist_ok=True)
    _write_atomic(fs, posixpath.join(path, SUMMARY_NAME), json.dumps(summary, indent=2).encode())
    if success:
        _write_atomic(fs, posixpath.join(path, SUCCESS_NAME), b"")


def iter_output(dst: str, columns: list[str], options: dict | None = None, batch_rows: int = 8192):
    """DST's committed rows as lists of dicts, ``batch_rows`` at a time, part by part, so a
    reader never holds more than one batch of a million-row output. Every row has every
    column of ``columns`` that the output schema knows (null in a part written before it)."""
    for table in _part_tables(dst, columns, options, batch_rows):
        yield table.to_pylist()


def summarize(dst: str, input_ids: list[str], run: dict, run_ids: set[str] | None = None,
              options: dict | None = None) -> dict:
    """Reconcile DST against the input; returns the summary (``commit_job`` writes it).

    ``run`` holds this run's facts (``wall_seconds`` among them); the RTFx of the run is
    the audio of the rows it decoded (``run_ids``) over that wall time. The output is read
    a batch at a time: the driver's memory grows with the ids, not with the rows' text."""
    wanted = set(input_ids)
    seen: set[str] = set()
    rows_out = duplicates = errors = run_rows = run_errors = 0
    audio = run_audio = 0.0
    stages: dict[str, int] = {}
    kinds: dict[str, int] = {}
    wer_errors = wer_words = wer_rows = extra = 0
    for batch in iter_output(dst, ["id", "duration_s", "text", "reference", "stage", "error"], options):
        # Rows of ids this input does not hold (an earlier job's, into the same folder) are
        # counted, not described: the summary is about this input.
        rows = [r for r in batch if r["id"] in wanted]
        extra += len(batch) - len(rows)
        for r in rows:
            rows_out += 1
            duplicates += r["id"] in seen
            seen.add(r["id"])
            stages[r["stage"]] = stages.get(r["stage"], 0) + 1
            audio += r["duration_s"] or 0.0
            if r["error"]:
                errors += 1
                kind = error_kind(r["error"])
                kinds[kind] = kinds.get(kind, 0) + 1
            if run_ids and r["id"] in run_ids:
                run_rows += 1
                run_errors += bool(r["error"])
                run_audio += r["duration_s"] or 0.0
        # An audit row (shardscribe validate) has no transcript to score.
        refs = [(r["reference"], r["text"] or "") for r in rows
                if r["reference"] and not r["error"] and r["stage"] != "audit"]
        if refs:
            e, w = word_error_counts([a for a, _ in refs], [b for _, b in refs])
            wer_errors, wer_words, wer_rows = wer_errors + e, wer_words + w, wer_rows + len(refs)
    missing = sorted(wanted - seen)
    summary = {
        "rows_in": len(input_ids),
        "rows_out": rows_out,
        "duplicate_rows": duplicates,
        "missing_ids": missing[:20],
        "extra_rows": extra,
        "errors": errors,
        "errors_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
        "stages": stages,
        "audio_seconds": audio,
        "wer": wer_errors / wer_words if wer_words else None,
        "wer_rows": wer_rows,
        **run,
    }
    wall = run.get("wall_seconds") or 0.0
    summary["run_rows_out"] = run_rows
    summary["run_errors"] = run_errors
    summary["run_audio_seconds"] = run_audio
    summary["rtfx"] = run_audio / wall if run_ids and wall > 0 else None
    return summary


def read_summary(dst: str, options: dict | None = None) -> dict:
    fs, path = url_to_fs(dst, options)
    with fs.open(posixpath.join(path, SUMMARY_NAME)) as fh:
        return json.load(fh)


def summary_exists(dst: str, options: dict | None = None) -> bool:
    """Whether a job committed in ``dst`` (it writes the summary at its end)."""
    fs, path = url_to_fs(dst, options)
    return fs.exists(posixpath.join(path, SUMMARY_NAME))
