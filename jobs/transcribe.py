"""Transcribe audio into Parquet: `shardscribe transcribe --input SRC --output DST`.

SRC is a folder or glob of audio files, a JSONL manifest or a Parquet table, on any
fsspec filesystem. DST gets one Parquet row per recording; the summary, the success
marker, the lock, the job log and any `--format` files go to DST/__shardscribe__/, a
folder every Parquet reader skips (pipeline.output: the folder's commit protocol). A rerun
into the same DST skips recordings that already have a row; a rerun with another config
is refused unless --overwrite (redo all) or --resume (keep the rows, add the rest);
--retry-errors also redoes the recordings whose rows hold an error; a second job into a
DST that a live job holds is refused.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time

COMMAND = "transcribe"
LOG_NAME = "transcribe.log"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="folder/glob of audio, JSONL manifest or Parquet")
    parser.add_argument("--output", required=True, help="output directory (any fsspec URL)")
    parser.add_argument("--config", default=None, help="conf/<name>.yaml name or path (default: default)")
    parser.add_argument("--model", default=None, metavar="DIR|ID",
                        help="a checkpoint (local directory or cached Hugging Face id): its family is "
                        "read from its config.json; the config's decoder kind runs on it")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set decoder.max_new_tokens=128")
    parser.add_argument("--runner", choices=["ray", "local"], default="ray",
                        help="Ray Data plan (default) or in-process without Ray")
    parser.add_argument("--format", default="", metavar="LIST",
                        help="also write srt,vtt,json,tsv per recording and/or nemo (a manifest with "
                             "pred_text), comma-separated, into DST/__shardscribe__/")
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
    parser.add_argument("--verbose", action="store_true",
                        help="show Ray's and the workers' output on the console instead of only in the log")
    parser.add_argument("--progress-interval", type=float, default=10.0, metavar="S",
                        help="seconds between progress lines when the console is not a terminal")
    parser.add_argument("--audio-column", default=None,
                        help="table column / manifest key of the audio (default: audio, audio_filepath, file, path)")
    parser.add_argument("--text-column", default=None,
                        help="table column / manifest key of the reference text "
                             "(default: text, sentence, transcription, transcript, normalized_text)")


def run(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_config
    from pipeline.formats import FormatError, parse_formats
    from pipeline.models.preflight import ModelError, check_model, check_transducer_search
    from pipeline.output import OutputBusy
    from pipeline.sources import SourceError, open_source, scan
    from pipeline.storage import StorageError

    where = f"input {args.input}"    # what an OSError below is about
    if args.retry_errors and args.overwrite:
        print("shardscribe: error: --retry-errors and --overwrite: --overwrite already transcribes every "
              "recording again", file=sys.stderr)
        return 2
    try:
        formats = parse_formats(args.format)
        cfg = load_config(args.config, args.overrides, model=args.model)
        check_model(cfg.model)
        check_transducer_search(cfg)
        use_storage(cfg, args)
        # The source is scanned for its ids only; its rows are read where they are used.
        source = open_source(args.input, args.audio_column, args.text_column)
        check_apart(source, args.output)
        scanned = scan(source)
        where = f"output {args.output}"
        if args.dry_run:
            return dry_run(args, cfg, scanned)
        lock = hold_output(args.output, cfg)
    except (ConfigError, FormatError, ModelError, SourceError, StorageError, OutputBusy) as exc:
        print(f"shardscribe: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the filesystem behind SRC or DST (permissions, credentials, network)
        from pipeline.storage import redact_uri

        kind, _, url = where.partition(" ")
        print(f"shardscribe: error: {kind} {redact_uri(url)}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        return _run_locked(args, cfg, source, scanned, lock.job_id, formats)
    finally:
        lock.release()


def check_apart(source, dst: str) -> None:
    """A Parquet input and the output folder must not hold one another: the output's parts
    would be read back as input rows by the next run."""
    import posixpath

    from pipeline.sources import SourceError
    from pipeline.storage import redact_uri, url_to_fs

    if source.kind != "table":
        return
    out_fs, out = url_to_fs(dst)
    out = posixpath.normpath(out)

    def within(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    in_fs = url_to_fs(source.files[0])[0]
    if type(in_fs) is not type(out_fs):
        return
    # A folder (or glob) of tables is listed again by every run: no output inside it.
    inside = source.root and within(out, posixpath.normpath(source.root))
    if inside or any(within(posixpath.normpath(url_to_fs(f)[1]), out) for f in source.files):
        raise SourceError(f"input {redact_uri(source.uri)!r} and output {redact_uri(dst)!r} overlap: a Parquet "
                          "input must lie outside the output folder, and a folder of them hold no output folder")


def use_storage(cfg, args) -> None:
    """storage.options for the input and output protocols; a missing backend (s3fs,
    gcsfs) or an unreachable store is one line here, before any worker starts."""
    from pipeline.storage import check_reachable, use_options

    use_options(cfg.storage.options, [args.input, args.output])
    for url in (args.input, args.output):
        check_reachable(url, cfg.storage.options)


def dry_run(args, cfg, scanned) -> int:
    """What the job would do with ``scanned`` (the source's ids) in ``args.output``, from
    reads alone: OutputBusy where a live job holds the folder; 2 where the folder's rows
    were made by another config and neither --overwrite nor --resume says what to do."""
    import pyarrow.compute as pc

    from pipeline.config import config_hash
    from pipeline.output import OutputLock, new_job_id, scan_output
    from pipeline.storage import redact_uri

    OutputLock(args.output, new_job_id(), cfg.storage.options).check_free()
    job_hash = config_hash(cfg)
    found = None if args.overwrite else scan_output(args.output, cfg.storage.options)
    refusal = None if found is None else _other_config(found.config_hashes, job_hash, args)
    if refusal:
        print(f"shardscribe: error: {refusal}", file=sys.stderr)
        return 2
    ids = scanned.ids
    unreadable = 0 if found is None else len(found.unreadable)
    mine = None if found is None else found.rows.filter(pc.is_in(found.rows.column("id"), value_set=ids))
    # recordings, not rows: a folder may hold a recording twice (the job would then end
    # with rows in != rows out, said below)
    done = 0 if mine is None else pc.count_distinct(mine.column("id")).as_py()
    failed = 0 if mine is None else pc.count_distinct(mine.filter(mine.column("error")).column("id")).as_py()
    duplicates = 0 if mine is None else mine.num_rows - done
    redo = failed if args.retry_errors else 0
    print(f"shardscribe: dry run: config {cfg.name} ({job_hash}), model {cfg.model.family} {cfg.model.source}, "
          f"decoder {cfg.decoder.kind}, {args.runner} runner; {len(ids)} recordings in the input, {done} already "
          f"in {redact_uri(args.output)} ({failed} with an error"
          + (", retried" if args.retry_errors else "") + f"); {len(ids) - done + redo} to transcribe"
          + ("; --overwrite would remove the folder's rows first" if args.overwrite else "")
          + (f"; {unreadable} unreadable parts would be quarantined and their rows redone" if unreadable else "")
          + (f"; the folder holds {duplicates} duplicate rows of these recordings: the job would end with rows "
             "in != rows out" if duplicates else "")
          + "; nothing was started or written")
    return 0


def hold_output(dst: str, cfg):
    """Take the output folder's lock (pipeline.output); the job opens the folder once it
    knows it will change it (begin_job)."""
    from pipeline.output import OutputLock, new_job_id

    return OutputLock(dst, new_job_id(), cfg.storage.options).acquire()


def commit(dst: str, cfg, summary: dict) -> bool:
    """The job commit: the summary, then the success marker when rows in == rows out."""
    from pipeline.output import commit_job

    ok = summary["rows_out"] == summary["rows_in"] and not summary["duplicate_rows"]
    commit_job(dst, summary, ok, cfg.storage.options)
    return ok


def _run_locked(args, cfg, source, scanned, job_id: str, formats: list[str]) -> int:
    from pipeline.config import config_hash
    from pipeline.output import begin_job, clear_output, drop_error_rows, quarantine_unreadable, scan_output
    from pipeline.sources import unfinished_ids
    from pipeline.storage import redact_uri

    job_hash = config_hash(cfg)
    found = None
    if args.overwrite:
        clear_output(args.output, cfg.storage.options)
    else:
        # One read of every part serves the config check, --retry-errors and the ids done.
        found = scan_output(args.output, cfg.storage.options)
        refusal = _other_config(found.config_hashes, job_hash, args)
        if refusal:
            print(f"shardscribe: error: {refusal}", file=sys.stderr)
            return 2
    # Only now the folder is about to change: a refused run leaves a finished job's
    # success marker where a scheduler waits for it, and its unreadable parts in place.
    begin_job(args.output, job_id, cfg.storage.options)
    if found is not None:
        quarantine_unreadable(args.output, found, job_id, cfg.storage.options)
    if args.retry_errors:
        kept = drop_error_rows(args.output, found, scanned.ids, job_id, cfg.storage.options)
        print(f"shardscribe: retrying {found.rows.num_rows - kept.rows.num_rows} recordings whose rows in "
              f"{redact_uri(args.output)} had an error", file=sys.stderr)
        found = kept
    ids = scanned.ids.to_pylist()
    done = found.done_ids() if found is not None else None
    todo = unfinished_ids(scanned.ids, done)
    if done:
        print(f"shardscribe: resuming: {len(ids) - len(todo)} of {len(ids)} recordings already in "
              f"{redact_uri(args.output)}", file=sys.stderr)
    rows = source.excluding(done) if done else source
    return _transcribe(args, cfg, ids, todo, rows, scanned.items, job_hash, formats, job_id)


def _other_config(hashes: dict, job_hash: str, args) -> str | None:
    """The refusal message when DST holds rows of another config and neither --resume nor
    --overwrite says what to do with them."""
    other = {h: n for h, n in hashes.items() if h != job_hash}
    if not other or args.resume:
        return None
    made_by = ", ".join(f"{n} by config {h or '(unrecorded)'}" for h, n in other.items())
    from pipeline.storage import redact_uri

    return (f"{redact_uri(args.output)} already holds rows made by another config ({made_by}); this job's config is "
            f"{job_hash}. Pass --overwrite to transcribe everything again, or --resume to keep those rows "
            "and add only the missing recordings")


def _transcribe(args, cfg, ids: list[str], todo: list[str], rows, items, job_hash, formats, job_id: str) -> int:
    """Run the job over ``rows`` (the source less the done ids; ``todo`` are its ids)."""
    from actors.plan import JobStalled
    from jobs.console import JobLog, Progress, output_lines, summary_table
    from pipeline.output import SUMMARY_NAME, summarize
    from pipeline.storage import redact_uri

    with JobLog(args.output, LOG_NAME, verbose=args.verbose) as log:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                            force=True)
        console = log.console
        print(f"shardscribe: transcribing {len(todo)} recordings with config {cfg.name} ({args.runner} runner)"
              + ("" if args.verbose else f"; Ray and worker output: {log.url}"), file=console, flush=True)
        start, started_at = time.perf_counter(), time.time()
        ray_was_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()
        progress = Progress(len(todo), console, interval_s=args.progress_interval) if todo else None
        try:
            if todo:
                _run(args.runner, rows, items, cfg, args.output, progress, job_id)
        except KeyboardInterrupt:
            print(f"\nshardscribe: interrupted: the rows committed so far stay in {redact_uri(args.output)}; "
                  "the same command resumes after them", file=console, flush=True)
            _release_ray(args.runner, ray_was_up)
            return 130
        except JobStalled as exc:
            print(f"\nshardscribe: error: {exc}", file=console, flush=True)
            _release_ray(args.runner, ray_was_up)
            return 3
        except Exception as exc:
            logging.getLogger("shardscribe").exception("the job stopped")
            print(f"\nshardscribe: error: the job stopped: {_last_line(exc)} (details: {log.url})",
                  file=console, flush=True)
            _release_ray(args.runner, ray_was_up)
            return 1
        _release_ray(args.runner, ray_was_up)
        wall = time.perf_counter() - start
        summary = summarize(args.output, ids, {
            "config": cfg.name, "config_hash": job_hash, "runner": args.runner, "run_rows": len(todo),
            "skipped_existing": len(ids) - len(todo), "started_at": started_at, "wall_seconds": wall,
            "log": log.url,
        }, run_ids=set(todo), options=cfg.storage.options)
        commit(args.output, cfg, summary)
        if progress is not None:
            progress.close(summary["run_rows_out"], summary["run_audio_seconds"], summary["run_errors"])
        written = _write_formats(args.output, formats, cfg.storage.options) if formats else []
    for line in summary_table(summary):
        print(line)
    for line in output_lines(args.output, log.url):
        print(line)
    if written:
        print(f"Formats: {', '.join(written)}")
    if summary.get("extra_rows"):
        print(f"shardscribe: warning: {redact_uri(args.output)} also holds {summary['extra_rows']} rows whose ids "
              "are not in this input (an earlier job's); they are kept, and left out of the summary",
              file=sys.stderr)
    if summary["rows_out"] != summary["rows_in"] or summary["duplicate_rows"]:
        print(f"shardscribe: error: rows in {summary['rows_in']} != rows out {summary['rows_out']} "
              f"(duplicates {summary['duplicate_rows']}, missing e.g. {summary['missing_ids'][:5]}; "
              f"see {redact_uri(args.output)}/{SUMMARY_NAME})", file=sys.stderr)
        return 1
    if summary["run_rows_out"] and summary["run_errors"] == summary["run_rows_out"]:
        # Every recording failing is rarely the corpus: a mount or a bucket is unreachable.
        # The rows stand (rows in = rows out), but a scheduler must not read this as done.
        kinds = ", ".join(f"{k} {n}" for k, n in list(summary["errors_by_kind"].items())[:3])
        print(f"shardscribe: error: every one of the {summary['run_rows_out']} recordings this run read failed "
              f"({kinds}); their error rows are in {redact_uri(args.output)}; once the input is reachable, "
              "the same command with --retry-errors transcribes them again", file=sys.stderr)
        return 4
    return 0


def _run(runner: str, rows, items, cfg, dst: str, progress, job_id: str) -> None:
    from actors.progress import block_counts

    totals = [(0, 0.0, 0)]   # rows, audio seconds, errors: one tuple, replaced whole

    def count(out):
        totals[0] = tuple(a + b for a, b in zip(totals[0], block_counts(out)))

    if runner == "local":
        from actors.local_runner import run_local

        def on_batch(out):
            count(out)
            progress.update(*totals[0])

        with _sigterm_as_interrupt():
            run_local(rows, cfg, dst, progress=False, on_batch=on_batch, job_id=job_id, items=items)
        return
    from actors.plan import init_ray, run_ray
    from actors.progress import hide_ray_data_progress

    init_ray(cfg)
    hide_ray_data_progress()
    stop = threading.Event()

    def poll():
        # The console moves while no block arrives too (elapsed time, the log's heartbeat).
        while not stop.wait(0.5):
            progress.update(*totals[0])

    watcher = threading.Thread(target=poll, name="progress", daemon=True)
    watcher.start()
    try:
        # After init_ray: ray.init installs its own SIGTERM handler, which ends the driver
        # where it stands and leaves the local instance's agents running.
        with _sigterm_as_interrupt():
            run_ray(rows, cfg, dst, items=items, on_batch=count, job_id=job_id)
    finally:
        stop.set()
        watcher.join()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """A scheduler's SIGTERM (preemption, a cancelled job) ends the run as Ctrl-C does, so
    the runner commits its finished rows and Ray is shut down, instead of the process
    dying where it stands."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _release_ray(runner: str, was_up: bool) -> None:
    """Disconnect from the Ray instance this job started or joined; a driver that was
    already connected (a caller's session, a test's cluster) stays connected."""
    if runner == "ray" and not was_up:
        from actors.progress import shutdown_ray

        shutdown_ray()


def _write_formats(dst: str, formats: list[str], options: dict) -> list[str]:
    from pipeline.formats import write_formats

    return write_formats(dst, formats, options)


def _last_line(exc: BaseException) -> str:
    """The line of an exception that names the cause: a Ray error carries the worker's
    whole traceback, whose last line is the original exception."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(exc).__name__
    return text[:400]
