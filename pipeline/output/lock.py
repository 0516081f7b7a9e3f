"""The output folder's lock and the fence: one job at a time, exactly once against paused writers and containers.

One job at a time holds the lock, and every commit is fenced by it. A second job into the
same folder is refused (:class:`OutputBusy`); a lock whose heartbeat stopped, or whose
process is gone in the reader's own PID namespace, is stale and taken over.

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
summary and the success marker) checks ownership right before it becomes visible
(:func:`_fence`) and raises :class:`LockLost` (an OutputBusy, one line) otherwise,
committing nothing; so does everything after. The commit order is: write the temporary
file, check, rename (:func:`_rename_fenced`). A job taking a folder over removes every
other job's temporary files (parts and sidecar) right after its claim and before it reads
the folder's parts. So a writer paused anywhere in a commit either checks after the claim
(refused), or renames before the sweep (its part is there when the new holder reads the
folder: counted done, never redone), or renames after the sweep (its temporary file is
gone: the rename fails, the commit is refused).

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
(``SHARDSCRIBE_LOCK_STALE_S``, ``SHARDSCRIBE_LOCK_HEARTBEAT_S``; tests shorten them, or
set them on this module: everything that reads them lives here); the heartbeat defaults
to a quarter of the staleness, at most 5 s.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import re
import socket
import threading
import time
import uuid

from fsspec.implementations.local import LocalFileSystem

from .layout import CLAIM_PREFIX, LOCK_NAME, SIDECAR_DIR, TMP_PREFIX
from ..storage import redact_uri, url_to_fs

log = logging.getLogger(__name__)
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
