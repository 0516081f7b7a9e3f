"""Transcribe audio into Parquet: `shardscribe transcribe --input SRC --output DST`.

SRC is a folder or glob of audio files, a JSONL manifest or a Parquet table, on any
fsspec filesystem. DST gets one Parquet row per recording and a summary.json. A rerun
into the same DST skips recordings that already have a row.
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
    parser.add_argument("--audio-column", default=None,
                        help="table column / manifest key of the audio (default: audio, audio_filepath, file, path)")
    parser.add_argument("--text-column", default=None,
                        help="table column / manifest key of the reference text "
                             "(default: text, sentence, transcription, transcript, normalized_text)")


def run(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_config
    from pipeline.output import existing_ids, summarize
    from pipeline.sources import SourceError, open_source, scan, unfinished_ids

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(args.config, args.overrides)
        # The source is scanned for its ids only; its rows are read where they are used.
        source = open_source(args.input, args.audio_column, args.text_column)
        scanned = scan(source)
    except (ConfigError, SourceError) as exc:
        print(f"shardscribe: error: {exc}", file=sys.stderr)
        return 2
    ids = scanned.ids.to_pylist()
    done = existing_ids(args.output)
    todo = unfinished_ids(scanned.ids, done)
    if done:
        print(f"shardscribe: resuming: {len(ids) - len(todo)} of {len(ids)} recordings already in "
              f"{args.output}", file=sys.stderr)
    start = time.perf_counter()
    if todo:
        rows = source.excluding(done) if done else source
        if args.runner == "local":
            from actors.local_runner import run_local

            run_local(rows, cfg, args.output, items=scanned.items)
        else:
            from actors.plan import run_ray

            run_ray(rows, cfg, args.output, items=scanned.items)
    wall = time.perf_counter() - start
    summary = summarize(args.output, ids, {
        "config": cfg.name, "runner": args.runner, "run_rows": len(todo),
        "skipped_existing": len(ids) - len(todo), "wall_seconds": wall,
    }, run_ids=set(todo))
    print(json.dumps(summary, indent=2))
    if summary["rows_out"] != summary["rows_in"] or summary["duplicate_rows"]:
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
