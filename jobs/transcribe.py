"""Transcribe audio into Parquet: `shardscribe transcribe --input SRC --output DST`.

SRC is a folder or glob of audio files, a JSONL manifest or a Parquet table, on any
fsspec filesystem. DST gets one Parquet row per recording; any `--format` files go beside
the parts (DST/__srt/, DST/__txt/, ...), and the summary, the success marker, the lock
and the job log to DST/__shardscribe__/: folders every Parquet reader skips
(pipeline.output: the folder's commit protocol). An interrupted job's last line says how
many rows DST holds, counted once the job has let go of the folder. A rerun
into the same DST skips recordings that already have a row; a rerun with another config
is refused unless --overwrite (redo all) or --resume (keep the rows, add the rest);
--retry-errors also redoes the recordings whose rows hold an error; a second job into a
DST that a live job holds is refused.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys

from ..actors.job.spec import JobConsole, JobError, JobIncomplete, JobInterrupted, JobProgress, JobSpec

COMMAND = "transcribe"
LOG_NAME = "transcribe.log"
# A job of fewer recordings prints its transcripts at the end (--print / --quiet decide).
PRINT_UNDER = 10


EXAMPLES = """examples:
  shardscribe transcribe --input pipeline/assets/samples/samples.jsonl --output out/samples
  shardscribe transcribe --input 's3://bucket/calls/*.flac' --output s3://bucket/transcripts --config ar \\
      --set model.device=cuda --set batching.recordings_per_batch=32
  shardscribe transcribe --input talk.wav --output out/talk --config ar --set model.language=auto \\
      --format srt,json --runner local"""

# The keys most jobs set, shown in --help with the default config's values (`shardscribe
# keys` lists every key).
COMMON_KEYS = {
    "model.source": "embedded (Whisper tiny.en), embedded_rnnt, a checkpoint directory or cached hub id",
    "model.device": "auto | cpu | cuda | cuda:N",
    "model.dtype": "float32 | float16 | bfloat16",
    "model.language": "a language code, auto (detected per recording), or null (the model's own)",
    "model.task": "transcribe | translate (multilingual Whisper models)",
    "decoder.kind": "ar, ssd, ctc_greedy, ctc_beam, transducer_greedy, transducer_beam (or --config)",
    "decoder.max_new_tokens": "longest transcript of one segment, in tokens",
    "ssd.preset": "high_accuracy | high_rtfx",
    "batching.recordings_per_batch": "rows handed to one actor call",
    "batching.max_tokens": "padded encoder frames per model sub-batch",
    "audio.max_segment_s": "longer recordings are cut at pauses (silero-vad)",
    "audio.vad_threshold": "silero-vad speech probability",
    "confidence.enabled": "word, segment and row confidence (one extra decoder pass)",
    "ray.address": "null: a local Ray instance (RAY_ADDRESS is honoured); auto or ray://HOST:PORT",
    "ray.decode_actors": "model actors: auto (one per GPU of the cluster, growing with it) or a number",
}


def epilog() -> str:
    """Examples and the common --set keys with the default config's values, for --help."""
    from ..pipeline.config import load_config

    data = load_config("default").to_dict()
    width = max(map(len, COMMON_KEYS))
    rows = []
    for key, what in COMMON_KEYS.items():
        section, name = key.split(".")
        value = data.get(section, {}).get(name)
        rows.append(f"  {key:<{width}} = {'null' if value is None else value!s:<14} {what}")
    return (EXAMPLES + "\n\ncommon --set keys (value in the default config; `shardscribe keys` lists every key):\n"
            + "\n".join(rows) + "\n\nconfigs: `shardscribe configs` lists them (--config ar, ssd, ctc_beam, ...)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="folder/glob of audio, JSONL manifest or Parquet")
    parser.add_argument("--output", required=True, help="output directory (any fsspec URL)")
    parser.add_argument("--config", default=None, help="conf/<name>.yaml name or path (default: default)")
    parser.add_argument("--model", default=None, metavar="NAME|DIR|ID",
                        help="a shipped model (tiny.en, the default; base: multilingual Whisper base), a "
                        "checkpoint directory or a Hugging Face id (read from the local cache; downloaded "
                        "only with --allow-download): its family is read from its config.json; without "
                        "--config a Whisper model other than tiny.en runs with the ar config")
    parser.add_argument("--allow-download", action="store_true",
                        help="download a --model hub id that is not in the local cache (model.allow_download)")
    parser.add_argument("--language", default=None, metavar="CODE|auto|CODE,CODE",
                        help="the speech's language (model.language): a code such as es; auto to detect it per "
                             "recording; or the codes it may be, es,fr, to detect among those only "
                             "(model.language_candidates). Multilingual models; written on each row")
    parser.add_argument("--task", default=None, choices=["transcribe", "translate"],
                        help="model.task: translate decodes into English (multilingual models)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set decoder.max_new_tokens=128")
    parser.add_argument("--runner", choices=["ray", "local"], default="ray",
                        help="Ray (default: model actors on every GPU of the cluster) or in-process without Ray")
    parser.add_argument("--format", default="", metavar="LIST",
                        help="also write srt,vtt,json,tsv,txt per recording and/or nemo (a manifest with "
                             "pred_text), comma-separated, beside the parts: DST/__srt/, ..., "
                             "DST/__nemo/manifest.nemo.jsonl")
    rerun = parser.add_mutually_exclusive_group()
    rerun.add_argument("--overwrite", action="store_true",
                       help="remove DST's rows and transcribe everything again")
    rerun.add_argument("--resume", action="store_true",
                       help="keep DST's rows even if another config made them; add the missing ones")
    parser.add_argument("--dry-run", action="store_true",
                        help="run every check a job runs before its workers start (config, model, "
                             "storage, the source's ids, the output's lock and config), say what the job "
                             "would do, and stop: exit 0, or 2 with the reason; nothing is written")
    parser.add_argument("--retry-errors", action="store_true",
                        help="transcribe again the recordings whose row in DST has an error (a mount or "
                             "bucket that was down, a timeout); their old rows are replaced")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--print", dest="print_transcripts", action="store_const", const=True, default=None,
                       help=f"print every transcript (id and text) at the end; by default a job of fewer "
                            f"than {PRINT_UNDER} recordings does")
    shown.add_argument("--quiet", dest="print_transcripts", action="store_const", const=False,
                       help="print no transcripts at the end")
    parser.add_argument("--verbose", action="store_true",
                        help="show Ray's and the workers' output on the console instead of only in the log")
    parser.add_argument("--progress-interval", type=float, default=10.0, metavar="S",
                        help="seconds between progress lines when the console is not a terminal")
    parser.add_argument("--audio-column", default=None,
                        help="table column / manifest key of the audio (default: audio, audio_filepath, file, path)")
    parser.add_argument("--text-column", default=None,
                        help="table column / manifest key of the reference text "
                             "(default: text, sentence, transcription, transcript, normalized_text)")


