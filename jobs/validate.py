"""Audit a corpus before a long job: `shardscribe validate SRC`.

Runs the transcription job with the `audit` decoder kind (pipeline.kinds.audit.stage): every
recording is read, decoded and segmented exactly as a job would, no model is loaded, and
one row per recording is written with its duration or its error. Prints how many rows,
how many hours, and the first recordings that failed with why. Exit 0: every recording is
usable; 1: some are not (listed); 2: the source or config is unusable.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile

COMMAND = "validate"
SHOWN_ERRORS = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="folder/glob of audio, JSONL manifest or Parquet")
    parser.add_argument("--output", default=None,
                        help="keep the per-recording rows here (default: a temporary folder)")
    parser.add_argument("--config", default=None, help="config whose audio.* settings to audit with")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--runner", choices=["ray", "local"], default="ray")
    parser.add_argument("--audio-column", default=None)
    parser.add_argument("--text-column", default=None)
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--overwrite", action="store_true",
                          help="--output holds another job's rows: remove them and audit everything")
    existing.add_argument("--resume", action="store_true",
                          help="--output holds another job's rows: keep them (they count as audited)")
    parser.add_argument("--retry-errors", action="store_true",
                        help="audit again the recordings that failed in --output (after fixing them)")


def run(args: argparse.Namespace) -> int:
    from ..actors.job import JobSpec
    from . import transcribe
    from ..pipeline.output import iter_output, summary_exists

    with tempfile.TemporaryDirectory(prefix="shardscribe-validate-") as tmp:
        output = args.output or tmp
        job = JobSpec(input=args.input, output=output, config=args.config, runner=args.runner,
                      overrides=list(args.overrides) + ["decoder.kind=audit", "model.device=cpu"],
                      audio_column=args.audio_column, text_column=args.text_column, overwrite=args.overwrite,
                      resume=args.resume, retry_errors=args.retry_errors, print_transcripts=False)
        if args.output:
            code = transcribe.execute(job)
        else:
            # The job's table and "Output: ..." lines would name a temporary folder that is
            # gone when this returns; the audit's own lines below say what it found.
            with contextlib.redirect_stdout(io.StringIO()):
                code = transcribe.execute(job)
        if code == 2 or (code and not summary_exists(output)):
            # Refused before it started, or stopped (its own message said why): there is
            # no audit to report.
            return code
        # a batch at a time: a corpus of millions of rows is audited in bounded memory;
        # only this source's rows (--output may hold an earlier audit's of another source)
        ids = _source_ids(args)
        n = n_failed = 0
        seconds = 0.0
        shown: list[dict] = []
        for batch in iter_output(output, ["id", "duration_s", "error"]):
            rows = [r for r in batch if r["id"] in ids]
            n += len(rows)
            seconds += sum(r["duration_s"] or 0.0 for r in rows)
            failed = [r for r in rows if r["error"]]
            n_failed += len(failed)
            shown.extend(failed[:SHOWN_ERRORS - len(shown)])
    print(f"shardscribe: validate: {n} recordings, {seconds / 3600:.2f} h of audio, "
          f"{n_failed} unusable", file=sys.stderr)
    for r in shown:
        print(f"  {r['id']}: {r['error']}", file=sys.stderr)
    if n_failed > SHOWN_ERRORS:
        print(f"  ... and {n_failed - SHOWN_ERRORS} more (--output keeps every row)", file=sys.stderr)
    return 1 if n_failed or code else 0


def _source_ids(args: argparse.Namespace) -> set[str]:
    from ..pipeline.sources import open_source, scan

    return set(scan(open_source(args.input, args.audio_column, args.text_column)).ids.to_pylist())
