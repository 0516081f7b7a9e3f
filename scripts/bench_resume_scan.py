"""Time a job's start in a large output folder: what `shardscribe transcribe` reads of DST
before any worker starts (the config check, --retry-errors' removal, the ids already done
and the quarantine), for a dry run, a resume and a resume with --retry-errors, on a local
folder or on a moto S3 server (a separate process on loopback). Not run in CI.

    PYTHONPATH=. .venv/bin/python scripts/bench_resume_scan.py --work /tmp/scanbench \
        [--parts 200] [--rows 5000] [--runs 3] [--store local,s3] [--modes dry_run,resume,retry_errors]

The folder holds ``--parts`` parts of ``--rows`` rows written by pipeline.output.write_part
(every column of the output schema filled as a job fills it: ~80 characters of text, one
or two segments with their words, timings, confidence; 0.2% error rows), made by the
job's own config; the input is a manifest of exactly those ids, so nothing is left to
transcribe. Each mode runs ``jobs.transcribe.run`` in this process with the worker part
(``_transcribe``) replaced by a stub, and times from the end of the source's scan to the
stub (or to the dry run's answer): the output folder's share of the start. --retry-errors
changes the folder, so it runs on a fresh copy each time. One JSON line per run.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

OVERRIDES = ["decoder.kind=audit", "model.device=cpu"]
BUCKET = "scanbench"
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have "
         "an they you were her she there been one all we their has would when if so no will more can said what "
         "up its about into them than only other time new some could these two may first then do any like my "
         "now over such our man me even most made after also did many before must through back years where much").split()


def part_rows(part: int, rows: int, config_hash: str, seed: int) -> list[dict]:
    """One part's rows as a job writes them (pipeline.records.OUTPUT_SCHEMA)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rows):
        rid = f"corpus/spk{part:04d}/utt{part * rows + r:08d}.flac"
        if rng.random() < 0.002:
            out.append({"id": rid, "audio": f"/data/{rid}", "stage": "error", "segments": [], "text": None,
                        "error": f"file not found: /data/{rid}", "decoder": "ar", "config_hash": config_hash,
                        "finished_at": 1.7e9 + r, "filter_reasons": [], "t_prepare_s": 0.01})
            continue
        duration = float(rng.uniform(3.0, 12.0))
        words = []
        while sum(len(w) + 1 for w in words) < 80:
            words.append(str(rng.choice(WORDS)))
        # a recording over 8 s as two segments, each half of its words and of its time
        halves = 2 if duration > 8 else 1
        segments = []
        for k in range(halves):
            chunk = words[k * len(words) // halves:(k + 1) * len(words) // halves]
            start, end = k * duration / halves, (k + 1) * duration / halves
            step = (end - start) / len(chunk)
            segments.append({
                "start": start, "end": end, "text": " ".join(chunk), "stage": "ar", "tokens": len(chunk) + 3,
                "max_entropy": float(rng.uniform(0, 3)), "min_prob": float(rng.uniform(0.3, 1)),
                "prefix_len": 0, "drafted": 0, "generated": len(chunk) + 3, "error": None,
                "words": [{"word": w, "start": start + i * step, "end": start + (i + 1) * step,
                           "confidence": float(rng.uniform(0.5, 1))} for i, w in enumerate(chunk)],
                "filter_reasons": [], "spans": None, "language": "en", "language_prob": None,
                "confidence": float(rng.uniform(0.5, 1))})
        out.append({"id": rid, "audio": f"/data/{rid}", "offset_s": None, "duration_s": duration,
                    "text": " ".join(words), "reference": None, "segments": segments, "stage": "ar",
                    "error": None, "decoder": "ar", "t_prepare_s": 0.01, "t_encode_s": 0.05, "t_decode_s": 0.2,
                    "t_fallback_s": 0.0, "config_hash": config_hash, "finished_at": 1.7e9 + r,
                    "filter_reasons": [], "language": "en", "language_prob": None,
                    "confidence": float(rng.uniform(0.5, 1))})
    return out


def build(work: Path, parts: int, rows: int) -> tuple[Path, Path]:
    """The output folder and the input manifest (made once; kept between invocations)."""
    from pipeline.config import config_hash, load_config
    from pipeline.output import write_part
    from pipeline.records import OUTPUT_SCHEMA, table

    out, manifest = work / f"out-{parts}x{rows}", work / f"input-{parts}x{rows}.jsonl"
    if not manifest.exists():
        job_hash = config_hash(load_config(None, OVERRIDES))
        shutil.rmtree(out, ignore_errors=True)
        with open(f"{manifest}.tmp", "w") as fh:
            for p in range(parts):
                data = part_rows(p, rows, job_hash, seed=p)
                write_part(table(data, OUTPUT_SCHEMA), str(out), "bench")
                fh.writelines(json.dumps({"id": d["id"], "audio": d["audio"]}) + "\n" for d in data)
        os.replace(f"{manifest}.tmp", manifest)
    return out, manifest


def time_start(manifest: Path, dst: str, mode: str, extra: list[str]) -> dict:
    """One job start in this process: seconds from the end of the source's scan to the
    worker stub (or to the dry run's answer)."""
    import pipeline.sources as sources
    from jobs import transcribe

    marks: dict[str, float] = {}
    real_scan = sources.scan

    def scan(*a, **k):
        result = real_scan(*a, **k)
        marks["scanned"] = time.perf_counter()
        return result

    def workers(args, cfg, ids, todo, rows, items, job_hash, formats, job_id):
        marks["workers"] = time.perf_counter()
        marks["todo"] = len(todo)
        return 0

    parser = argparse.ArgumentParser()
    transcribe.add_arguments(parser)
    flags = {"dry_run": ["--dry-run"], "resume": [], "retry_errors": ["--retry-errors"]}[mode]
    args = parser.parse_args(["--input", str(manifest), "--output", dst, "--runner", "local", *flags]
                             + [a for o in OVERRIDES + extra for a in ("--set", o)])
    sources.scan, real_workers, transcribe._transcribe = scan, transcribe._transcribe, workers
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = transcribe.run(args)
        end = marks.get("workers", time.perf_counter())
    finally:
        sources.scan, transcribe._transcribe = real_scan, real_workers
    if code != 0:
        raise SystemExit(f"{mode}: exit {code}: {err.getvalue()[-2000:]}")
    return {"mode": mode, "start_s": round(end - marks["scanned"], 3), "todo": marks.get("todo"),
            "said": (out.getvalue() + err.getvalue()).strip().splitlines()[-1][:160]}


def _moto(port_queue) -> None:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    port_queue.put(server.get_host_and_port()[1])
    while True:
        time.sleep(3600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--parts", type=int, default=200)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--store", default="local,s3")
    ap.add_argument("--modes", default="dry_run,resume,retry_errors")
    opts = ap.parse_args()
    opts.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    out, manifest = build(opts.work, opts.parts, opts.rows)
    size = sum(p.stat().st_size for p in out.glob("part-*.parquet"))
    print(json.dumps({"parts": opts.parts, "rows": opts.rows, "bytes": size,
                      "ready_s": round(time.perf_counter() - t0, 1)}), flush=True)
    modes = opts.modes.split(",")
    for store in opts.store.split(","):
        extra, server, endpoint = [], None, None
        if store == "s3":
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                os.environ[key] = "test"
            os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
            ports = multiprocessing.Queue()
            server = multiprocessing.Process(target=_moto, args=(ports,), daemon=True)
            server.start()
            endpoint = f"http://127.0.0.1:{ports.get(timeout=60)}"
            extra = [f"storage.options={{endpoint_url: '{endpoint}'}}"]
        try:
            for mode in modes:
                for run in range(opts.runs):
                    dst = _fresh(out, opts.work, mode, endpoint)
                    result = time_start(manifest, dst, mode, extra)
                    print(json.dumps({"store": store, "run": run + 1, **result}), flush=True)
        finally:
            if server is not None:
                server.terminate()


def _fresh(out: Path, work: Path, mode: str, endpoint: str | None) -> str:
    """The folder a run reads: ``out`` itself, or a copy where the run changes it, or on
    S3 (at ``endpoint``) a copy uploaded once, and again for a run that changes it."""
    if endpoint is None:
        if mode != "retry_errors":
            return str(out)
        copy = work / "retry-copy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(out, copy)
        return str(copy)
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    dst = f"{BUCKET}/out"
    if mode == "retry_errors" or not fs.exists(dst):
        if fs.exists(dst):
            fs.rm(dst, recursive=True)
        fs.put([str(p) for p in sorted(out.glob("part-*.parquet"))], f"{dst}/")
    fs.invalidate_cache()
    return f"s3://{dst}"


if __name__ == "__main__":
    sys.exit(main())
