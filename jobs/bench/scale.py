"""`shardscribe bench scale`: how a Ray job's throughput grows with the GPUs of a cluster,
and what the job costs its driver, on one small machine without a GPU.

A simulated cluster (``ray.cluster_utils.Cluster``, every node a set of processes on this
machine, bound to loopback with a token) has a head without GPUs, the driver's node, and
worker nodes that declare fake GPUs. Jobs go through the public path (``run_job``, the Ray
runner, ``ray.address`` set to the cluster) with a synthetic decoder kind registered by
this module for the run only, so that the model's speed is a known constant and the
figures measure the plan and the driver, not a model or this machine's cores:

- ``scale_bench``: its first stage holds "its GPU" for ``--latency`` seconds per GPU batch
  (``--batch`` segments: the token budget ``batching.max_tokens`` at 1500 frames a
  segment, Whisper's padded window) by sleeping, so it uses no CPU, and returns a text.
- ``scale_bench_pending``: its first stage sleeps the same and leaves every segment pending
  with a real two-stage kind's payload (a 1500 x 384 float32 "encoder state", Whisper
  tiny's, packed as SSD's pending state is: pipeline.kinds.base.PendingState); its
  second stage sleeps ``--latency`` per batch and finishes the text.

The defaults (0.2 s per batch of 4) make one GPU 20 rows/s, so eight GPUs' 160 rows/s
leave this two-core machine room for what the job itself costs (the read, the prepare
stage, Ray Data and the driver: a few hundred rows/s at zero latency); at a faster
synthetic GPU the machine, not the plan, would set the ceiling.

Input: one short WAV referenced under many ids in a JSONL manifest, so every row is a real
row that the job reads and prepares (no model runs in the prepare stage for a clip this
short: pipeline.segment never cuts a clip that fits the window).

Reported:
- rows/s with 1, 2, 4 and 8 GPUs over 1, 2 and 4 nodes (1x1, 2x1, 2x2, 4x1, 4x2, 2x4:
  nodes x GPUs per node), and the efficiency against linear, rows/s(n) / (n x rows/s(1)).
  Rows/s is the decoding rate in the middle of the job (from 10% to 90% of the rows
  decoded, from the timestamps the synthetic stage writes), so the pools' start-up and the
  last stragglers do not count; each configuration decodes ``--rows`` rows per GPU, so all
  run about as long. Also the model actors that decoded and the (node, GPU) pairs they held.
- the driver's own CPU seconds per 1000 committed rows: the slope of the bench process's
  CPU time (``time.process_time``: all its threads, Ray's own included) between two job
  sizes on the 8-GPU, 4-node cluster (4x2), so start-up and the job's fixed costs cancel.
  Those two jobs run at zero latency: the plan then goes as fast as this machine lets it,
  the driver's highest load per second. Each configuration's row also has its whole job's driver CPU
  per 1000 rows (start-up included), where what the driver spends per second while it
  waits on the GPUs shows.
- the bytes the driver receives per pending row, for the two-stage kind: what reaches the
  driver process through Ray (the blocks its iterator yields, and the values it fetches
  with ``ray.get`` itself), counted by wrapping both in this process only (the driver is
  this process); or the job summary's ``driver.bytes_received`` / ``driver.pending_rows``
  where the runner reports them. ``bytes_source`` says which figure is shown.

Options besides the bench's common ones: ``--latency S``, ``--batch N``, ``--rows N``,
``--configs 1x1,2x1,...``, ``--cpu-rows A,B``, ``--pending-rows N``, ``--decode-actors
N|gpus`` (a fixed model pool instead of the runner's default; ``gpus``: the cluster's GPU
count), ``--set KEY=VALUE`` (config overrides for every job). ``--quick``: a few rows per
configuration, 1x1 and 2x2 only (its driver-CPU and two-stage jobs on 2x2), for the test
suite. The common ``--runner`` and ``--device`` do not apply: the bench always runs on Ray,
on fake GPUs.
"""
from __future__ import annotations

