"""Exactly once against writers that lose the folder's lock (pipeline.output's fence).

- A job frozen (SIGSTOP) past the lock's staleness is taken over by a second job; once
  continued (SIGCONT) it commits nothing more and stops with one line, and the folder holds
  each recording once.
- A job in a PID namespace of its own (a container with the host's name: docker
  ``--network host``, Kubernetes ``hostNetwork``) writes a pid this host does not have; a
  second job must judge it by its heartbeat, not by that pid, and be refused.
- A heartbeat that finds another job's claim stops, and never writes LOCK again.

The jobs run the command line in processes of their own, on the local runner, with the
fault suite's toy decoder kind (tests/faults/fault_toy.py: no model, a set time per batch),
and with the lock's staleness shortened through the environment
(pipeline.output.STALE_ENV / HEARTBEAT_ENV) instead of waiting 60 s.
Run alone: pytest -n 0 tests/faults/test_fenced_lock.py
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fault_toy
from conftest import ROOT, part_ids, sample_copies, wait_for
from shardscribe.pipeline import output
from shardscribe.pipeline.records import OUTPUT_SCHEMA, table

FAULTS = Path(__file__).resolve().parent
N = 30
STALE_S = 2.0
SCRIPT = "import sys, fault_toy; fault_toy.register(); from shardscribe.jobs.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return sample_copies(tmp_path_factory.mktemp("fenced-corpus"), N)


def _env(delay_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FAULTS)]),
           fault_toy.DELAY_ENV: str(delay_s), output.STALE_ENV: str(STALE_S), output.HEARTBEAT_ENV: "0.2"}
    env.pop(fault_toy.PID_DIR_ENV, None)
    env.pop("RAY_ADDRESS", None)
    return env


def _args(src: Path, dst: Path, batch: int = 3) -> list[str]:
    # A part per batch (output.commit_interval_s=0). The batch size is no part of the
    # config's hash: a second job batching by 4 resumes the first's folder, and its parts
    # hold other sets of ids than the first's (parts are named by their ids, so jobs
    # batching alike would replace each other's parts instead of duplicating rows).
    sets = fault_toy.OVERRIDES + [f"batching.recordings_per_batch={batch}", "output.rows_per_part=1000",
                                  "output.commit_interval_s=0"]
    return ["transcribe", "--input", str(src), "--output", str(dst), "--runner", "local", "--config", "ar",
            *[x for s in sets for x in ("--set", s)]]


def _job(src: Path, dst: Path, delay_s: float, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *_args(src, dst)], cwd=ROOT, env=_env(delay_s),
                            start_new_session=True, text=True, **popen)


def _run(src: Path, dst: Path) -> subprocess.CompletedProcess:
    """The second job: no delay, batches of 4."""
    return subprocess.run([sys.executable, "-c", SCRIPT, *_args(src, dst, batch=4)], cwd=ROOT, env=_env(0.0),
                          capture_output=True, text=True, timeout=300)




def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


def test_a_paused_writer_that_lost_its_lock_commits_nothing_more(corpus, tmp_path, fault_report):
    """Job A is frozen after its first commit, past the lock's staleness; job B takes the
    folder over and finishes; A, continued, stops at its next commit with one line. Before
    the fence A's heartbeat wrote LOCK back and both jobs committed: 54 rows for 30 ids,
    and every rerun failed with rows in != rows out."""
    dst = tmp_path / "out"
    a_err = tmp_path / "a.err"
    with open(a_err, "w") as err:
        a = _job(corpus, dst, delay_s=0.4, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: any(dst.glob("part-*.parquet")) or a.poll() is not None, what="A's first part")
        assert a.poll() is None, a_err.read_text()[-3000:]
        os.killpg(a.pid, signal.SIGSTOP)
        first = set(part_ids(dst))
        held = json.loads((dst / output.LOCK_NAME).read_text())
        time.sleep(STALE_S + 1.0)                        # A's heartbeat is now stale
        b = _run(corpus, dst)
        assert b.returncode == 0, b.stderr[-3000:]
        assert set(part_ids(dst)) >= first and len(part_ids(dst)) == N
        os.killpg(a.pid, signal.SIGCONT)
        a.wait(timeout=120)
    finally:
        _kill_group(a)
    stderr = a_err.read_text()
    lost = [ln for ln in stderr.splitlines() if "lost the folder's lock" in ln]
    assert a.returncode != 0, stderr[-3000:]
    assert len(lost) == 1 and f"job {held['job']} lost the folder's lock (epoch {held['epoch']})" in lost[0], \
        stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    ids = part_ids(dst)
    fault_report("paused writer (SIGSTOP past the lock's staleness), then continued", N, len(set(ids)),
                 len(ids) - len(set(ids)), 0)
    assert len(ids) == len(set(ids)) == N, f"{len(ids)} rows for {len(set(ids))} ids"
    assert not list(dst.glob(".tmp-*"))
    assert (dst / output.SUCCESS_NAME).exists()        # B's; A removed nothing
    summary = json.loads((dst / output.SUMMARY_NAME).read_text())
    assert summary["rows_in"] == summary["rows_out"] == N and summary["duplicate_rows"] == 0
    again = _run(corpus, dst)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(part_ids(dst)) == N


def _free_host_pid() -> int:
    """A pid no process of this host has, high enough that nothing takes it meanwhile."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(pid_max - 1000, pid_max - 1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    pytest.skip("no free pid near pid_max")


