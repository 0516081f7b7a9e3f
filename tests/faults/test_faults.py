"""The fault suite: jobs on real Ray (a two-node ray.cluster_utils.Cluster on this machine,
one for the module) hit by the faults a multi-day job meets, each case checked for 0 rows
lost and 0 duplicated against the input listing, and reported (rows in / rows out /
duplicates / errors, printed at the end of the run).

The decoder kind is tests/faults/fault_toy.py (no model, a set time per batch, raises on
one poisoned file), so the suite measures the plan and the output protocol, not a model.
Run alone: pytest -n 0 tests/faults
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

import fault_toy
from shardscribe.pipeline import output
from conftest import ROOT, SAMPLES, sigterm_after_progress, wait_for

FAULTS = Path(__file__).resolve().parent
N_GOOD = 12
BAD = {"fifo.wav": "FIFO", "poison.wav": "poisoned segment", "bad\\xff.wav": "not valid UTF-8"}
OVERRIDES = fault_toy.OVERRIDES + ["batching.recordings_per_batch=3", "output.rows_per_part=3",
                                   "ray.audio_actors=1"]
DELAY_S = "0.4"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """N_GOOD recordings, a FIFO, a file the model raises on and a name that is not UTF-8."""
    from shardscribe.pipeline.audio import decode_audio

    root = tmp_path_factory.mktemp("corpus")
    samples = sorted(SAMPLES.glob("*.flac"))
    for i in range(N_GOOD):
        shutil.copy(samples[i % len(samples)], root / f"good{i:02d}.flac")
    x = decode_audio(samples[1].read_bytes())[0]
    # The loudest sample becomes exactly POISON_PEAK (x_max / x_max is exactly 1).
    sf.write(root / "poison.wav", (x / np.abs(x).max() * fault_toy.POISON_PEAK).astype(np.float32), 16000,
             subtype="FLOAT")
    os.mkfifo(root / "fifo.wav")
    shutil.copy(samples[2], os.path.join(os.fsencode(root), b"bad\xff.wav"))
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head (3 CPUs) + one worker node (4 CPUs), bound to loopback with a token; the toy
    kind registered; what the Ray workers must inherit is in the environment first."""
    import ray
    from ray.cluster_utils import Cluster

    from shardscribe.actors.plan import _loopback_environment

    pid_dir = tmp_path_factory.mktemp("pids")
    env = {fault_toy.PID_DIR_ENV: str(pid_dir), fault_toy.DELAY_ENV: DELAY_S,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    if ray.is_initialized():
        ray.shutdown()
    _loopback_environment()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 3})
    worker = c.add_node(num_cpus=4)
    ray.init(address=c.address)
    fault_toy.register()
    yield c, worker, pid_dir
    ray.shutdown()
    c.shutdown()
    fault_toy.unregister(saved)


def _args(src, dst, *extra) -> list[str]:
    sets = [x for o in OVERRIDES + list(extra) for x in ("--set", o)]
    return ["transcribe", "--input", str(src), "--output", str(dst), "--config", "ar", *sets]


def transcribe(src, dst, *extra) -> int:
    """The transcribe job in this process, on the module's cluster."""
    from shardscribe.jobs.transcribe import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run(parser.parse_args(_args(src, dst, *extra)[1:]))


def _expected_ids(corpus) -> set[str]:
    return {f"good{i:02d}.flac" for i in range(N_GOOD)} | set(BAD)