import argparse
import contextlib

import json
import os
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...pipeline.kinds.base import PENDING, PendingState, SegmentResult
from ...pipeline.kinds.registry import DECODER_KINDS, DecoderKind, register_decoder_kind

KIND = "scale_bench"
PENDING_KIND = "scale_bench_pending"
SECTION = "scale_bench"
# A segment's price in the token budget: Whisper's padded encoder window, so that
# batching.max_tokens = batch x FRAMES gives GPU batches of ``batch`` segments.
FRAMES = 1500
TEXT = "synthetic"

FULL_CONFIGS = ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (2, 4))   # (nodes, GPUs per node)
QUICK_CONFIGS = ((1, 1), (2, 2))
# Where the driver-CPU and two-stage jobs run: the 8-GPU, 4-node layout (--quick: 2x2).
CPU_CONFIG = (4, 2)
QUICK_CPU_CONFIG = (2, 2)
HEAD_CPUS = 4
# Logical CPUs a worker node declares per fake GPU: a model actor's one and its audio
# actor's half fit beside each GPU, as on a GPU node.
NODE_CPUS_PER_GPU = 2
OBJECT_STORE_BYTES = 256 << 20


@dataclass
class ScaleOptions:
    """The synthetic kinds' keys (``scale_bench.*``), in the job's config so that they reach
    every actor with it."""
    latency_s: float = 0.2        # seconds a GPU batch (either stage) holds its GPU
    frames: int = FRAMES          # the pending payload's rows ("encoder frames")
    dim: int = 384                # and columns (Whisper tiny's width)
    record_dir: str | None = None  # where each stage appends its batches' timestamps
    EXECUTION_KEYS = ("record_dir",)

    def validate(self, key: str) -> None:
        if self.latency_s < 0 or self.frames < 1 or self.dim < 1:
            from ...pipeline.config_values import ConfigError

            raise ConfigError(f"{key}: latency_s >= 0, frames >= 1 and dim >= 1, got {self}")


class _Recorder:
    """Appends one JSON line per batch to ``record_dir/<stage>-<pid>.jsonl``: the bench reads
    the decoding rate and the actors' placement from them, whatever the runner reports."""

    def __init__(self, record_dir: str | None, stage: str):
        self.path = os.path.join(record_dir, f"{stage}-{os.getpid()}.jsonl") if record_dir else None
        self.node, self.gpus = _placement()

    def __call__(self, t0: float, t1: float, n: int) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"t0": t0, "t1": t1, "n": n, "pid": os.getpid(), "node": self.node,
                                 "gpus": self.gpus}) + "\n")


def _placement() -> tuple[str, list[str]]:
    """This worker's node and the GPU ids Ray assigned it (none where it asked for none)."""
    if "ray" not in sys.modules or not sys.modules["ray"].is_initialized():
        return "local", []
    import ray

    ctx = ray.get_runtime_context()
    return ctx.get_node_id(), [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]


def _hold_gpu(latency_s: float, record: _Recorder, n: int) -> None:
    # A sleep, not a busy loop: a GPU kernel leaves the host's CPU free, and this machine's
    # two cores belong to the plan and the driver, whose costs the bench measures.
    t0 = time.time()
    time.sleep(latency_s)
    record(t0, time.time(), n)


class SleepStage:
    """First stage of ``scale_bench``: every segment final after one sleep per batch."""

    name = KIND

    def __init__(self, adapter, cfg):
        self.opts = cfg.sections[SECTION]
        self.record = _Recorder(self.opts.record_dir, "first")

    def segment_cost(self, audio: np.ndarray) -> int:
        return FRAMES

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        _hold_gpu(self.opts.latency_s, self.record, len(audios))
        return [SegmentResult(TEXT, KIND, tokens=1) for _ in audios]


@dataclass
class EncoderStates(PendingState):
    """A pending segment's payload, shaped as a real two-stage kind's (SSDPending.states)."""
    states: np.ndarray


