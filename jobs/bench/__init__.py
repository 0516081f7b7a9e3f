"""Run a named benchmark: `shardscribe bench NAME [--manifest F] [--quick] [--out R.json]`.

Each benchmark is a module of this package, ``jobs/bench/<name>.py`` (dashes become
underscores), and defines ``add_arguments(parser)`` (optional) and
``run(args) -> {"rows": [...], "summary": {...}}``. The package's other modules are shared
by benchmarks and are not benchmarks themselves (``SHARED``). This module owns the shared
contract: the common flags, the terminal table and the JSON file. Speed claims are ratios
against a baseline measured in the same run. The `shardscribe` command line registers this
package as its `bench` sub-command; nothing here is imported by a transcription job.
"""
from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from pathlib import Path

COMMAND = "bench"
# Modules here that are not benchmarks: held-out data, references and timing (data), the
# checkpoint half of `bench ctc-beam --model DIR` (ctc_beam_model), and how both halves of
# `bench ctc-beam` run our search (ctc_beam_runs).
SHARED = frozenset({"data", "ctc_beam_model", "ctc_beam_runs"})


def available() -> list[str]:
    return sorted(m.name.replace("_", "-") for m in pkgutil.iter_modules(__path__)
                  if m.name not in SHARED and not m.name.startswith("_"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="benchmark name: " + ", ".join(available()))
    parser.add_argument("--manifest", help="held-out JSONL manifest with references")
    parser.add_argument("--quick", action="store_true", help="finish within ~3 minutes on 2 CPU cores")
    parser.add_argument("--out", help="write {rows, summary} JSON here")
    parser.add_argument("--runner", choices=["ray", "local"], default="local",
                        help="run actors through Ray or in-process (the GPU machine has no Ray)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    parser.set_defaults(accepts_extra=True)  # benchmark-specific options pass through


def format_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]

    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    body = [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(b) for b in body])


def run(args: argparse.Namespace) -> int:
    if args.name.replace("_", "-") not in available():
        print(f"unknown benchmark {args.name!r}; available: {', '.join(available())}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__name__}.{args.name.replace('-', '_')}")
    extra_parser = argparse.ArgumentParser(prog=f"shardscribe bench {args.name}")
    if hasattr(module, "add_arguments"):
        module.add_arguments(extra_parser)
    extra = extra_parser.parse_args([a for a in args.extra if a != "--"])
    for key, value in vars(extra).items():
        setattr(args, key, value)
    result = module.run(args)
    print(format_table(result["rows"]))
    print("summary: " + json.dumps(result["summary"], indent=2, default=float))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2, default=float)
    return 0
