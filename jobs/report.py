"""Write a one-page HTML report of a transcription output: `shardscribe report DST`.

Throughput over time, stage shares, the duration histogram, WER by stage and by duration
bucket (where references exist) and the errors table, as DST/__shardscribe__/report.html
with its PNG plots beside it. Needs matplotlib (`pip install shardscribe[report]`).
"""
from __future__ import annotations

import argparse
import sys

COMMAND = "report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", metavar="DST", help="the output folder of a transcribe job (any fsspec URL)")


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("shardscribe: error: the report needs matplotlib: pip install 'shardscribe[report]'", file=sys.stderr)
        return 2
    from pipeline.report import write_report

    try:
        url = write_report(args.output)
    except FileNotFoundError as exc:
        print(f"shardscribe: error: {exc}", file=sys.stderr)
        return 2
    print(f"Report: {url}")
    return 0
