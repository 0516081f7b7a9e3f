"""The local Ray instance a job starts, shut down whole, and what is left of one whose
driver died.

A local instance is the driver's children (GCS, raylet, dashboard, monitors), which the
kernel kills with the driver (Ray starts them with a parent-death signal), and the
raylet's children (its agents and workers), which nothing kills: a driver that dies
without ``ray.shutdown()`` (SIGKILL, or a SIGTERM inside ``ray.init``, where Ray's own
handler exits at once) leaves them running for a minute or more. Whatever its process
title says, every one of them holds files open under the instance's session folder,
``<ray temp>/session_<date>_<driver pid>``: that is how they are found here.

- :func:`starting` wraps ``ray.init``: Ray's own SIGTERM handler is kept out (the job's
  raises where the start-up stands), and a note in :func:`notes_dir` records the driver
  (pid, start time, boot, PID namespace) and, once known, its session folder.
- :func:`stop` is ``ray.shutdown()``, then a wait for the session's processes to go, and
  SIGKILL for those still there after ``grace_s``; after a start-up cut short, SIGKILL at
  once.
- :func:`reap`, at a job's start, kills the processes of the sessions whose driver is gone
  (its note's pid absent, or another process's now) and removes their notes.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import glob
import json
import logging
import os
import signal
import tempfile
import time

from .job import signals

log = logging.getLogger(__name__)
_mine: dict | None = None     # this process's note, while its instance is up


def notes_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"shardscribe-ray-{os.getuid()}")


def _boot_time() -> float:
    with open("/proc/stat") as fh:
        return float(next(line.split()[1] for line in fh if line.startswith("btime ")))


def _started(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds), None when there is none."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return None
    return _boot_time() + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _identity() -> dict:
    """This boot and PID namespace: a note's pid means something only where both match."""
    boot = ns = None
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as fh:
        boot = fh.read().strip()
    with contextlib.suppress(OSError):
        ns = os.readlink("/proc/self/ns/pid")
    return {"boot_id": boot, "pid_ns": ns}


def _write_note(note: dict) -> None:
    os.makedirs(notes_dir(), mode=0o700, exist_ok=True)
    path = os.path.join(notes_dir(), f"{note['pid']}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(note, fh)
    os.replace(path + ".tmp", path)


def _drop_note(pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(notes_dir(), f"{pid}.json"))


def _session_time(path: str) -> float | None:
    """The start of a session folder ``session_<%Y-%m-%d_%H-%M-%S_%f>_<pid>`` (local time)."""
    stamp = os.path.basename(path)[len("session_"):].rpartition("_")[0]
    try:
        return datetime.datetime.strptime(stamp, "%Y-%m-%d_%H-%M-%S_%f").timestamp()
    except ValueError:
        return None


def sessions(note: dict, until: float | None = None) -> list[str]:
    """The session folders of ``note``'s driver: the one it recorded, else those named
    with its pid and begun after the note (before ``until``: a pid reused since)."""
    if note.get("session"):
        return [note["session"]]
    found = []
    for path in glob.glob(os.path.join(note["ray_temp"], f"session_*_{note['pid']}")):
        begun = _session_time(path)
        if begun is not None and begun >= note["since"] - 2.0 and (until is None or begun < until):
            found.append(path)
    return found


@functools.cache
def _ray_package() -> str:
    import importlib.util

    spec = importlib.util.find_spec("ray")
    return os.path.dirname(spec.origin) if spec and spec.origin else "/ray/"


def _is_ray(cmdline: str) -> bool:
    """A Ray process: a renamed worker or dashboard module, or a program of Ray's package
    (not, say, a ``tail -f`` of a session's log)."""
    return cmdline.startswith(("ray::", "ray-dashboard-")) or _ray_package() in cmdline or "ray.dashboard" in cmdline


def _holds(pid: int, folders: list[str]) -> bool:
    """Whether ``pid`` is a Ray process that names one of ``folders`` in its command line
    or holds a file open under one (a renamed process, ``ray::IDLE``, still holds its log
    files)."""
    prefixes = tuple(f.rstrip("/") + "/" for f in folders)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read().decode(errors="replace").replace("\0", "/")
        if not _is_ray(cmdline):
            return False
        if any(p in cmdline for p in prefixes):
            return True
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefixes):
                    return True
    except OSError:     # gone, or another user's
        return False
    return False


