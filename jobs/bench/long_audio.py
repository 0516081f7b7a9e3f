"""Peak memory and wall time of one long recording through a whole job.

`shardscribe bench long-audio [--hours 1,2,10] [--config ar] [--runner local]` writes, for
each length, a FLAC of silence with a bundled spoken sample every ``--every`` seconds (made
block by block, so the bench itself stays small), transcribes it with the
`shardscribe transcribe` command line in a subprocess and reports the peak resident memory
of the job's processes (the largest one: ``ru_maxrss`` of the children it waited for, the
Ray workers included where they are its children) and its wall time, with the segments
and transcript it wrote. Memory is the claim here; wall time on a shared machine is noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from ...pipeline.audio import MAX_SECONDS

SAMPLE = Path(__file__).resolve().parents[2] / "pipeline" / "assets" / "samples" / "beckett_human.flac"
WRITE_BLOCK_S = 60


def speech_starts(seconds: float, every_s: float, first_s: float | None = None) -> list[float]:
    """Where the sample starts in a recording of ``seconds``: every ``every_s`` from
    ``first_s`` (half an interval by default), each one wholly inside the recording."""
    speech = sf.info(str(SAMPLE)).duration
    t = every_s / 2 if first_s is None else first_s
    out = []
    while t + speech <= seconds:
        out.append(t)
        t += every_s
    return out


def write_long_recording(path: str | Path, seconds: float, starts: list[float], rate: int = 16000) -> None:
    """A mono 16-bit FLAC of ``seconds`` of silence with SAMPLE at each of ``starts``,
    written a block at a time (no more than WRITE_BLOCK_S of it in memory)."""
    speech, sr = sf.read(str(SAMPLE), dtype="float32")
    if sr != rate:
        raise ValueError(f"{SAMPLE.name} is {sr} Hz, not {rate}")
    total = int(round(seconds * rate))
    at = [int(round(s * rate)) for s in starts]
    block = WRITE_BLOCK_S * rate
    with sf.SoundFile(str(path), "w", rate, 1, "PCM_16", format="FLAC") as out:
        for lo in range(0, total, block):
            hi = min(lo + block, total)
            chunk = np.zeros(hi - lo, np.float32)
            for a in at:
                s, e = max(a, lo), min(a + len(speech), hi)
                if s < e:
                    chunk[s - lo:e - lo] = speech[s - a:e - a]
            out.write(chunk)


def peak_rss_of(cmd: list[str], env: dict | None = None) -> tuple[int, float, int]:
    """(return code, wall seconds, peak RSS in bytes of the largest process ``cmd`` ran)
    measured in a fresh interpreter: RUSAGE_CHILDREN is a process's running maximum, so
    each command gets its own parent."""
    probe = ("import resource, subprocess, sys, time, json; t = time.perf_counter(); "
             "rc = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
             "print(json.dumps([rc, time.perf_counter() - t, "
             "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024]))")
    out = subprocess.run([sys.executable, "-c", probe, *cmd], capture_output=True, text=True, env=env, check=True)
    rc, wall, rss = json.loads(out.stdout.strip().splitlines()[-1])
    return rc, wall, rss


def transcribe_command(audio: Path, dst: Path, config: str, runner: str, seconds: float,
                       sets: list[str] = ()) -> list[str]:
    """The job over ``audio``, with audio.max_seconds raised to its length where the
    default (4 hours) would refuse it, and ``sets`` (``KEY=VALUE``)."""
    cap = max(MAX_SECONDS, seconds + 60)
    cmd = [sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(audio), "--output", str(dst),
           "--config", config, "--runner", runner, "--set", f"audio.max_seconds={cap:g}"]
    return cmd + [a for kv in sets for a in ("--set", kv)]


def read_transcript(dst: Path) -> tuple[int, list[tuple[float, float]], str]:
    import pyarrow.parquet as pq

    rows = [r for f in sorted(dst.glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    segments = [(s["start"], s["end"]) for r in rows for s in (r["segments"] or [])]
    return len(rows), segments, " ".join((r["text"] or r["error"] or "") for r in rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hours", default="1,2,10", help="recording lengths, comma-separated")
    parser.add_argument("--every", type=float, default=600.0, help="seconds between the spoken samples")
    parser.add_argument("--config", default="ar")
    parser.add_argument("--keep", help="write the recordings and outputs here (default: a temporary folder)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a config key for the jobs (e.g. audio.read_timeout_s=3600 on a loaded machine)")
    parser.add_argument("--pythonpath", help="the jobs' PYTHONPATH (another checkout's code: a before/after)")


def run(args: argparse.Namespace) -> dict:
    hours = [float(h) for h in str(args.hours).split(",")]
    if args.quick:
        hours = [0.25, 0.5]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep or tmp)
        base.mkdir(parents=True, exist_ok=True)
        for h in hours:
            audio = base / f"long_{h:g}h.flac"
            starts = speech_starts(h * 3600, args.every)
            if not audio.exists():
                write_long_recording(audio, h * 3600, starts)
            dst = base / f"out_{h:g}h_{time.time_ns()}"
            env = dict(os.environ, **({"PYTHONPATH": args.pythonpath} if args.pythonpath else {}))
            rc, wall, rss = peak_rss_of(transcribe_command(audio, dst, args.config, args.runner, h * 3600, args.sets), env)
            n, segments, text = read_transcript(dst) if rc == 0 else (0, [], "")
            rows.append({"hours": h, "rc": rc, "wall_s": wall, "peak_rss_mb": rss / 2**20, "rows": n,
                         "segments": len(segments), "speech": len(starts), "text": text[:60]})
    summary = {"runner": args.runner, "config": args.config}
    ok = [r for r in rows if r["rc"] == 0]
    if len(ok) >= 2:
        summary["rss_growth"] = ok[-1]["peak_rss_mb"] / ok[0]["peak_rss_mb"] - 1
    return {"rows": rows, "summary": summary}