def test_a_job_in_its_own_pid_namespace_is_judged_by_its_heartbeat(corpus, tmp_path, fault_report):
    """Job A runs under ``unshare --pid --fork --mount-proc`` with a pid that this host has
    no process of; job B, started while A runs, must be refused (exit 2, naming A), not
    take A's live lock over because "the process is gone"."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs unshare(1) and root")
    probe = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"unshare --pid does not work here: {probe.stderr.decode()[-200:]}")
    pid = _free_host_pid()
    dst = tmp_path / "out"
    a_err = tmp_path / "a.err"
    # Inside the namespace the next pid is set to one this host does not have, so A's pid
    # in LOCK names no process here.
    inner = (f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "
             + " ".join(f"'{x}'" for x in [sys.executable, "-c", SCRIPT, *_args(corpus, dst)]))
    with open(a_err, "w") as err:
        a = subprocess.Popen([unshare, "--pid", "--fork", "--mount-proc", "sh", "-c", inner], cwd=ROOT,
                             env=_env(1.0), start_new_session=True, text=True, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for(lambda: any(dst.glob("part-*.parquet")) or a.poll() is not None, what="A's first part")
        assert a.poll() is None, a_err.read_text()[-3000:]
        held = json.loads((dst / output.LOCK_NAME).read_text())
        # What fooled the "process gone on this host" rule: this host's name, no such pid here.
        assert held["pid"] == pid and held["host"] == output._identity()["host"], held
        assert held.get("pid_ns") != output._identity()["pid_ns"]
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        b = _run(corpus, dst)
        assert b.returncode == 2, b.stderr[-3000:]
        assert f"in use by job {held['job']}" in b.stderr and b.stderr.count("\n") == 1, b.stderr[-3000:]
        assert a.wait(timeout=240) == 0, a_err.read_text()[-3000:]
    finally:
        _kill_group(a)
    ids = part_ids(dst)
    fault_report("second job while a job in its own PID namespace holds the folder: refused (exit 2)", N,
                 len(set(ids)), len(ids) - len(set(ids)), 0)
    assert len(ids) == len(set(ids)) == N, f"{len(ids)} rows for {len(set(ids))} ids"


def _rows(ids):
    return table([{"id": i, "audio": f"/a/{i}.wav", "stage": "audit", "segments": [], "text": ""} for i in ids],
                 OUTPUT_SCHEMA)


def test_a_heartbeat_that_finds_another_owner_stops_and_never_rewrites_lock(tmp_path, monkeypatch):
    """Job A's heartbeat misses the staleness (it beats every 0.3 s, stale after 0.2 s),
    so job B takes the folder over; A's next beat finds B's claim: it stops, LOCK stays
    B's, and A's commits are refused (LockLost, one line), leaving nothing behind."""
    monkeypatch.setattr(output.lock, "STALE_AFTER_S", 0.2)     # read where the lock is: pipeline.output.lock
    monkeypatch.setattr(output.lock, "HEARTBEAT_S", 0.3)
    dst = str(tmp_path)
    a = output.OutputLock(dst, "jobA").acquire()
    try:
        end = time.monotonic() + 10
        while True:
            try:
                b = output.OutputLock(dst, "jobB").acquire()
                break
            except output.OutputBusy:
                assert time.monotonic() < end, "B never found A's lock stale"
                time.sleep(0.01)
        try:
            mine = json.loads((tmp_path / output.LOCK_NAME).read_text())
            assert mine["job"] == "jobB" and mine.get("epoch") == 2
            seen = set()
            stop = time.monotonic() + 1.5
            while time.monotonic() < stop:       # five of A's beats
                info = json.loads((tmp_path / output.LOCK_NAME).read_text())
                seen.add((info["job"], info.get("epoch")))
                time.sleep(0.005)
            assert seen == {("jobB", 2)}, seen
            assert not a._thread.is_alive() and a.lost
            with pytest.raises(output.LockLost) as lost:
                output.write_part(_rows(["x"]), dst, "jobA")
            assert "\n" not in str(lost.value) and "job jobA lost the folder's lock" in str(lost.value)
            assert "job jobB" in str(lost.value)
            assert not list(tmp_path.glob("part-*")) and not list(tmp_path.glob(".tmp-*"))
            a.release()                           # not A's to remove
            assert json.loads((tmp_path / output.LOCK_NAME).read_text())["job"] == "jobB"
            assert b.owned()
        finally:
            b.release()
        assert not (tmp_path / output.LOCK_NAME).exists()
    finally:
        a.release()


def test_commits_after_a_takeover_are_refused(tmp_path):
    """Every commit kind of a job whose lock was taken over is refused before anything
    becomes visible: a part, the summary and success marker, begin_job, --overwrite; and a
    part whose temporary file the new holder swept (a writer paused between its check and
    its rename) is refused too."""
    dst = str(tmp_path)
    a = output.OutputLock(dst, "jobA").acquire()
    a._stop.set()            # A's heartbeat "paused"
    a._thread.join()
    output.write_part(_rows(["a0"]), dst, "jobA")
    # B takes over: claim A's epoch + 1, as a taker of a stale lock does (A's heartbeat is
    # stopped; we do not wait for it to age).
    b = output.OutputLock(dst, "jobB")
    b._create_claim(a.epoch + 1)
    b.epoch = a.epoch + 1
    b._write_lock(check=False)
    b._sweep()
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path / output.SIDECAR_DIR))
    for commit in (lambda: output.write_part(_rows(["a1"]), dst, "jobA"),
                   lambda: output.commit_job(dst, {"rows_in": 1}, True),
                   lambda: output.begin_job(dst, "jobA"),
                   lambda: output.clear_output(dst)):
        with pytest.raises(output.LockLost):
            commit()
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path / output.SIDECAR_DIR))) == before
    a.release()
    assert json.loads((tmp_path / output.LOCK_NAME).read_text())["job"] == "jobB"


def test_a_commit_paused_between_its_check_and_its_rename_is_refused(tmp_path, monkeypatch):
    """The window the check leaves: A checks (still the holder), pauses, B takes over and
    sweeps A's temporary file, A renames: the rename finds nothing and is refused."""
    dst = str(tmp_path)
    a = output.OutputLock(dst, "jobA").acquire()
    a._stop.set()
    a._thread.join()
    check = output.OutputLock.check

    def check_then_lose(self):
        check(self)
        if self is a:      # right after A's check passed: B takes the folder over
            b = output.OutputLock(dst, "jobB")
            b._create_claim(a.epoch + 1)
            b.epoch = a.epoch + 1
            b._write_lock(check=False)
            b._sweep()

    monkeypatch.setattr(output.OutputLock, "check", check_then_lose)
    with pytest.raises(output.LockLost):
        output.write_part(_rows(["late"]), dst, "jobA")
    assert not list(tmp_path.glob("part-*")) and not list(tmp_path.glob(".tmp-*"))
    a.release()