class PendingSleepStage(SleepStage):
    """First stage of ``scale_bench_pending``: every segment pending with its states."""

    name = PENDING_KIND

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        _hold_gpu(self.opts.latency_s, self.record, len(audios))
        return [SegmentResult("", PENDING, pending=EncoderStates(np.zeros((self.opts.frames, self.opts.dim),
                                                                          np.float32)))
                for _ in audios]


class SleepFinish:
    """Second stage of ``scale_bench_pending``: one sleep per batch, then the text."""

    name = PENDING_KIND
    pending_type = EncoderStates

    def __init__(self, cfg, first_stage=None):
        self.opts = cfg.sections[SECTION]
        self.record = _Recorder(self.opts.record_dir, "second")

    def cost(self, result: SegmentResult) -> int:
        # Priced as its frames, as SSD's fallback prices a row by its encoder states.
        return int(result.pending.states.shape[0])

    def finish(self, results: list[SegmentResult]) -> float:
        _hold_gpu(self.opts.latency_s, self.record, len(results))
        for res in results:
            res.text, res.stage = TEXT, PENDING_KIND
        return self.opts.latency_s


# The kinds need no model capability, yet stand for a model that holds a GPU.
_HOLDS = {"holds_device": True}
ONE_STAGE = DecoderKind(KIND, SleepStage, config_section=SECTION, options=ScaleOptions, **_HOLDS)
TWO_STAGE = DecoderKind(PENDING_KIND, PendingSleepStage, second_stage=SleepFinish, config_section=SECTION,
                        options=ScaleOptions, **_HOLDS)


@contextlib.contextmanager
def registered(kind: DecoderKind):
    """``kind`` in the decoder registry for the block only: the two kinds share a config
    section, and a section left registered would change every later config of this process
    (its keys, its hash). The kind travels to the actors with the plan."""
    register_decoder_kind(kind)
    try:
        yield kind
    finally:
        DECODER_KINDS.pop(kind.name, None)


# -- the driver's received bytes ----------------------------------------------------------

def _nbytes(obj, depth: int = 0) -> int:
    """The payload size of a value the driver took out of Ray: Arrow and numpy buffers,
    bytes, containers summed; anything else as its pickle."""
    import pyarrow as pa

    if isinstance(obj, (pa.Table, pa.RecordBatch, pa.Array, pa.ChunkedArray)):
        return int(obj.nbytes)
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return len(obj)
    if isinstance(obj, str):
        return len(obj.encode())
    if obj is None or isinstance(obj, (bool, int, float)):
        return 8
    if depth < 8 and isinstance(obj, (list, tuple, set)):
        return sum(_nbytes(x, depth + 1) for x in obj)
    if depth < 8 and isinstance(obj, dict):
        return sum(_nbytes(k, depth + 1) + _nbytes(v, depth + 1) for k, v in obj.items())
    if hasattr(obj, "memory_usage"):   # a pandas frame
        return int(obj.memory_usage(deep=True).sum())
    try:
        import pickle

        return len(pickle.dumps(obj))
    except Exception:   # an object that does not pickle carries no payload we can count
        return 0


class DriverBytes:
    """While entered: the bytes that reach this process (the driver) through Ray's
    ``Dataset.iter_batches`` (each block it yields) and through ``ray.get`` called from
    outside Ray's own modules (Ray Data's iterator fetches its blocks with ``ray.get``, and
    those are counted once, as blocks). ``pending_rows``: rows of the blocks that still had
    pending segments."""

    def __init__(self):
        self.bytes = 0
        self.blocks = 0
        self.pending_rows = 0

    def __enter__(self):
        import ray
        from ray.data import Dataset

        self._saved = (ray.get, Dataset.iter_batches)
        real_get, real_iter = self._saved
        seen = self

        def get(*args, **kwargs):
            value = real_get(*args, **kwargs)
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if not (caller == "ray" or caller.startswith("ray.")):
                seen.bytes += _nbytes(value)
            return value

        def iter_batches(ds, *args, **kwargs):
            for batch in real_iter(ds, *args, **kwargs):
                seen.bytes += _nbytes(batch)
                seen.blocks += 1
                seen.pending_rows += _pending_rows(batch)
                yield batch

        ray.get, Dataset.iter_batches = get, iter_batches
        return self

    def __exit__(self, *exc):
        import ray
        from ray.data import Dataset

        ray.get, Dataset.iter_batches = self._saved
        return False


