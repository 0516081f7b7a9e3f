"""shardscribe from Python: one call per job, the same job as the command line's.

    from shardscribe.jobs.api import transcribe

    summary = transcribe("data/calls.jsonl", "out/calls", config="ar", runner="local",
                         decoder__max_new_tokens=128, formats="srt,json")
    print(summary["rows_out"], summary["wer"])

Config overrides (the command line's ``--set KEY=VALUE``) are keyword arguments whose
name is the dotted key with ``__`` for each dot (``decoder__max_new_tokens=128`` is
``--set decoder.max_new_tokens=128``), or a ``set={"decoder.max_new_tokens": 128}``
mapping for keys that are not Python names; the keywords apply after ``set``. A value
that is not a string is written as JSON (``True`` -> true, ``None`` -> null, lists), a
string as the YAML text ``--set`` would read.

The job writes what the command line's writes (the Parquet parts, the summary, the job
log and the format files, in the output folder), says its start and its progress on
stderr, and sends Ray's and the workers' output to the job log unless ``verbose=True``;
the closing table is not printed: the summary is returned. A refused job raises JobError
with the command line's one-line reason, before anything is written; a job that ran but
is not done raises JobIncomplete (a JobError; ``exc.summary`` holds its summary),
JobFailed or JobInterrupted (actors.job.spec).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..actors.job.spec import JobError, JobFailed, JobIncomplete, JobInterrupted, JobSpec

__all__ = ["JobError", "JobFailed", "JobIncomplete", "JobInterrupted", "JobSpec", "overrides_of", "pseudo_label",
           "transcribe"]

# The keyword arguments that are JobSpec options, not config overrides.
_OPTIONS = ("model", "formats", "overwrite", "resume", "retry_errors", "dry_run", "audio_column", "text_column",
            "verbose", "progress_interval")


def overrides_of(set: Mapping[str, Any] | None = None, **keys: Any) -> list[str]:
    """``KEY=VALUE`` override strings from a ``set`` mapping of dotted keys and from
    keywords with ``__`` for the dots."""
    items = list((set or {}).items()) + [(k.replace("__", "."), v) for k, v in keys.items()]
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in items]


def _spec(input: str, output: str, config: str | None, runner: str, set: Mapping[str, Any] | None,
          kwargs: dict) -> JobSpec:
    options = {k: kwargs.pop(k) for k in _OPTIONS if k in kwargs}
    return JobSpec(input=str(input), output=str(output), config=config, runner=runner,
                   overrides=overrides_of(set, **kwargs), **options)


def _console(spec: JobSpec):
    from .transcribe import Console

    return Console(verbose=spec.verbose, progress_interval=spec.progress_interval, configure_logging=False)


def transcribe(input: str, output: str, config: str | None = None, runner: str = "ray", *,
               set: Mapping[str, Any] | None = None, **kwargs: Any) -> dict:
    """Transcribe ``input`` (a folder or glob of audio, a JSONL manifest or a Parquet
    table) into the Parquet folder ``output`` with ``config`` (a conf/ name or a path;
    None: default) on the ``runner`` ("ray" or "local": in this process, without Ray).

    Keyword options, as the command line's flags: ``model`` (a checkpoint), ``formats``
    ("srt,vtt,json,tsv,nemo" or a list), ``overwrite``, ``resume``, ``retry_errors``,
    ``dry_run``, ``audio_column``, ``text_column``, ``verbose``, ``progress_interval``.
    Every other keyword, and ``set``, is a config override (see the module's docstring).

    Returns the job's summary, the mapping written to summary.json (rows_in, rows_out,
    errors, wer, rtfx, ...; its ``written`` attribute lists the format files); with
    ``dry_run=True``, what the job would do (``message`` says it in one line)."""
    from ..actors.job import run_job

    spec = _spec(input, output, config, runner, set, kwargs)
    console = _console(spec)
    return run_job(spec, on_progress=console.progress, log=console)


def pseudo_label(input: str, output: str, config: str | None = None, runner: str = "ray", *,
                 min_confidence: float | None = None, keep_fraction: float | None = None,
                 set: Mapping[str, Any] | None = None, **kwargs: Any) -> dict:
    """``transcribe`` with confidence on, then the pseudo-label exports under
    output/__pseudo_label/ (``shardscribe pseudo-label``): keep the rows
    whose confidence is at least ``min_confidence``, or the best ``keep_fraction`` of them.
    Returns ``{"summary": the job's summary, "report": the exports' report (kept, rows,
    utterances, ...), "written": the URLs of the exports}``. Needs matplotlib."""
    from ..actors.job import run_pseudo_label

    spec = _spec(input, output, config, runner, set, kwargs)
    console = _console(spec)
    return run_pseudo_label(spec, min_confidence, keep_fraction, on_progress=console.progress, log=console)