def overrides_of(args: argparse.Namespace) -> list[str]:
    """``--set`` items, then the flags that stand for keys (they win over a ``--set``)."""
    language = getattr(args, "language", None)
    candidates = None
    if language is not None and "," in language:
        # --language es,fr: detect, among these only
        codes = [c.strip() for c in language.split(",") if c.strip()]
        language, candidates = "auto", "[" + ",".join(codes) + "]"
    flags = {"model.language": language, "model.language_candidates": candidates,
             "model.task": getattr(args, "task", None),
             "model.allow_download": "true" if getattr(args, "allow_download", False) else None}
    return list(args.overrides) + [f"{k}={v}" for k, v in flags.items() if v is not None]


def spec_from_args(args: argparse.Namespace) -> JobSpec:
    """The job the options describe."""
    return JobSpec(input=args.input, output=args.output, config=args.config, overrides=overrides_of(args),
                   model=args.model, runner=args.runner, formats=args.format, overwrite=args.overwrite,
                   resume=args.resume, retry_errors=args.retry_errors, dry_run=args.dry_run,
                   audio_column=args.audio_column, text_column=args.text_column, verbose=args.verbose,
                   progress_interval=args.progress_interval, print_transcripts=args.print_transcripts)


def run(args: argparse.Namespace) -> int:
    return execute(spec_from_args(args))


