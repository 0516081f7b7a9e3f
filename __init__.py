"""shardscribe: batch transcription of audio corpora into Parquet, on a Ray cluster or one
machine.

    import shardscribe

    summary = shardscribe.transcribe("data/calls.jsonl", "out/calls", config="ar", runner="local")

The package's layers, each importing only those below it: ``shardscribe.pipeline`` (the
library: config, audio, models, decoding, output), ``shardscribe.actors`` (the runners),
``shardscribe.jobs`` (the command line and the Python API, ``shardscribe.jobs.api``). The
API's names are importable from here; importing the package loads none of them until used.
"""
from __future__ import annotations

from importlib import metadata

_API = ("transcribe", "pseudo_label", "JobError", "JobFailed", "JobIncomplete", "JobInterrupted", "JobSpec",
        "overrides_of")

try:
    __version__ = metadata.version("shardscribe")
except metadata.PackageNotFoundError:   # a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str):
    if name in _API:
        from shardscribe.jobs import api

        return getattr(api, name)
    raise AttributeError(f"module 'shardscribe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