def _check(dst: Path, expected: set[str], case: str, fault_report, errors_expected: int = len(BAD)) -> list[dict]:
    rows = [r for p in sorted(dst.glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    ids = [r["id"] for r in rows]
    errors = sum(1 for r in rows if r["error"])
    fault_report(case, len(expected), len(set(ids) & expected), len(ids) - len(set(ids)), errors)
    assert set(ids) == expected and len(ids) == len(expected), sorted(set(expected) ^ set(ids))
    assert errors == errors_expected, [(r["id"], r["error"]) for r in rows if r["error"]]
    assert (dst / output.SUCCESS_NAME).exists()
    summary = json.loads((dst / output.SUMMARY_NAME).read_text())
    assert summary["rows_in"] == summary["rows_out"] == len(expected) and summary["duplicate_rows"] == 0
    return rows



def _pids(pid_dir: Path) -> dict[int, str]:
    out = {}
    for f in pid_dir.iterdir():
        text = f.read_text().split()
        if len(text) == 2:
            out[int(text[0])] = text[1]
    return out


def _corrupt_last_page(path: Path, column: str) -> None:
    """Bytes near the end of ``column``'s chunk: inside its last page's data, past the
    page header (whose statistics a checksum does not cover); the footer stays intact."""
    meta = pq.ParquetFile(path).metadata
    col = next(meta.row_group(0).column(i) for i in range(meta.num_columns)
               if meta.row_group(0).column(i).path_in_schema == column)
    first = min(o for o in (col.dictionary_page_offset, col.data_page_offset) if o is not None)
    with open(path, "r+b") as fh:
        fh.seek(first + col.total_compressed_size - 3)
        fh.write(b"\xa5\x5a\xa5")


def test_bad_rows_then_a_half_written_and_a_page_corrupt_part(cluster, corpus, tmp_path, fault_report):
    expected = _expected_ids(corpus)
    dst = tmp_path / "base"
    assert transcribe(corpus, dst) == 0
    rows = {r["id"]: r for r in _check(dst, expected, "bad inputs (FIFO, model raises, non-UTF-8)",
                                       fault_report)}
    for name, message in BAD.items():
        assert message in (rows[name]["error"] or ""), rows[name]
        fault_report(f"  {name}: one error row", 1, 1, 0, 1)
    for i in range(N_GOOD):
        row = rows[f"good{i:02d}.flac"]
        assert row["error"] is None and row["stage"] == "toy" and row["segments"], row
    # output.rows_per_part=3: a part is written once it holds 3 rows, so it holds at most
    # 2 + one batch's 3 (batching.recordings_per_batch=3)
    sizes = [pq.read_metadata(p).num_rows for p in dst.glob("part-*.parquet")]
    assert max(sizes) <= 5 and len(sizes) >= len(expected) // 5, sizes

    for case, damage in [("half-written part, then rerun", "half"), ("page-corrupt part, then rerun", "page")]:
        again = tmp_path / damage
        shutil.copytree(dst, again)
        # A part holding a good recording: its rows are redone (an error row's is an error again).
        victim = next(p for p in sorted(again.glob("part-*.parquet"))
                      if any(i.startswith("good") for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()))
        lost = set(pq.read_table(victim, columns=["id"]).column("id").to_pylist())
        if damage == "half":
            victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        else:
            _corrupt_last_page(victim, "audio")
            assert pq.read_table(victim, columns=["id"]).num_rows == len(lost)   # id alone still reads
        assert transcribe(corpus, again) == 0
        assert [p.name.split(".parquet")[0] for p in (again / output.QUARANTINE_DIR).iterdir()] == [victim.stem]
        redone = _check(again, expected, case, fault_report)
        assert lost <= {r["id"] for r in redone}


def test_actor_killed_mid_job_and_a_second_job_refused(cluster, corpus, tmp_path, fault_report, capsys):
    _, _, pid_dir = cluster
    for f in pid_dir.iterdir():
        f.unlink()
    dst = tmp_path / "out"
    result = {}
    job = threading.Thread(target=lambda: result.update(rc=transcribe(corpus, dst)))
    job.start()
    wait_for(lambda: any(dst.glob("part-*.parquet")) and _pids(pid_dir), what="the first part")
    # A second job into the same folder while the first holds it: refused, nothing written.
    before = sorted(p.name for p in dst.glob("part-*.parquet"))
    assert transcribe(corpus, dst) == 2
    assert "in use by job" in capsys.readouterr().err
    killed = next(iter(_pids(pid_dir)))
    os.kill(killed, signal.SIGKILL)
    job.join(timeout=300)
    assert result.get("rc") == 0
    assert len(_pids(pid_dir)) >= 2, "the killed model actor was not restarted (the job had ended)"
    assert set(before) <= {p.name for p in dst.glob("part-*.parquet")}
    expected = _expected_ids(corpus)
    _check(dst, expected, "model actor SIGKILLed mid-job", fault_report)
    fault_report("second job into the same folder: refused (exit 2)", len(expected), 0, 0, 0)


@contextlib.contextmanager
def _driver(cluster, corpus, dst, *extra, flags=(), **popen):
    """The job (``extra``: its --set overrides, ``flags``: other options) in a driver
    process of its own that joins the module's cluster (as a submitted job's driver does);
    on the way out, whatever it started in its session is killed with it."""
    c, _, _ = cluster
    script = ("import sys, fault_toy; fault_toy.register(); from shardscribe.jobs.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FAULTS)])}
    env.pop("RAY_ADDRESS", None)
    popen = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, **popen}
    proc = subprocess.Popen([sys.executable, "-c", script, *_args(corpus, dst, f"ray.address={c.address}", *extra),
                             *flags],
                            cwd=ROOT, env=env, start_new_session=True, **popen)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _rows_in_parts(dst: Path) -> int:
    return sum(pq.read_metadata(p).num_rows for p in dst.glob("part-*.parquet"))


def test_driver_sigtermed_mid_job_commits_what_it_holds(cluster, corpus, tmp_path, fault_report):
    """A scheduler's SIGTERM to a Ray driver whose parts are due neither by count nor by
    time: the rows it has taken are committed before it exits 130, and the same command
    resumes after them."""
    dst = tmp_path / "out"
    held = ("output.rows_per_part=1000", "output.commit_interval_s=600")
    with _driver(cluster, corpus, dst, *held, flags=("--progress-interval", "0"), stderr=subprocess.PIPE,
                 text=True) as proc:
        # Two blocks of 3 counted: the first, a batch's 0.4 s older, is in the driver's hands.
        seen = sigterm_after_progress(proc, len(_expected_ids(corpus)), 6)
        assert proc.wait(timeout=120) == 130, seen[-3000:]
    assert "interrupted" in seen, seen[-3000:]
    assert 0 < _rows_in_parts(dst) < len(_expected_ids(corpus)), _rows_in_parts(dst)
    assert transcribe(corpus, dst) == 0
    _check(dst, _expected_ids(corpus), "driver SIGTERMed mid-job, then rerun", fault_report)


def test_parts_committed_by_time_on_ray(cluster, corpus, tmp_path, fault_report):
    """output.commit_interval_s on the Ray runner: with output.rows_per_part above the
    input's rows and an interval of 0, the driver commits each block as it takes it, so
    the job leaves several parts (a sink that bundles by count left one), each id once."""
    dst = tmp_path / "out"
    assert transcribe(corpus, dst, "output.rows_per_part=1000", "output.commit_interval_s=0") == 0
    _check(dst, _expected_ids(corpus), "parts by time (commit_interval_s=0, rows_per_part=1000)", fault_report)
    sizes = [pq.read_metadata(p).num_rows for p in dst.glob("part-*.parquet")]
    assert len(sizes) > 1 and max(sizes) <= 3, sizes    # blocks of batching.recordings_per_batch=3


TWO_STAGE = ("decoder.kind=fault_toy2",)
# Recordings the toy first stage leaves pending (longer than fault_toy.PENDING_S).
def _pending_ids(corpus) -> set[str]:
    from shardscribe.pipeline.audio import decode_audio

    return {f"good{i:02d}.flac" for i in range(N_GOOD)
            if decode_audio((corpus / f"good{i:02d}.flac").read_bytes())[0].size / 16000 > fault_toy.PENDING_S}


def test_second_stage_actor_killed_while_pooled_rows_are_pending(cluster, corpus, tmp_path, fault_report):
    """A two-stage kind: pending rows pooled across batches in the model actor that left
    them and finished two at a time (batching.max_tokens=2, one per toy segment), no next
    batch decoded while two are held (second_stage.max_pending_segments=2). The actor
    holding the second stage is SIGKILLed while pooled rows wait: it is restarted, the
    rows it had not committed run again, every row is committed once, each pending one
    after its second stage."""
    _, _, pid_dir = cluster
    for f in pid_dir.iterdir():
        f.unlink()
    dst = tmp_path / "out"
    result = {}
    job = threading.Thread(target=lambda: result.update(
        rc=transcribe(corpus, dst, *TWO_STAGE, "batching.max_tokens=2", "second_stage.max_wait_s=600",
                      "second_stage.max_pending_segments=2")))
    job.start()
    wait_for(lambda: fault_toy.second_stage_pids(pid_dir) and any(dst.glob("part-*.parquet")),
              what="the second stage's actor and a first part")
    os.kill(fault_toy.second_stage_pids(pid_dir)[0], signal.SIGKILL)
    job.join(timeout=300)
    assert result.get("rc") == 0
    assert len(fault_toy.second_stage_pids(pid_dir)) >= 2, "the killed second-stage actor was not restarted"
    rows = {r["id"]: r for r in _check(dst, _expected_ids(corpus), "second-stage actor SIGKILLed, rows pooled",
                                       fault_report)}
    pending = _pending_ids(corpus)
    assert pending and len(pending) < N_GOOD
    for i in range(N_GOOD):
        row = rows[f"good{i:02d}.flac"]
        assert row["error"] is None and row["text"], row
        assert row["stage"] in ({fault_toy.SECOND_STAGE, "mixed"} if row["id"] in pending else {"toy"}), row
    second = json.loads((dst / output.SUMMARY_NAME).read_text())["second_stage"]
    assert second["segments"] >= len(pending) and second["max_segments_per_call"] <= 2, second


def test_driver_killed_while_pooled_rows_are_pending_then_rerun(cluster, corpus, tmp_path, fault_report):
    """The driver (a process of its own, :func:`_driver`) is SIGKILLed once a first part is
    committed, while the rows its second stage pools wait for the end of the input (a
    budget they never fill, max_wait_s above the job); the cluster stays, and the same
    command is run again. Parts are committed by time (output.rows_per_part is above the
    input's rows), so the parts found hold fewer rows than the job, and only rows that
    finished the first stage, none half-finished; the rerun takes the dead driver's lock
    over, keeps those parts and finishes the rest, each row once."""
    dst = tmp_path / "out"
    held = (*TWO_STAGE, "batching.max_tokens=1000", "second_stage.max_wait_s=600",
            "output.rows_per_part=1000", "output.commit_interval_s=1")
    with _driver(cluster, corpus, dst, *held) as proc:
        wait_for(lambda: any(dst.glob("part-*.parquet")) or proc.poll() is not None, timeout=240,
                  what="the driver's first part")
        assert proc.poll() is None, "the job ended before the driver could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    committed = [r for p in dst.glob("part-*.parquet") for r in pq.read_table(p).to_pylist()]
    assert committed and not {r["id"] for r in committed} & _pending_ids(corpus), \
        [r["id"] for r in committed]
    assert all(r["stage"] in ("toy", "error") for r in committed), [(r["id"], r["stage"]) for r in committed]
    assert 0 < len(committed) < len(_expected_ids(corpus))
    assert (dst / output.LOCK_NAME).exists() and not (dst / output.SUCCESS_NAME).exists()
    parts = {p.name for p in dst.glob("part-*.parquet")}
    assert transcribe(corpus, dst, *held) == 0
    assert parts <= {p.name for p in dst.glob("part-*.parquet")}
    assert not list(dst.glob(".tmp-*"))
    rows = _check(dst, _expected_ids(corpus), "driver SIGKILLed with pooled rows pending, then rerun", fault_report)
    assert {r["id"] for r in rows if r["stage"] in (fault_toy.SECOND_STAGE, "mixed")} == _pending_ids(corpus)


def test_s3_input_and_output_through_moto(cluster, corpus, tmp_path, fault_report):
    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        fs = s3fs.S3FileSystem(endpoint_url=endpoint)
        fs.mkdir("corpus")
        names = [f"good{i:02d}.flac" for i in range(N_GOOD)] + ["poison.wav"]
        for name in names:
            fs.put_file(str(corpus / name), f"corpus/in/{name}")
        rc = transcribe("s3://corpus/in/", "s3://corpus/out/", f"storage.options={{endpoint_url: '{endpoint}'}}")
        assert rc == 0
        local = tmp_path / "out"
        fs.get("corpus/out/", str(local), recursive=True)
        rows = _check(local, set(names), "s3:// input and output (moto on 127.0.0.1)", fault_report,
                      errors_expected=1)
        assert {r["audio"] for r in rows} == {f"s3://corpus/in/{n}" for n in names}
        assert not fs.exists(f"corpus/out/{output.LOCK_NAME}")
    finally:
        server.stop()
        # The job made its storage options this process's s3 defaults: not for later tests.
        import fsspec

        os.environ.pop("FSSPEC_S3", None)
        fsspec.config.conf.pop("s3", None)


class SilentServer:
    """A TCP server on loopback that accepts connections and never answers: a remote read
    that never finishes."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_read_that_never_finishes(cluster, tmp_path, fault_report, capfd):
    """Under audio.read_timeout_s it is an error row; with the read timeout above the job
    watchdog, the watchdog ends the job in one line (exit 3) instead of a stall."""
    server = SilentServer()
    try:
        names = [p.name for p in sorted(SAMPLES.glob("*.flac"))[:3]]
        lines = [{"id": n, "audio": str(SAMPLES / n)} for n in names]
        lines.append({"id": "hung", "audio": f"http://127.0.0.1:{server.port}/never.wav?token=SECRET"})
        manifest = tmp_path / "manifest.jsonl"
        manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
        dst = tmp_path / "timeout"
        assert transcribe(manifest, dst, "audio.read_timeout_s=3") == 0
        rows = {r["id"]: r for r in _check(dst, set(names) | {"hung"}, "remote read that never answers",
                                           fault_report, errors_expected=1)}
        assert "read timeout" in rows["hung"]["error"] and "SECRET" not in rows["hung"]["error"]
        assert rows["hung"]["audio"] == f"http://127.0.0.1:{server.port}/never.wav"
        capfd.readouterr()
        stalled = tmp_path / "stalled"
        assert transcribe(manifest, stalled, "audio.read_timeout_s=600", "ray.no_progress_timeout_s=4") == 3
        assert "no progress for ray.no_progress_timeout_s=4 s" in capfd.readouterr().err
        assert not (stalled / output.SUCCESS_NAME).exists() and not (stalled / output.LOCK_NAME).exists()
        fault_report("same, job watchdog (ray.no_progress_timeout_s)", len(lines), 0, 0, 0)
    finally:
        server.close()


def test_worker_node_removed_mid_job(cluster, corpus, tmp_path, fault_report):
    """Last in the module: it changes the cluster. A model actor of 3 CPUs (3.5 with its
    audio actor) does not fit the 3-CPU head, so it runs on the worker node, which is
    removed mid-job; the actor waits for room, a replacement node joins (as an
    autoscaler's would), the actor restarts there and the job completes, each row once."""
    c, worker, pid_dir = cluster
    for f in pid_dir.iterdir():
        f.unlink()
    dst = tmp_path / "out"
    result = {}
    job = threading.Thread(target=lambda: result.update(
        rc=transcribe(corpus, dst, "ray.decode_actors=1", "ray.decode_actor_cpus=3")))
    job.start()
    wait_for(lambda: worker.node_id in _pids(pid_dir).values() and any(dst.glob("part-*.parquet")),
              what="a model actor on the worker node and a first part")
    c.remove_node(worker, allow_graceful=False)
    c.add_node(num_cpus=4)
    job.join(timeout=300)
    assert result.get("rc") == 0
    _check(dst, _expected_ids(corpus), "worker node removed mid-job (replaced)", fault_report)