def execute(spec: JobSpec) -> int:
    """Run ``spec`` (actors.job.run_job) with the command line's console; returns the exit
    status: 0 done, 2 refused (one line), 1 stopped or rows in != rows out, 3 stalled,
    4 every recording failed, 130 interrupted."""
    from ..actors.job import run_job

    console = Console(verbose=spec.verbose, progress_interval=spec.progress_interval)
    try:
        result = run_job(spec, on_progress=console.progress, log=console)
    except JobIncomplete as exc:
        closing(spec.output, exc.summary)
        print(f"shardscribe: error: {exc}", file=sys.stderr)
        return exc.code
    except JobError as exc:
        counted = committed_note(spec.output) if isinstance(exc, JobInterrupted) else ""
        print(("\n" if exc.started else "") + f"shardscribe: {exc.label}: {exc}{counted}", file=sys.stderr,
              flush=True)
        return exc.code
    if spec.dry_run:
        print(f"shardscribe: {result['message']}")
    else:
        if spec.print_transcripts or (spec.print_transcripts is None and result.get("rows_in", 0) < PRINT_UNDER):
            from .console import transcript_lines

            for line in transcript_lines(spec.output):
                print(line)
        closing(spec.output, result)
    return 0


def committed_note(dst: str) -> str:
    """`` (N rows committed)`` for an interrupted job's line: read back from DST after the
    job committed what it had finished and released the folder, so the number is what a
    rerun will find. Empty where DST cannot be read, or a second signal cuts the count
    short: the line is printed either way."""
    from ..actors.job.signals import interrupts
    from .console import committed_rows

    try:
        with interrupts():    # a second Ctrl-C or SIGTERM here skips the count, not the line
            n = committed_rows(dst)
    except (Exception, KeyboardInterrupt):
        return ""
    return f" ({n} row{'' if n == 1 else 's'} committed)"


def closing(dst: str, summary: dict) -> None:
    """The closing table, where each output is, and warnings: rows of other inputs, rows
    an English-only model could not transcribe."""
    from .console import output_lines, summary_table
    from ..pipeline.storage import redact_uri

    for line in summary_table(summary):
        print(line)
    for line in output_lines(dst, summary.get("log"), getattr(summary, "written", None)):
        print(line)
    if summary.get("extra_rows"):
        print(f"shardscribe: warning: {redact_uri(dst)} also holds {summary['extra_rows']} rows whose ids "
              "are not in this input (an earlier job's); they are kept, and left out of the summary",
              file=sys.stderr)
    from .console import mismatch_warning

    if (warning := mismatch_warning(summary)) is not None:
        print(warning, file=sys.stderr)


class Console(JobConsole):
    """The command line's console for a job: its lines on the terminal (stderr), the job
    log in DST (jobs.console.JobLog: Ray's and the workers' output goes there unless
    ``verbose``) around the run, and the progress bar (jobs.console.Progress).
    ``configure_logging``: the process's logging goes to the log too (the command line's
    process is the job's own; a Python caller's is not)."""

    def __init__(self, verbose: bool = False, progress_interval: float = 10.0, configure_logging: bool = True):
        self.verbose = verbose
        self.progress_interval = progress_interval
        self.configure_logging = configure_logging
        self.captures_output = not verbose
        self.url = None
        self._log = None
        self._bar = None

    @property
    def stream(self):
        return self._log.console if self._log is not None else sys.stderr

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    @contextlib.contextmanager
    def session(self, dst: str):
        from ..actors.job.signals import shielded
        from .console import JobLog

        # Opened and closed whole: a signal halfway would leave the console's output in the log.
        with shielded(JobLog(dst, LOG_NAME, verbose=self.verbose)) as log:
            if self.configure_logging:
                logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                                    force=True)
            self._log, self.url = log, log.url
            try:
                yield
            finally:
                self._log = None

    def progress(self, p: JobProgress) -> None:
        from .console import Progress

        if self._bar is None:
            self._bar = Progress(p.total, self.stream, interval_s=self.progress_interval)
        if p.final:
            self._bar.close(p.rows, p.audio_seconds, p.errors)
        else:
            self._bar.update(p.rows, p.audio_seconds, p.errors, p.partial)
