"""Transcribe audio into Parquet: `shardscribe transcribe --input SRC --output DST`.

SRC is a folder or glob of audio files, a JSONL manifest or a Parquet table, on any
fsspec filesystem. DST gets one Parquet row per recording, then `_summary.json` and, when
every input row has exactly one output row, `_SUCCESS` (pipeline.output: the folder's
commit protocol). A rerun into the same DST skips recordings that already have a row; a
second job into a DST that a live job holds is refused.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

COMMAND = "transcribe"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="folder/glob of audio, JSONL manifest or Parquet")
    parser.add_argument("--output", required=True, help="output directory (any fsspec URL)")
    parser.add_argument("--config", default=None, help="conf/<name>.yaml name or path (default: default)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set decoder.max_new_tokens=128")
    parser.add_argument("--runner", choices=["ray", "local"], default="ray",
                        help="Ray Data plan (default) or in-process without Ray")


def run(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_config
    from pipeline.output import OutputBusy
    from pipeline.sources import SourceError, read_source
    from pipeline.storage import StorageError

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, args.overrides)
        use_storage(cfg, args)
        rows = read_source(args.input)
        lock = hold_output(args.output, cfg)
    except (ConfigError, SourceError, StorageError, OutputBusy) as exc:
        print(f"shardscribe: error: {exc}", file=sys.stderr)
        return 2
    try:
        return _run_locked(args, cfg, rows, lock.job_id)
    finally:
        lock.release()


def use_storage(cfg, args) -> None:
    """storage.options for the input and output protocols; a missing backend (s3fs,
    gcsfs) or an unreachable store is one line here, before any worker starts."""
    from pipeline.storage import check_reachable, use_options

    use_options(cfg.storage.options, [args.input, args.output])
    for url in (args.input, args.output):
        check_reachable(url, cfg.storage.options)


def hold_output(dst: str, cfg):
    """Take the output folder's lock and open it for this job (pipeline.output)."""
    from pipeline.output import OutputLock, begin_job, new_job_id

    lock = OutputLock(dst, new_job_id(), cfg.storage.options).acquire()
    try:
        begin_job(dst, lock.job_id, cfg.storage.options)
    except BaseException:
        lock.release()
        raise
    return lock


def commit(dst: str, cfg, summary: dict) -> bool:
    """The job commit: the summary, then the success marker when rows in == rows out."""
    from pipeline.output import commit_job

    ok = summary["rows_out"] == summary["rows_in"] and not summary["duplicate_rows"]
    commit_job(dst, summary, ok, cfg.storage.options)
    return ok


def _run_locked(args, cfg, rows: list[dict], job_id: str) -> int:
    from pipeline.output import existing_ids, summarize
    from pipeline.storage import redact_uri

    done = existing_ids(args.output, job_id, cfg.storage.options)
    todo = [r for r in rows if r["id"] not in done]
    if done:
        print(f"shardscribe: resuming: {len(rows) - len(todo)} of {len(rows)} recordings already in "
              f"{redact_uri(args.output)}", file=sys.stderr)
    start = time.perf_counter()
    if todo:
        if args.runner == "local":
            from actors.local_runner import run_local

            run_local(todo, cfg, args.output, job_id=job_id)
        else:
            from actors.plan import JobStalled, run_ray

            try:
                run_ray(todo, cfg, args.output, job_id=job_id)
            except JobStalled as exc:
                print(f"shardscribe: error: {exc}", file=sys.stderr)
                return 3
    wall = time.perf_counter() - start
    summary = summarize(args.output, [r["id"] for r in rows], {
        "config": cfg.name, "runner": args.runner, "run_rows": len(todo),
        "skipped_existing": len(rows) - len(todo), "wall_seconds": wall,
    }, run_ids={r["id"] for r in todo}, options=cfg.storage.options)
    ok = commit(args.output, cfg, summary)
    print(json.dumps(summary, indent=2))
    if not ok:
        print(f"shardscribe: error: rows in {summary['rows_in']} != rows out {summary['rows_out']} "
              f"(duplicates {summary['duplicate_rows']}, missing e.g. {summary['missing_ids'][:5]})",
              file=sys.stderr)
        return 1
    print(f"shardscribe: {summary_line(summary)}", file=sys.stderr)
    return 0


def summary_line(summary: dict) -> str:
    """The job's last line: counts, then speed and WER only where they were measured (a
    rerun with nothing left to do has no speed; a source without references has no WER)."""
    parts = [f"{summary['rows_out']} rows", f"{summary['errors']} errors"]
    if summary.get("run_rows") and summary.get("rtfx"):
        parts.append(f"RTFx {summary['rtfx']:.2f}")
    if summary.get("wer") is not None:
        parts.append(f"WER {100 * summary['wer']:.1f}% over {summary.get('wer_rows', 0)} rows")
    return ", ".join(parts)
