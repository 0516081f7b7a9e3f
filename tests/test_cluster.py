"""Ray as users run it: a local instance the job starts (listening on loopback only, with a
token), and a cluster started with `ray start --head` that a job is submitted to with
`ray job submit`, checked by its output. Every socket the Ray processes listen on is
read from the kernel (`ss`), not from Ray's own report."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from shardscribe.pipeline import output

from conftest import ROOT, SAMPLES

FAULTS = ROOT / "tests" / "faults"
LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|\[::1\]|\[::ffff:127\.\d+\.\d+\.\d+\]):\d+$")


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _listening(pids: set[int]) -> list[tuple[str, str]]:
    """(local address, process name) of every TCP listener owned by ``pids``."""
    if shutil.which("ss") is None:
        pytest.fail("ss (iproute2) is missing")
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        cols = line.split()
        owners = re.findall(r'\("([^"]+)",pid=(\d+)', line)
        found += [(cols[3], name) for name, pid in owners if int(pid) in pids]
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_a_local_ray_instance_listens_on_loopback_only_and_requires_a_token():
    script = ("import time, ray; from shardscribe.actors.plan import init_ray; from shardscribe.pipeline.config import load_config; "
              "init_ray(load_config('ar', ['ray.num_cpus=3'])); "
              "ray.data.range(8).map_batches(lambda b: b).materialize(); print('READY', flush=True); time.sleep(120)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        pids = _descendants(proc.pid)
        listening = _listening(pids)
        names = {name for _, name in listening}
        assert {"gcs_server", "raylet"} <= names, listening
        assert all(LOOPBACK.match(addr) for addr, _ in listening), listening
        gcs = [p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "gcs_server"]
        environ = Path(f"/proc/{gcs[0]}/environ").read_bytes().split(b"\0")
        assert b"RAY_AUTH_MODE=token" in environ
        assert any(e.startswith(b"RAY_AUTH_TOKEN=") and len(e) > 40 for e in environ)
    finally:
        _kill_group(proc)


def test_ray_job_submit_to_a_head_started_with_ray_start(tmp_path):
    """`ray start --head` on loopback with a token, the job submitted with `ray job submit`
    and joining it through the RAY_ADDRESS that Ray gives the entrypoint (no ray.address in
    the config); the output is checked, the plan's actors are found in the cluster's own
    worker logs (not in a private instance the driver started), and every socket of the
    cluster's processes is on loopback."""
    corpus = tmp_path / "in"
    corpus.mkdir()
    names = [p.name for p in sorted(SAMPLES.glob("*.flac"))[:3]]
    for name in names:
        shutil.copy(SAMPLES / name, corpus / name)
    dst = tmp_path / "out"
    ray_bin = Path(sys.executable).with_name("ray")
    # A short private temp dir: Ray's socket paths must stay under 108 bytes, and the
    # cluster's address file must not be where another user's ray.init() looks.
    temp_dir = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    dashboard = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32),
               PYTHONPATH=str(ROOT))
    head = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={_free_port()}",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
         f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
         f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
         "--num-cpus=4", f"--temp-dir={temp_dir}", "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        address = f"http://127.0.0.1:{dashboard}"
        entry = ("import sys, fault_toy; fault_toy.register(); from shardscribe.jobs.cli import main; "
                 "sys.exit(main(sys.argv[1:]))")
        runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), str(FAULTS)])}}
        cmd = [str(ray_bin), "job", "submit", "--address", address, "--runtime-env-json", json.dumps(runtime_env),
               "--", sys.executable, "-c", entry, "transcribe", "--input", str(corpus), "--output", str(dst),
               "--config", "ar", "--set", "decoder.kind=fault_toy", "--set", "model.family=fault_family"]
        deadline = time.monotonic() + 240
        while True:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            # Until the dashboard answers, submit fails to connect; then it waits for the job.
            if proc.returncode == 0 or "Failed to connect" not in proc.stdout + proc.stderr \
                    or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        assert "succeeded" in proc.stdout + proc.stderr
        rows = [r for p in dst.glob("*.parquet") for r in pq.read_table(p).to_pylist()]
        assert sorted(r["id"] for r in rows) == sorted(names)
        assert all(r["error"] is None and r["stage"] == "toy" for r in rows)
        assert (dst / output.SUCCESS_NAME).exists()
        worker_logs = [p.read_text(errors="replace") for p in Path(temp_dir).glob("session_*/logs/worker-*.out")]
        assert any("ModelActor" in text for text in worker_logs), "the model actors did not run on the cluster"
        listening = _listening(_descendants(head.pid))
        assert {"gcs_server", "raylet"} <= {name for _, name in listening}, listening
        assert all(LOOPBACK.match(addr) for addr, _ in listening), listening
    finally:
        _kill_group(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
