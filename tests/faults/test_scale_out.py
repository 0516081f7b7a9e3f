"""Scale-out on a simulated cluster (ray.cluster_utils.Cluster on this machine): a head
with no GPU and nodes that declare fake GPUs (Ray schedules them and sets
CUDA_VISIBLE_DEVICES; torch sees none, so the models run on the CPU). Jobs are submitted
as ``ray job submit`` does: RAY_ADDRESS set, no ``ray.*`` key.

Checked against the listing and the actors' own report of where they ran: one model actor
per (node, GPU), each transcribing rows; a node that joins mid-job gets actors that take
rows; a node removed with pending rows in flight loses and duplicates nothing; asks the
cluster can never meet fail in one line; ``model.device=cuda`` from a driver without CUDA
is checked in a task on a GPU node.
Run alone: pytest -n 0 tests/faults/test_scale_out.py
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import fault_toy
from conftest import SAMPLES, wait_for
from shardscribe.pipeline import output

pytestmark = pytest.mark.slow
GPU_NODE = {"num_cpus": 3, "num_gpus": 2}
# Makes torch on one node report a CUDA device, for the device check's task only.
CUDA_SHIM = '''
import importlib.abc, importlib.machinery, sys

class _CudaShim(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.cuda":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.is_available = lambda: True
            module.device_count = lambda: 1
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _CudaShim())
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import ray
    from ray.cluster_utils import Cluster

    from shardscribe.actors.plan import _loopback_environment

    pid_dir = tmp_path_factory.mktemp("pids")
    env = {fault_toy.PID_DIR_ENV: str(pid_dir), fault_toy.DELAY_ENV: "0.5"}
    saved = {k: os.environ.get(k) for k in [*env, "RAY_ADDRESS"]}
    os.environ.update(env)
    if ray.is_initialized():
        ray.shutdown()
    _loopback_environment()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0})
    nodes = [c.add_node(**GPU_NODE) for _ in range(2)]
    ray.init(address=c.address)
    os.environ["RAY_ADDRESS"] = c.address
    fault_toy.register()
    yield c, nodes, pid_dir
    ray.shutdown()
    c.shutdown()
    fault_toy.unregister(saved)


def _corpus(root: Path, n: int) -> Path:
    samples = sorted(SAMPLES.glob("*.flac"))
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        shutil.copy(samples[i % len(samples)], root / f"rec{i:03d}.flac")
    return root


def transcribe(src, dst, *sets, config: str = "ar", flags=()) -> int:
    from shardscribe.jobs.transcribe import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = ["--input", str(src), "--output", str(dst), "--config", config, "--quiet", *flags]
    return run(parser.parse_args(args + [x for s in sets for x in ("--set", s)]))


def _summary(dst: Path) -> dict:
    return json.loads((dst / output.SUMMARY_NAME).read_text())


def _check_rows(dst: Path, expected: set[str]) -> list[dict]:
    rows = [r for p in sorted(dst.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicated rows"
    assert set(ids) == expected, sorted(set(ids) ^ expected)
    s = _summary(dst)
    assert s["rows_in"] == s["rows_out"] == len(expected) and s["duplicate_rows"] == 0
    return rows


@pytest.mark.parametrize("config", ["ar", "default"])
def test_one_model_actor_per_gpu_of_the_cluster(cluster, tmp_path, model_cache, config):
    """No ray.* key: 4 model actors on the 4 distinct (node, GPU) pairs of the two GPU
    nodes, none on the GPU-less head, each transcribing rows; every row once."""
    c, nodes, _ = cluster
    src = _corpus(tmp_path / "in", 24)
    dst = tmp_path / "out"
    assert transcribe(src, dst, f"model.cache_dir={model_cache}", config=config) == 0
    rows = _check_rows(dst, {f"rec{i:03d}.flac" for i in range(24)})
    assert all(r["error"] is None and r["text"] for r in rows), [r["error"] for r in rows if r["error"]]
    actors = _summary(dst)["cluster"]["model_actors"]
    pairs = {(a["node"], tuple(a["gpus"])) for a in actors}
    gpu_nodes = {n.node_id for n in nodes}
    assert len(actors) == 4 and len(pairs) == 4, actors
    assert all(a["node"] in gpu_nodes and len(a["gpus"]) == 1 for a in actors), actors
    assert all(a["rows"] > 0 for a in actors), actors
    assert sum(a["rows"] for a in actors) == 24


def test_a_node_that_joins_mid_job_gets_actors_that_take_rows(cluster, tmp_path):
    c, nodes, _ = cluster
    src = _corpus(tmp_path / "in", 240)
    dst = tmp_path / "out"
    result = {}
    job = threading.Thread(target=lambda: result.update(rc=transcribe(
        src, dst, *fault_toy.OVERRIDES, "batching.recordings_per_batch=3", "output.commit_interval_s=0")))
    job.start()
    wait_for(lambda: any(dst.glob("part-*.parquet")), timeout=180, what="a first part")
    joined = c.add_node(**GPU_NODE)
    nodes.append(joined)
    job.join(timeout=600)
    assert result.get("rc") == 0
    _check_rows(dst, {f"rec{i:03d}.flac" for i in range(240)})
    actors = _summary(dst)["cluster"]["model_actors"]
    late = [a for a in actors if a["node"] == joined.node_id]
    assert len(late) == 2 and all(a["rows"] > 0 for a in late), actors


def test_a_node_removed_with_pending_rows_in_flight(cluster, tmp_path):
    """A two-stage kind whose long rows wait for their second stage in the model actor
    that left them; a GPU node is removed while its actors hold such rows: each row is
    committed once, the removed actors' uncommitted rows redone elsewhere."""
    c, nodes, pid_dir = cluster
    src = _corpus(tmp_path / "in", 120)
    dst = tmp_path / "out"
    victim = nodes[0]
    result = {}
    job = threading.Thread(target=lambda: result.update(rc=transcribe(
        src, dst, "decoder.kind=fault_toy2", "model.family=fault_family", "batching.max_joined_blocks=1",
        "batching.recordings_per_batch=3",
        "second_stage.max_wait_s=600", "output.commit_interval_s=0")))
    job.start()

    def victim_committed() -> bool:
        pids = [f.read_text().split() for f in pid_dir.iterdir() if not f.name.startswith("second-")]
        return any(node == victim.node_id for _, node in pids) and len(list(dst.glob("part-*.parquet"))) >= 4

    wait_for(victim_committed, timeout=180, what="parts committed while the victim node runs actors")
    c.remove_node(victim, allow_graceful=False)
    nodes.remove(victim)
    job.join(timeout=600)
    assert result.get("rc") == 0
    rows = _check_rows(dst, {f"rec{i:03d}.flac" for i in range(120)})
    pending = [r for r in rows if r["stage"] in (fault_toy.SECOND_STAGE, "mixed")]
    assert pending and all(r["text"] for r in pending)
    assert not list(dst.glob(".tmp-*"))