def processes(folders: list[str]) -> list[int]:
    """The processes (this process aside) that belong to the session ``folders``."""
    if not folders or not os.path.isdir("/proc"):
        return []
    me = os.getpid()
    return [int(name) for name in os.listdir("/proc")
            if name.isdigit() and int(name) != me and _holds(int(name), folders)]


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def starting(local: bool):
    """Around ``ray.init``; ``local``: it starts an instance (a note is kept) rather than
    joining one. A signal inside stops the start-up where it stands (it can take tens of
    seconds, past a scheduler's grace period): :func:`stop` then kills what it started."""
    global _mine
    _mine = None
    if local:
        with signals.deferred():
            _mine = {"pid": os.getpid(), "started": _started(os.getpid()), **_identity(),
                     "ray_temp": _ray_temp(), "since": time.time(), "session": None}
            _write_note(_mine)
    with _ray_keeps_out_of_sigterm(), signals.unswallowed():
        yield
    if _mine is not None:
        with signals.deferred():
            _mine["session"] = _session_dir()
            _write_note(_mine)


def _ray_temp() -> str:
    with contextlib.suppress(ImportError):
        from ray._common.utils import get_default_ray_temp_dir

        return get_default_ray_temp_dir()
    # Ray's own rule (Linux), for a Ray that keeps that function elsewhere
    return os.path.join(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray")


def _session_dir() -> str | None:
    with contextlib.suppress(Exception):   # a private attribute: the glob stands in without it
        from ray._private import worker

        return worker._global_node.get_session_dir_path()
    return None


@contextlib.contextmanager
def _ray_keeps_out_of_sigterm():
    """``ray.init`` installs a SIGTERM handler that exits where the driver stands (from its
    first line; once the node is up, one that kills the node and exits): a job's own
    handler (actors.job.signals) stays instead, so the job unwinds and shuts Ray down."""
    if not signals.active():
        yield
        return
    from ray._private import utils

    original = getattr(utils, "set_sigterm_handler", None)
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        if original is not None:
            utils.set_sigterm_handler = original
        signals.reclaim()


def stop(grace_s: float = 5.0) -> None:
    """Disconnect from Ray; where this process started the instance, wait up to
    ``grace_s`` for its processes to go and SIGKILL the rest."""
    global _mine
    import ray

    with signals.deferred():
        up = ray.is_initialized()
        try:
            if up:
                ray.shutdown()
        finally:
            note, _mine = _mine, None
            if note is not None:
                # A start-up cut short has nobody to stop its processes: no wait for them.
                _end(sessions(note), grace_s if up else 0.0)
                _drop_note(note["pid"])


def _end(folders: list[str], grace_s: float) -> None:
    """Wait up to ``grace_s`` for the processes of ``folders`` to exit, then SIGKILL them
    until none is left (a raylet killed mid-start may have forked one more)."""
    end = time.monotonic() + grace_s
    while processes(folders) and time.monotonic() < end:
        time.sleep(0.2)
    for _ in range(10):
        left = processes(folders)
        if not left:
            return
        _kill(left)
        time.sleep(0.1)


def reap() -> int:
    """Kill what is left of local instances whose driver died (on this boot, in this PID
    namespace); returns how many processes were killed. Never raises: a job does not stop
    over another's leftovers."""
    try:
        return _reap()
    except Exception as exc:
        log.warning("could not look for a dead driver's Ray processes: %s", exc)
        return 0


def _reap() -> int:
    try:
        names = os.listdir(notes_dir())
    except FileNotFoundError:
        return 0
    me = _identity()
    killed = 0
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(notes_dir(), name)
        try:
            with open(path) as fh:
                note = json.load(fh)
            pid = int(note["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if note.get("boot_id") != me["boot_id"]:
            _drop_note(pid)          # nothing outlives a reboot
            continue
        if note.get("pid_ns") != me["pid_ns"] or pid == os.getpid():
            continue
        now = _started(pid)
        if now is not None and note.get("started") is not None and abs(now - note["started"]) < 1.0:
            continue                 # the driver is alive
        left = processes(sessions(note, until=now))
        if left:
            log.warning("killing %d processes left by the local Ray instance of dead driver %d: %s",
                        len(left), pid, left)
            _kill(left)
            killed += len(left)
        _drop_note(pid)
    return killed
