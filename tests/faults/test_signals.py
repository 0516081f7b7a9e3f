"""Signals at every phase of a job, on the local runner (the Ray start-up has its own
file, test_signal_ray_startup.py):

- SIGTERM while the ``--format`` files are written: one line, exit 130, the lock
  released, no ``_SUCCESS`` and no partial formats; the rerun writes them whole, beside
  the parts.
- Ctrl-C as a terminal sends it (Ctrl-Z, ``fg``, Ctrl-C: SIGTSTP, SIGCONT, SIGINT to the
  job's whole process group) once the first rows are committed: the rerun transcribes
  only the rest, each recording once.
- Either way the interrupted line says how many rows are committed, and that number is
  the rows read back from DST.
- After a driver's death, the next job kills what its local Ray instance left running.

The jobs run the command line in processes of their own with the fault suite's toy
decoder kind (tests/faults/fault_toy.py: no model, a set time per batch).
Run alone: pytest -n 0 tests/faults/test_signals.py
"""
from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fault_toy
from conftest import ROOT, part_ids, sample_copies, wait_for
from shardscribe.pipeline import output

FAULTS = Path(__file__).resolve().parent
N = 8
# The driver: the CLI, its toy kind registered; with SLOW_FORMAT_MARK set, each JSON
# format file first touches that file and takes 0.3 s, so a signal lands mid-formats.
SCRIPT = """
import os, sys, time, fault_toy
fault_toy.register()
mark = os.environ.get("SLOW_FORMAT_MARK")
if mark:
    import shardscribe.pipeline.formats as formats
    plain = formats.to_json
    def slow(row):
        open(mark, "a").close()
        time.sleep(0.3)
        return plain(row)
    formats.to_json = slow
from shardscribe.jobs.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return sample_copies(tmp_path_factory.mktemp("signal-corpus"), N)


SETS = fault_toy.OVERRIDES + ["batching.recordings_per_batch=1", "output.rows_per_part=1000",
                              "output.commit_interval_s=0"]


@pytest.fixture(scope="module")
def toy():
    """The toy kind in this process too: the reruns run in it (a process's start-up costs
    seconds on a small machine)."""
    from shardscribe.pipeline.kinds import DECODER_KINDS
    from shardscribe.pipeline.models import FAMILIES

    fault_toy.register()
    yield
    DECODER_KINDS.pop(fault_toy.KIND.name, None)
    DECODER_KINDS.pop(fault_toy.KIND2.name, None)
    FAMILIES.pop(fault_toy.FAMILY.name, None)


def _rerun(src: Path, dst: Path, formats: str = "") -> dict:
    """The same command again, in this process: its summary."""
    from shardscribe.actors.job import JobSpec, run_job

    return run_job(JobSpec(input=str(src), output=str(dst), config="ar", overrides=SETS, runner="local",
                           formats=formats))


def _cli(src: Path, dst: Path, *flags: str, delay_s: float = 0.0, env: dict | None = None, **popen):
    args = ["transcribe", "--input", str(src), "--output", str(dst), "--runner", "local", "--config", "ar",
            *[x for s in SETS for x in ("--set", s)], *flags]
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FAULTS)]),
            fault_toy.DELAY_ENV: str(delay_s), **(env or {})}
    for key in (fault_toy.PID_DIR_ENV, "RAY_ADDRESS", "SLOW_FORMAT_MARK"):
        if key not in (env or {}):
            full.pop(key, None)
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, env=full, text=True, **popen)


def _finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err




def _assert_released(dst: Path) -> None:
    side = dst / output.SIDECAR_DIR
    assert not (dst / output.LOCK_NAME).exists(), sorted(p.name for p in side.iterdir())
    assert not list(side.glob("LOCK.*")), sorted(p.name for p in side.iterdir())


def _interrupted_line(stderr: str, signame: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("shardscribe: interrupted: ")]
    assert len(lines) == 1 and signame in lines[0], stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def _committed(line: str) -> int:
    """The committed-row count the interrupted line states."""
    found = re.search(r"\((\d+) rows? committed\)$", line)
    assert found, line
    return int(found.group(1))


def _format_files(dst: Path) -> list[Path]:
    """The per-recording JSON format files, wherever the formats live under DST."""
    return list(dst.rglob("r??.flac.json"))


def test_sigterm_while_the_formats_are_written(corpus, toy, tmp_path, fault_report):
    dst, mark = tmp_path / "out", tmp_path / "formats-started"
    proc = _cli(corpus, dst, "--format", "json", env={"SLOW_FORMAT_MARK": str(mark)},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: mark.exists() or proc.poll() is not None, what="the format files")
        proc.send_signal(signal.SIGTERM)
        code, _, err = _finish(proc)
    finally:
        proc.kill()
    assert code == 130, err[-3000:]
    line = _interrupted_line(err, "SIGTERM")
    assert "formats" in line and "_SUCCESS" in line, line
    assert _committed(line) == len(part_ids(dst)) == N, line
    _assert_released(dst)
    assert not (dst / output.SUCCESS_NAME).exists()
    assert not _format_files(dst), _format_files(dst)        # the staged files never moved in
    assert sorted(part_ids(dst)) == sorted(f"r{i:02d}.flac" for i in range(N))

    summary = _rerun(corpus, dst, "json")
    assert (dst / output.SUCCESS_NAME).exists()
    assert sorted(p.stem for p in _format_files(dst)) == [f"r{i:02d}.flac" for i in range(N)]
    assert {p.parent for p in _format_files(dst)} == {dst / "__json"}
    assert all(json.loads(p.read_text())["id"] == p.stem for p in _format_files(dst))
    assert not [p for p in dst.rglob(".tmp-*")], list(dst.rglob(".tmp-*"))
    assert summary["skipped_existing"] == N and summary["rows_in"] == summary["rows_out"] == N
    fault_report("SIGTERM while the formats are written, then rerun", N, len(set(part_ids(dst))),
                 len(part_ids(dst)) - len(set(part_ids(dst))), 0)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rpartition(")")[2].split()[0] == "T"


def test_ctrl_c_from_a_terminal_then_the_rerun_does_only_the_rest(corpus, toy, tmp_path, fault_report):
    """The job in a process group of its own in this session (a shell's foreground job:
    SIGTSTP stops it, which it would not in an orphaned group)."""
    dst = tmp_path / "out"
    proc = _cli(corpus, dst, delay_s=0.4, process_group=0, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(list(dst.glob("part-*.parquet"))) >= 2 or proc.poll() is not None,
                  what="the first committed rows")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.killpg(proc.pid, signal.SIGTSTP)                  # Ctrl-Z
        wait_for(lambda: _stopped(proc.pid), timeout=10, what="the job to stop")
        os.killpg(proc.pid, signal.SIGCONT)                  # fg
        os.killpg(proc.pid, signal.SIGINT)                   # Ctrl-C
        code, _, err = _finish(proc)
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
    assert code == 130, err[-3000:]
    line = _interrupted_line(err, "SIGINT")
    _assert_released(dst)
    kept = part_ids(dst)
    assert 2 <= len(kept) < N and len(kept) == len(set(kept)), kept
    assert _committed(line) == len(kept), (line, kept)       # the line's count is what DST holds

    summary = _rerun(corpus, dst)
    assert summary["skipped_existing"] == len(kept) and summary["run_rows"] == N - len(kept), summary
    assert summary["rows_in"] == summary["rows_out"] == N and summary["duplicate_rows"] == 0, summary
    ids = part_ids(dst)
    assert sorted(ids) == sorted(f"r{i:02d}.flac" for i in range(N)), ids
    fault_report("Ctrl-C (process group) after the first rows, then rerun", N, len(set(ids)),
                 len(ids) - len(set(ids)), 0)


def _dead_pid() -> tuple[int, float]:
    """A pid whose process has ended, and when it started (epoch seconds)."""
    from shardscribe.actors.ray_local import _started

    proc = subprocess.Popen(["sleep", "0.3"])
    started = _started(proc.pid)
    proc.wait()
    return proc.pid, started


def test_the_next_job_kills_what_a_dead_drivers_ray_left(tmp_path, monkeypatch):
    """A driver SIGKILLed mid-job leaves its local Ray's agents running (the raylet's
    children: nothing kills them). Stand-ins here: processes titled as Ray's, holding a log
    open in the dead driver's session folder, and the driver's note; the next job (any
    runner) kills them as it takes the output's lock. A Ray process of a live driver's
    session is left alone."""
    import tempfile

    from shardscribe.actors import ray_local
    from shardscribe.actors.job.run import hold_output
    from shardscribe.pipeline.config import load_config

    temp = tmp_path / "tmp"            # the job's temporary folder: where the notes live
    ray_temp = temp / "ray"
    dead, started = _dead_pid()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")
    dead_logs = ray_temp / f"session_{stamp}_{dead}" / "logs"
    live_logs = ray_temp / f"session_{stamp}_{os.getpid()}" / "logs"
    for logs in (dead_logs, live_logs):
        logs.mkdir(parents=True)
    left = [subprocess.Popen(["bash", "-c", f'exec -a "ray::{name}" sleep 60 >{logs}/{name}.out'])
            for name, logs in (("DashboardAgent", dead_logs), ("IDLE", dead_logs), ("Live", live_logs))]
    try:
        wait_for(lambda: len(ray_local.processes([str(dead_logs.parent), str(live_logs.parent)])) == 3,
                  timeout=10, what="the stand-ins")
        notes = temp / f"shardscribe-ray-{os.getuid()}"
        notes.mkdir(parents=True)
        identity = ray_local._identity()
        for pid, begun in ((dead, started), (os.getpid(), ray_local._started(os.getpid()))):
            (notes / f"{pid}.json").write_text(json.dumps({
                "pid": pid, "started": begun, **identity, "ray_temp": str(ray_temp), "since": time.time() - 5,
                "session": None}))
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        hold_output(str(tmp_path / "out"), load_config("ar")).release()
        wait_for(lambda: left[0].poll() is not None and left[1].poll() is not None, timeout=10,
                  what="the dead driver's leftovers to be killed")
        assert left[0].returncode == left[1].returncode == -signal.SIGKILL
        assert left[2].poll() is None, "a live driver's Ray process was killed"
        assert sorted(p.name for p in notes.iterdir()) == [f"{os.getpid()}.json"]
    finally:
        for p in left:
            p.kill()
            p.wait()