def test_asks_the_cluster_can_never_meet_fail_in_one_line(cluster, tmp_path, capsys):
    src = _corpus(tmp_path / "in", 2)
    gpus = int(__import__("ray").cluster_resources().get("GPU", 0))
    for key, needle in [("ray.decode_actors=64", f"ray.decode_actors=64: the cluster has {gpus} GPUs"),
                        ("ray.fallback_actors=2", "ray.fallback_actors: unknown key")]:
        start = time.monotonic()
        assert transcribe(src, tmp_path / key, *fault_toy.OVERRIDES, key) == 2
        assert time.monotonic() - start < 60
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and needle in err[0], err
        assert not list((tmp_path / key).glob("part-*"))


def test_a_model_actor_that_cannot_start_ends_the_job_within_its_deadline(cluster, tmp_path, capsys):
    """An autoscaling cluster is not refused an ask it cannot meet now; when no node comes,
    ray.start_timeout_s ends the job in one line (exit 3), nothing committed."""
    src = _corpus(tmp_path / "in", 2)
    dst = tmp_path / "out"
    start = time.monotonic()
    assert transcribe(src, dst, *fault_toy.OVERRIDES, "ray.autoscaling=true", "ray.decode_actor_cpus=64",
                      "ray.start_timeout_s=5") == 3
    assert time.monotonic() - start < 60
    err = capsys.readouterr().err
    assert "no model actor started within ray.start_timeout_s=5 s" in err, err
    assert not list(dst.glob("part-*")) and not (dst / output.SUCCESS_NAME).exists()


def test_model_device_cuda_is_checked_on_a_gpu_node(cluster, tmp_path, capsys):
    """The driver has no CUDA. Its preflight asks a GPU node in a task: refused, naming
    that node, where torch there has none; passed where it has (a node whose torch is
    made to report one), with nothing started."""
    c, nodes, _ = cluster
    src = _corpus(tmp_path / "in", 2)
    flags = ("--dry-run",)
    assert transcribe(src, tmp_path / "a", "model.device=cuda", flags=flags) == 2
    err = capsys.readouterr().err
    assert "no CUDA device is usable here" in err and "checked on GPU node" in err, err
    for node in list(nodes):
        c.remove_node(node)
        nodes.remove(node)
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(CUDA_SHIM)
    path = os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")])
    cuda_node = c.add_node(num_cpus=2, num_gpus=1, env_vars={"PYTHONPATH": path})
    nodes.append(cuda_node)
    assert transcribe(src, tmp_path / "b", "model.device=cuda", flags=flags) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert f"checked on GPU node {cuda_node.node_id[:12]}" in out.out + out.err