def _pending_rows(batch) -> int:
    names = getattr(batch, "column_names", None) or []
    if "pending_index" not in names:
        return 0
    import pyarrow.compute as pc

    counts = pc.list_value_length(batch.column("pending_index")).fill_null(0)
    return int(pc.sum(pc.greater(counts, 0).cast("int64")).as_py() or 0)


# -- the simulated cluster ----------------------------------------------------------------

_ENV_KEYS = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def _loopback() -> dict:
    """Every node bound to loopback and the cluster behind a token (as actors.plan's local
    instance): Ray reads the node address setting when it is imported, so where it already
    was, what it read is refreshed. Returns the environment to restore."""
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if not {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ):
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    if "ray" in sys.modules:
        from ray._private import ray_constants
        from ray._raylet import Config

        ray_constants.ENABLE_RAY_CLUSTER = False
        Config.initialize("")
    return saved


def _restore(saved: dict) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class SimCluster:
    """A head without GPUs (the driver's node) and worker nodes with fake GPUs, re-laid
    between configurations: nodes are added where the layout grows and all replaced where
    the GPUs per node change. The driver stays connected throughout, so the jobs find Ray
    up and leave it up."""

    def __init__(self, head_cpus: int = HEAD_CPUS, node_cpus_per_gpu: int = NODE_CPUS_PER_GPU):
        import ray
        from ray.cluster_utils import Cluster

        self.node_cpus_per_gpu = node_cpus_per_gpu
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": head_cpus, "num_gpus": 0, "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False})
        self.nodes: list = []
        self.per_node = 0
        try:
            ray.init(address=self.cluster.address, log_to_driver=False, configure_logging=False)
        except BaseException:
            self.cluster.shutdown()
            raise

    @property
    def address(self) -> str:
        return self.cluster.address

    def layout(self, nodes: int, per_node: int) -> None:
        import ray

        if per_node != self.per_node or len(self.nodes) > nodes:
            for node in self.nodes:
                self.cluster.remove_node(node)
            self.nodes = []
        self.per_node = per_node
        while len(self.nodes) < nodes:
            self.nodes.append(self.cluster.add_node(num_cpus=self.node_cpus_per_gpu * per_node, num_gpus=per_node,
                                                    object_store_memory=OBJECT_STORE_BYTES))
        self.cluster.wait_for_nodes()
        deadline = time.monotonic() + 60
        while ray.cluster_resources().get("GPU", 0) != nodes * per_node:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster shows {ray.cluster_resources().get('GPU', 0)} GPUs, "
                                   f"not {nodes * per_node}")
            time.sleep(0.2)

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


# -- one job -------------------------------------------------------------------------------

def _clip(work: Path) -> Path:
    """One second of quiet noise at 16 kHz (written once): read and prepared like any
    recording."""
    import soundfile as sf

    path = work / "clip.wav"
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    sf.write(path, (0.01 * rng.standard_normal(16000)).astype(np.float32), 16000, subtype="PCM_16")
    return path


def _manifest(work: Path, clip: Path, rows: int, tag: str) -> Path:
    path = work / f"manifest-{tag}-{rows}.jsonl"
    if not path.exists():
        with open(path, "w") as fh:
            for i in range(rows):
                fh.write(json.dumps({"id": f"{tag}{i:08d}", "audio": str(clip)}) + "\n")
    return path


