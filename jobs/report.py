"""Write a one-page HTML report of a transcription output: `shardscribe report DST`.

Throughput over the job's time, stage shares, the duration histogram, WER by stage and by
duration bucket (where references exist), the errors table and the transcripts (the first
rows by id; the worst rows by WER where references exist), WER in percent throughout, as
DST/__shardscribe__/report.html with its PNG plots beside it. Needs matplotlib
(`pip install shardscribe[report]`).
"""
from __future__ import annotations

import argparse
import sys

COMMAND = "report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", metavar="DST", help="the output folder of a transcribe job (any fsspec URL)")
    parser.add_argument("--config", default=None, help="the job's config, for its storage.options")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="e.g. storage.options={endpoint_url: ...} for an S3-compatible store")


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("shardscribe: error: the report needs matplotlib: pip install 'shardscribe[report]'", file=sys.stderr)
        return 2
    from ..pipeline.config import ConfigError, load_config
    from ..pipeline.report import write_report
    from ..pipeline.storage import StorageError, redact_uri

    try:
        options = load_config(args.config, args.overrides).storage.options
        url = write_report(args.output, options)
    except (ConfigError, StorageError, FileNotFoundError) as exc:
        print(f"shardscribe: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:    # the store behind DST (permissions, credentials, network)
        print(f"shardscribe: error: output {redact_uri(args.output)}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"Report: {url}")
    return 0
