"""What a job is given (``JobSpec``), what it tells its caller on the way (``JobConsole``,
``JobProgress``), what it returns (``JobSummary``) and how it fails (``JobError`` and its
kinds). Imports nothing heavy: a command line reads these before it parses a config."""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Sequence

RUNNERS = ("ray", "local")


@dataclass
class JobSpec:
    """One transcription job: the ``shardscribe transcribe`` options, as data.

    ``input``: a folder or glob of audio, a JSONL manifest or a Parquet table (any fsspec
    URL); ``output``: the output folder. ``config``: a conf/<name>.yaml name or a path
    (None: default); ``overrides``: ``KEY=VALUE`` strings, as ``--set`` takes them;
    ``model``: a checkpoint (``--model``). ``formats``: ``"srt,vtt"`` or a list of names.
    ``overwrite``/``resume``/``retry_errors``/``dry_run``: as their flags. ``verbose``,
    ``progress_interval`` and ``print_transcripts`` (``--print`` True, ``--quiet`` False,
    None: a small job's) are for the caller's console (the job does not read them)."""

    input: str
    output: str
    config: str | None = None
    overrides: Sequence[str] = field(default_factory=list)
    model: str | None = None
    runner: str = "ray"
    formats: str | Sequence[str] = ""
    overwrite: bool = False
    resume: bool = False
    retry_errors: bool = False
    dry_run: bool = False
    audio_column: str | None = None
    text_column: str | None = None
    verbose: bool = False
    progress_interval: float = 10.0
    print_transcripts: bool | None = None

    @property
    def format_list(self) -> str:
        """``formats`` as the comma-separated text pipeline.formats.parse_formats reads."""
        return self.formats if isinstance(self.formats, str) else ",".join(self.formats)


class JobError(Exception):
    """A job that did not finish as asked. ``str(exc)`` is one line (the command line prints
    it after ``shardscribe: <label>: ``); ``code`` is the command's exit status. A plain
    JobError (code 2) is a refusal: raised before any worker started, nothing written."""

    code = 2
    label = "error"
    started = False      # raised after the workers started (the console may hold a progress line)

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class JobInterrupted(JobError, KeyboardInterrupt):
    """Ctrl-C or a scheduler's SIGTERM during the run: the rows finished so far are
    committed, and the same job resumes after them. Also a KeyboardInterrupt."""

    code = 130
    label = "interrupted"
    started = True


class JobFailed(JobError):
    """The run stopped: an exception in it (code 1) or no progress within
    ray.no_progress_timeout_s (code 3). Its committed rows stay; there is no summary."""

    code = 1
    started = True


class JobIncomplete(JobError):
    """The job ran and committed its summary, but it is not done: rows in != rows out
    (code 1), or every recording this run read failed (code 4). ``summary`` is the
    JobSummary it committed."""

    code = 1

    def __init__(self, message: str, code: int, summary: "JobSummary"):
        super().__init__(message, code)
        self.summary = summary


class JobSummary(dict):
    """The job's summary: the same mapping as DST/__shardscribe__/summary.json. ``written``:
    the ``formats`` folders and files it wrote, relative to DST."""

    written: list[str] = []


@dataclass(frozen=True)
class JobProgress:
    """Running totals of a job's run over ``total`` recordings; ``final``: the counts read
    back from the committed output, once, at the end."""

    total: int
    rows: int
    audio_seconds: float
    errors: int
    final: bool = False
    # Recordings' shares done of those still in progress (the pieces of a long recording
    # finished before it): the bar's position is rows + partial.
    partial: float = 0.0


class JobConsole:
    """Where a job's lines go, and what surrounds the run of its workers. This base logs the
    lines (logger ``shardscribe.job``), keeps no log file and leaves the process's output
    alone; the command line's console (jobs/transcribe.py) writes them on the terminal and
    opens the job log in the output folder around the run."""

    url: str | None = None          # the job log's location, recorded in the summary
    captures_output = False         # the workers' output goes to the log at ``url``

    def say(self, line: str) -> None:
        """A line for the person running the job (resuming, retrying, starting)."""
        logging.getLogger("shardscribe.job").info(line)

    def session(self, dst: str):
        """A context manager around the run of the workers, their summary and commit."""
        return contextlib.nullcontext()


class _Lines(JobConsole):
    """A JobConsole from a callable that takes each line."""

    def __init__(self, say):
        self.say = say


def console_of(log) -> JobConsole:
    """``run_job``'s ``log``: a JobConsole, a callable taking each line, or None (the base)."""
    if log is None:
        return JobConsole()
    if isinstance(log, JobConsole):
        return log
    if callable(log):
        return _Lines(log)
    raise TypeError(f"log: a JobConsole or a callable taking a line, not {type(log).__name__}")