def _records(record_dir: Path, stage: str) -> list[dict]:
    out = []
    for path in sorted(record_dir.glob(f"{stage}-*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def steady_rate(records: list[dict]) -> float | None:
    """Rows per second decoded between 10% and 90% of the rows (batch end times), or over
    the whole span where too few batches ended for a middle."""
    if not records:
        return None
    total = sum(r["n"] for r in records)
    ends = sorted((r["t1"], r["n"]) for r in records)
    done, t_lo, n_lo, t_hi, n_hi = 0, None, 0, None, 0
    for t, n in ends:
        done += n
        if t_lo is None and done >= 0.1 * total:
            t_lo, n_lo = t, done
        if t_hi is None and done >= 0.9 * total:
            t_hi, n_hi = t, done
    if t_hi is not None and t_lo is not None and t_hi > t_lo and n_hi > n_lo:
        return (n_hi - n_lo) / (t_hi - t_lo)
    span = max(r["t1"] for r in records) - min(r["t0"] for r in records)
    return total / span if span > 0 else None


def run_one(sim: SimCluster, work: Path, name: str, rows: int, latency_s: float, batch: int,
            extra: list[str], kind: str = KIND) -> dict:
    """One job of ``rows`` rows on the cluster as laid out; its counts, timings and bytes."""
    from ...actors.job import run_job
    from ...actors.job.spec import JobSpec

    record_dir = work / "records" / name
    record_dir.mkdir(parents=True)
    overrides = [f"decoder.kind={kind}", f"{SECTION}.latency_s={latency_s}", f"{SECTION}.record_dir={record_dir}",
                 f"batching.max_tokens={batch * FRAMES}", f"ray.address={sim.address}",
                 # a stalled plan fails the bench in minutes, not the default half hour
                 "ray.no_progress_timeout_s=300", *extra]
    spec = JobSpec(input=str(_manifest(work, _clip(work), rows, name.split("-")[0])),
                   output=str(work / "out" / name), runner="ray", overrides=overrides, overwrite=True)
    with DriverBytes() as seen:
        cpu0, t0 = time.process_time(), time.perf_counter()
        summary = run_job(spec)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    first = _records(record_dir, "first")
    driver = (summary.get("cluster") or {}).get("driver") or {}
    return {
        "job": name, "rows_in": summary["rows_in"], "rows_out": summary["rows_out"],
        "duplicates": summary["duplicate_rows"], "errors": summary.get("errors"),
        "decoded_rows": sum(r["n"] for r in first), "rows_per_s": steady_rate(first),
        "job_rows_per_s": rows / wall if wall > 0 else None, "wall_s": wall, "driver_cpu_s": cpu,
        "model_actors": len({r["pid"] for r in first}),
        "gpu_pairs": len({(r["node"], g) for r in first for g in r["gpus"]}),
        "nodes_used": len({r["node"] for r in first}),
        "second_stage_batches": len(_records(record_dir, "second")),
        "bench_bytes": seen.bytes, "bench_blocks": seen.blocks, "bench_pending_rows": seen.pending_rows,
        "summary_driver": driver,
    }


# -- the bench -----------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--latency", type=float, default=0.2, metavar="S",
                        help="seconds a GPU batch holds its GPU, either stage (default 0.2)")
    parser.add_argument("--batch", type=int, default=4, metavar="N",
                        help="segments per GPU batch (batching.max_tokens = N x 1500; default 4)")
    parser.add_argument("--rows", type=int, default=None, metavar="N",
                        help="rows per GPU of each configuration (default 512, --quick 32)")
    parser.add_argument("--configs", default=None,
                        help="NODESxGPUS,... (default 1x1,2x1,2x2,4x1,4x2,2x4; --quick 1x1,2x2)")
    parser.add_argument("--cpu-rows", default=None, metavar="A,B",
                        help="the two job sizes of the driver's CPU slope (default 2000,8000; --quick 200,600)")
    parser.add_argument("--pending-rows", type=int, default=None, metavar="N",
                        help="rows of the two-stage job (default 256, --quick 48)")
    parser.add_argument("--decode-actors", default=None, metavar="N|gpus",
                        help="ray.decode_actors for every job (gpus: the cluster's GPU count); default: the "
                             "runner's own")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every job")


def _plan(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    configs = args.configs or ",".join(f"{n}x{g}" for n, g in (QUICK_CONFIGS if quick else FULL_CONFIGS))
    cpu_rows = [int(x) for x in (args.cpu_rows or ("200,600" if quick else "2000,8000")).split(",")]
    if len(cpu_rows) != 2 or cpu_rows[0] >= cpu_rows[1]:
        raise SystemExit("bench scale: --cpu-rows takes two sizes, the smaller first")
    return {"configs": [tuple(int(x) for x in c.lower().split("x")) for c in configs.split(",") if c],
            "rows": args.rows or (32 if quick else 512), "cpu_rows": cpu_rows,
            "pending_rows": args.pending_rows or (48 if quick else 256),
            "cpu_config": QUICK_CPU_CONFIG if quick else CPU_CONFIG}


def _actors(args, gpus: int) -> list[str]:
    if args.decode_actors is None:
        return []
    return [f"ray.decode_actors={gpus if args.decode_actors == 'gpus' else int(args.decode_actors)}"]


def _say(line: str) -> None:
    print(f"bench scale: {line}", file=sys.stderr, flush=True)


def run(args) -> dict:
    import logging

    plan = _plan(args)
    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        raise RuntimeError("bench scale starts a cluster of its own: this process is already connected to Ray")
    saved = _loopback()
    # Ray Data's lines for every dataset would bury the bench's own.
    data_log = logging.getLogger("ray.data")
    level = data_log.level
    data_log.setLevel(logging.WARNING)
    tmp = tempfile.TemporaryDirectory(prefix="bench-scale-")
    sim = None
    try:
        sim = SimCluster()
        result = _measure(args, plan, sim, Path(tmp.name))
    finally:
        # The cluster first: its actors write into the folder until they are gone.
        if sim is not None:
            sim.shutdown()
        tmp.cleanup()
        _restore(saved)
        data_log.setLevel(level)
    summary = result["summary"]
    cpu, pend = summary["driver_cpu"], summary["pending"]
    slope = summary["driver_cpu_s_per_1000_rows"]
    print(f"driver CPU per 1000 committed rows: {'n/a' if slope is None else f'{slope:.3f} s'} "
          f"(slope between {cpu['rows'][0]} and {cpu['rows'][1]} rows on {cpu['cluster']}, zero latency)")
    per_row = pend["driver_bytes_per_pending_row"]
    print(f"bytes the driver received per pending row: {'n/a' if per_row is None else f'{per_row:,.0f}'} "
          f"(payload {pend['payload_bytes_per_row']:,} bytes a row; source: {pend['bytes_source']})")
    return result


def _measure(args, plan: dict, sim: SimCluster, work: Path) -> dict:
    """The scaling configurations, the driver-CPU pair and the two-stage job, in turn."""
    latency, batch = args.latency, args.batch
    jobs: list[dict] = []
    rows_out: list[dict] = []
    with registered(ONE_STAGE):
        for nodes, per_node in plan["configs"]:
            gpus = nodes * per_node
            sim.layout(nodes, per_node)
            _say(f"{nodes} nodes x {per_node} GPUs: {plan['rows'] * gpus} rows")
            res = run_one(sim, work, f"scale-{nodes}x{per_node}", plan["rows"] * gpus, latency, batch,
                          _actors(args, gpus) + list(args.sets))
            jobs.append(res)
            rows_out.append({"gpus": gpus, "nodes": nodes, "gpus_per_node": per_node, "rows": res["rows_in"],
                             "rows_per_s": res["rows_per_s"], "model_actors": res["model_actors"],
                             "gpu_pairs": res["gpu_pairs"], "job_rows_per_s": res["job_rows_per_s"],
                             "driver_bytes_per_row": res["bench_bytes"] / max(1, res["rows_out"]),
                             # the whole job's, start-up included: what the driver spends
                             # while it waits on the GPUs shows here, not in the slope
                             "driver_cpu_s_per_1000": res["driver_cpu_s"] / max(1, res["rows_out"]) * 1000})
        base = next((r["rows_per_s"] for r in rows_out if r["gpus"] == 1 and r["rows_per_s"]), None)
        for r in rows_out:
            r["efficiency"] = (r["rows_per_s"] / (r["gpus"] * base)) if base and r["rows_per_s"] else None
        nodes, per_node = plan["cpu_config"]
        sim.layout(nodes, per_node)
        actors = _actors(args, nodes * per_node) + list(args.sets)
        cpu_runs = []
        for n in plan["cpu_rows"]:
            _say(f"driver CPU: {n} rows at zero latency on {nodes}x{per_node}")
            cpu_runs.append(run_one(sim, work, f"cpu-{n}", n, 0.0, batch, actors))
        jobs += cpu_runs
    with registered(TWO_STAGE):
        _say(f"two-stage: {plan['pending_rows']} rows, every one pending, on {nodes}x{per_node}")
        pending = run_one(sim, work, "pending", plan["pending_rows"], latency, batch, actors, kind=PENDING_KIND)
        jobs.append(pending)
    return {"rows": rows_out, "summary": _summary(args, plan, jobs, cpu_runs, pending, rows_out)}


def _summary(args, plan, jobs, cpu_runs, pending, rows_out) -> dict:
    (a, b) = cpu_runs
    slope = (b["driver_cpu_s"] - a["driver_cpu_s"]) / (b["rows_out"] - a["rows_out"]) * 1000 \
        if b["rows_out"] > a["rows_out"] else None
    reported = pending["summary_driver"]
    if "bytes_received" in reported and reported.get("pending_rows"):
        received, pend, source = reported["bytes_received"], reported["pending_rows"], "job summary (driver.*)"
    else:
        pend = pending["bench_pending_rows"] or pending["rows_out"]
        received = pending["bench_bytes"]
        source = "bench (iter_batches blocks + ray.get in the driver)"
    payload = ScaleOptions.frames * ScaleOptions.dim * 4
    largest = max(rows_out, key=lambda r: (r["gpus"], r["nodes"]), default=None)
    return {
        "latency_s": args.latency, "batch": args.batch, "rows_per_gpu": plan["rows"],
        "decode_actors": args.decode_actors or "runner default", "overrides": list(args.sets),
        "cluster": f"head {HEAD_CPUS} CPUs, no GPU; worker nodes {NODE_CPUS_PER_GPU} CPUs per GPU",
        "linear_rows_per_s_1gpu": next((r["rows_per_s"] for r in rows_out if r["gpus"] == 1), None),
        "efficiency_largest": largest and largest["efficiency"],
        "driver_cpu_s_per_1000_rows": slope,
        "driver_cpu": {"cluster": "{}x{}".format(*plan["cpu_config"]), "latency_s": 0.0,
                       "rows": [a["rows_out"], b["rows_out"]], "cpu_s": [a["driver_cpu_s"], b["driver_cpu_s"]],
                       "wall_s": [a["wall_s"], b["wall_s"]]},
        "pending": {"rows": pending["rows_out"], "pending_rows": pend, "payload_bytes_per_row": payload,
                    "driver_bytes_received": received,
                    "driver_bytes_per_pending_row": received / pend if pend else None,
                    "bytes_source": source, "bench_bytes": pending["bench_bytes"],
                    "summary_driver": reported, "second_stage_batches": pending["second_stage_batches"]},
        "jobs": [{k: j[k] for k in ("job", "rows_in", "rows_out", "duplicates", "errors", "decoded_rows",
                                    "model_actors", "gpu_pairs", "nodes_used", "wall_s", "driver_cpu_s")}
                 for j in jobs],
    }