def test_two_jobs_claiming_one_epoch_one_wins(tmp_path):
    lock = output.OutputLock(str(tmp_path), "one")
    lock.fs.makedirs(lock.side, exist_ok=True)
    lock._create_claim(1)
    with pytest.raises(FileExistsError):
        output.OutputLock(str(tmp_path), "two")._create_claim(1)
    assert json.loads((tmp_path / output.SIDECAR_DIR / "LOCK.1").read_text())["job"] == "one"
    # A claim newer than LOCK (its job between claim and LOCK) keeps the folder busy.
    with pytest.raises(output.OutputBusy, match="in use by job one"):
        output.OutputLock(str(tmp_path), "two").acquire()


def test_the_claim_on_s3_is_a_conditional_put(tmp_path, monkeypatch):
    """On S3 (moto on 127.0.0.1) the claim is a PUT with If-None-Match: *: a second claim
    of one epoch is refused by the store; the lock fences commits there as on a disk, and a
    released lock leaves neither LOCK nor its claim."""
    import s3fs
    from moto.server import ThreadedMotoServer

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"endpoint_url": f"http://{host}:{port}"}
        s3fs.S3FileSystem(**options).mkdir("fenced")
        dst = "s3://fenced/out"
        a = output.OutputLock(dst, "jobA", options).acquire()
        a._stop.set()
        a._thread.join()
        output.write_part(_rows(["a0"]), dst, "jobA", options)
        with pytest.raises(output.OutputBusy, match="in use by job jobA"):
            output.OutputLock(dst, "jobB", options).acquire()
        b = output.OutputLock(dst, "jobB", options)
        with pytest.raises(FileExistsError):
            b._create_claim(a.epoch)          # the store refuses: A's claim exists
        b._create_claim(a.epoch + 1)          # B takes over (A's heartbeat "paused")
        b.epoch = a.epoch + 1
        b._write_lock(check=False)
        b._sweep()
        with pytest.raises(output.LockLost):
            output.write_part(_rows(["a1"]), dst, "jobA", options)
        fs = s3fs.S3FileSystem(**options)
        assert {p.rsplit("/", 1)[1] for p in fs.ls("fenced/out")} == {output.part_name(["a0"]), output.SIDECAR_DIR}
        a.release()
        assert json.loads(fs.cat(f"fenced/out/{output.LOCK_NAME}"))["job"] == "jobB"
        b.release()
        fs.invalidate_cache()
        assert not [p for p in fs.find("fenced/out") if "LOCK" in p]
    finally:
        server.stop()
