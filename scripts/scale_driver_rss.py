"""Driver peak RSS of a no-model job (`shardscribe transcribe` with the `audit` decoder
kind: reads and segments, loads no model) as the input grows: JSONL manifests of any
number of rows over 200 short WAV files on disk (`manifest_100k`, `manifest_1m`,
`manifest_10m`: k and m are thousands and millions) and a Parquet table of ~500 MB of
inline audio (3,970 rows of 4 s). Not run in CI.

    PYTHONPATH=. .venv/bin/python scripts/scale_driver_rss.py --work /tmp/scale [--runner ray|local]
        [--cases manifest_100k,manifest_1m,table_500mb] [--dry-run] [--set KEY=VALUE ...]

``--dry-run``: the job's --dry-run (the source's scan, the output's scan and the resume
plan, nothing run). ``--output DIR``: one output folder for every case (a rerun then
resumes; default: a new folder per case). The driver's own peak (VmHWM of its /proc
status, polled until it exits; the Ray workers are other processes and not counted) is
printed per case with the wall time, as one JSON line each.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def wav(seconds: float, seed: int) -> bytes:
    import soundfile as sf

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    x = 0.3 * np.sin(2 * np.pi * (150 + seed % 300) * t) + rng.normal(0, 0.01, len(t))
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), 16000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def make_manifest(work: Path, rows: int, files: int = 200) -> Path:
    audio = work / "audio"
    audio.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        path = audio / f"{i}.wav"
        if not path.exists():
            path.write_bytes(wav(0.5, i))
    path = work / f"manifest_{rows}.jsonl"
    if not path.exists():
        with path.open("w") as fh:
            for i in range(rows):
                fh.write(json.dumps({"id": f"r{i}", "audio": f"audio/{i % files}.wav", "text": "a tone"}) + "\n")
    return path


def _rows(case: str) -> int:
    """The row count a case names: manifest_250, manifest_100k, manifest_1m."""
    count = case.removeprefix("manifest_").lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(count[-1:], 1)
    return int(count.rstrip("km")) * scale


def make_table(work: Path, rows: int = 3970, seconds: float = 4.0) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = work / "table_500mb.parquet"
    if path.exists():
        return path
    schema = pa.schema([("id", pa.string()), ("audio", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
                        ("sentence", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, 100):
            ids = range(start, min(rows, start + 100))
            writer.write_table(pa.table({"id": [f"t{i}" for i in ids],
                                         "audio": [{"bytes": wav(seconds, i), "path": None} for i in ids],
                                         "sentence": ["a tone"] * len(ids)}, schema=schema))
    return path


def driver_peak(argv: list[str]) -> tuple[int, float, float]:
    """(exit code, peak RSS in MB of the process itself, wall seconds)."""
    # A fresh local Ray instance unless told otherwise: ray.init() would join any
    # instance already running on the machine, and its numbers would not be ours.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.setdefault("RAY_ADDRESS", "local")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = max(peak, int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))))
        except (FileNotFoundError, StopIteration, ProcessLookupError):
            pass
        time.sleep(0.2)
    return proc.returncode, peak / 1024, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--runner", choices=["ray", "local"], default="ray")
    parser.add_argument("--cases", default="manifest_100k,manifest_1m")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    for case in args.cases.split(","):
        src = make_table(work) if case == "table_500mb" else make_manifest(work, _rows(case))
        out = args.output or work / f"out_{case}_{args.runner}_{int(time.time())}"
        argv = [sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(src), "--output", str(out),
                "--runner", args.runner, "--set", "decoder.kind=audit", "--set", "model.device=cpu"]
        argv += ["--dry-run"] if args.dry_run else []
        for item in args.overrides:
            argv += ["--set", item]
        code, peak, wall = driver_peak(argv)
        print(json.dumps({"case": case, "runner": args.runner, "source_mb": round(src.stat().st_size / 2**20, 1),
                          "exit": code, "dry_run": args.dry_run, "driver_peak_rss_mb": round(peak, 1),
                          "wall_s": round(wall, 1), "overrides": args.overrides}), flush=True)


if __name__ == "__main__":
    main()
