"""SIGTERM while the job's local Ray instance starts (real Ray, ``--runner ray``): one
line, exit 130, the lock released, and none of the instance's processes left a few
seconds later. Before, Ray's own SIGTERM handler ended the driver where it stood (exit 15,
no message) and the raylet's agents ran on, orphaned, for about 90 s.

One Ray start-up (several seconds on a small machine), cut short as soon as its session
folder exists. The job runs in a session of its own, so its Ray processes are found two
ways: by that session id, whatever they hold open, and by the files they hold open in
the Ray session folder (actors.ray_local, which the job uses to clean up).
Run alone: pytest -n 0 tests/faults/test_signal_ray_startup.py
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import fault_toy
from conftest import ROOT, SAMPLES
from shardscribe.pipeline import output

FAULTS = Path(__file__).resolve().parent
SCRIPT = "import sys, fault_toy; fault_toy.register(); from shardscribe.jobs.cli import main; sys.exit(main(sys.argv[1:]))"


def _in_session(sid: int) -> list[str]:
    """The processes of session ``sid``, with their command lines."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{name} {cmdline[:120]}")
    return found


def _wait_for(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_sigterm_during_ray_start_up_leaves_nothing_running(tmp_path):
    from shardscribe.actors import ray_local

    src, dst = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    for sample in sorted(SAMPLES.glob("*.flac"))[:2]:
        shutil.copy(sample, src / sample.name)
    sets = fault_toy.OVERRIDES
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FAULTS)])}
    for key in ("RAY_ADDRESS", fault_toy.PID_DIR_ENV):
        env.pop(key, None)
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "transcribe", "--input", str(src), "--output", str(dst),
                             "--runner", "ray", "--config", "ar", *[x for s in sets for x in ("--set", s)]],
                            cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ray_temp = ray_local._ray_temp()
    sessions: list[str] = []
    try:
        # The session folder is made before the first of the instance's processes starts.
        assert _wait_for(lambda: glob.glob(f"{ray_temp}/session_*_{proc.pid}") or proc.poll() is not None, 120)
        sessions = glob.glob(f"{ray_temp}/session_*_{proc.pid}")
        assert sessions, proc.communicate()[1][-3000:]
        _wait_for(lambda: ray_local.processes(sessions), 10)
        started = _in_session(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert len(started) >= 2, started                 # the driver and a Ray process at least
    assert proc.returncode == 130, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("shardscribe: interrupted: SIGTERM")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert not (dst / output.LOCK_NAME).exists() and not list((dst / output.SIDECAR_DIR).glob("LOCK.*"))
    assert not (dst / output.SUCCESS_NAME).exists()
    _wait_for(lambda: not _in_session(proc.pid) and not ray_local.processes(sessions), 5)
    assert not _in_session(proc.pid) and not ray_local.processes(sessions), _in_session(proc.pid)
    assert not os.path.exists(os.path.join(ray_local.notes_dir(), f"{proc.pid}.json"))
