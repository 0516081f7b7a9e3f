"""The `shardscribe` command line: one sub-command per job module.

Every module in the `jobs` package that defines ``COMMAND`` (its sub-command name),
``add_arguments(parser)`` and ``run(args) -> int`` is registered here, so a new job is
one new file. Modules import their heavy dependencies inside ``run`` so that
``shardscribe --help`` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
import traceback

from .. import jobs
def _job_modules():
    for info in sorted(pkgutil.iter_modules(jobs.__path__), key=lambda m: m.name):
        if info.name == "cli":   # jobs/bench/ is one sub-command (`bench NAME`) over its modules
            continue
        module = importlib.import_module(f"shardscribe.jobs.{info.name}")
        if hasattr(module, "COMMAND"):
            yield module


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardscribe")
    except PackageNotFoundError:   # run from a checkout that was never installed
        return "unknown (not installed)"


def _summary(doc: str | None) -> str | None:
    """A module docstring's first sentence, whole (its first paragraph may wrap)."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    if not paragraph:
        return None
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[:end + 1]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shardscribe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"shardscribe {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in _job_modules():
        # A module's epilog (examples, common keys) is built only for its own --help.
        wants_help = module.COMMAND in sys.argv[1:2] and {"-h", "--help"} & set(sys.argv)
        epilog = module.epilog() if wants_help and hasattr(module, "epilog") else None
        p = sub.add_parser(module.COMMAND, help=_summary(module.__doc__), description=module.__doc__,
                           epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..actors.job.signals import describe, interrupts

    # SIGTERM as well as SIGINT unwinds the command from its first line (a job inside
    # commits, shuts Ray down and releases its lock on the way out): exit 130, one line.
    with interrupts():
        try:
            parser = build_parser()
            # Benchmarks take options of their own; everything else must parse exactly.
            args, extra = parser.parse_known_args(argv)
            if extra and not getattr(args, "accepts_extra", False):
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            args.extra = extra
            return int(args._run(args) or 0)
        except KeyboardInterrupt as exc:
            print(f"shardscribe: interrupted: {describe(exc)}", file=sys.stderr, flush=True)
            return 130


def entry() -> None:
    """The console script: ``main``, then an exit that skips interpreter finalization.

    By the time ``main`` returns, every output is committed and Ray is shut down. What is
    left is finalization, and there native code can abort a finished job: a daemon thread
    that comes back from a GIL-releasing C++ call (torch, soxr) is ended by a forced unwind
    that std::terminate()s when it meets a C++ destructor (seen once in CI as "terminate
    called without an active exception", exit -6, after a job that wrote every row)."""
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
