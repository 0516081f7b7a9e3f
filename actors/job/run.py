"""``run_job``: a whole transcription job, from Python.

Preflight (the config, the model, the decoder kind's own checks, the storage, the
source's ids), the output folder's lock, resume (the rows already there, another
config's rows, --retry-errors, quarantine of unreadable parts), the run on Ray (actors.plan)
or in process, the summary and the commit (pipeline.output's protocol), the format
files. Every refusal is a JobError raised before a worker starts; nothing here prints.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time

from .signals import deferred, describe, interrupts
from .spec import (RUNNERS, JobConsole, JobError, JobFailed, JobIncomplete, JobInterrupted, JobProgress,
                   JobSpec, JobSummary, console_of)


def run_job(spec: JobSpec, on_progress=None, log=None) -> dict:
    """Run the job ``spec``; returns its JobSummary (the summary.json mapping), or with
    ``spec.dry_run`` what the job would do (``dry_run_report``), writing nothing.

    ``on_progress(JobProgress)``: the running totals while the workers run (as each batch
    of rows finishes, and every half second between), then once the final counts. ``log``: a
    JobConsole (spec.JobConsole) or a callable taking each status line.

    Raises JobError (the one-line reason) when the job is refused, before any worker
    starts; JobInterrupted, JobFailed or JobIncomplete when a started job did not finish
    (spec.JobError's kinds). SIGINT and SIGTERM, from the first line to the last, end it
    as JobInterrupted (actors.job.signals), with its lock released and Ray shut down."""
    with interrupts():
        try:
            return _run_job(spec, on_progress, log)
        except KeyboardInterrupt as exc:
            if isinstance(exc, JobInterrupted):
                raise
            from ...pipeline.storage import redact_uri

            raise JobInterrupted(f"{describe(exc)}: the job stopped before it finished; the same command runs it "
                                 f"again, after the rows already in {redact_uri(spec.output)}") from exc


def _run_job(spec: JobSpec, on_progress, log) -> dict:
    from ...pipeline.config import ConfigError, load_config
    from ...pipeline.kinds import decoder_kind
    from ...pipeline.formats import FormatError, parse_formats
    from ...pipeline.models.errors import ModelError
    from ...pipeline.models.preflight import check_model
    from ...pipeline.output import OutputBusy
    from ...pipeline.sources import SourceError, open_source, scan
    from ...pipeline.storage import StorageError

    console = console_of(log)
    _check_spec(spec)
    where = f"input {spec.input}"    # what an OSError below is about
    try:
        formats = parse_formats(spec.format_list)
        cfg = load_config(spec.config, list(spec.overrides), model=spec.model)
        kind = decoder_kind(cfg.decoder.kind)
        kind.prepare(cfg, spec.output)    # its settings that depend on the output folder
        # The model and the kind's checks, where a model will run: here, or on a GPU node.
        checked_on = _model_checks_on_cluster(spec, cfg)
        if checked_on is None:
            check_model(cfg.model)
            kind.check(cfg)
        _check_pool_on_cluster(spec, cfg)
        use_storage(cfg, spec)
        # The source is scanned for its ids only; its rows are read where they are used.
        source = open_source(spec.input, spec.audio_column, spec.text_column)
        check_apart(source, spec.output)
        # On Ray, work items small enough to spread a manifest over many model actors (the
        # runner joins neighbouring items into units: actors.plan).
        scanned = scan(source, **({"rows_per_item": RAY_ITEM_ROWS} if spec.runner == "ray" else {}))
        where = f"output {spec.output}"
        if spec.dry_run:
            try:
                return dry_run_report(spec, cfg, scanned, checked_on)
            finally:
                scanned.close()
        lock = hold_output(spec.output, cfg)
    except (ConfigError, FormatError, ModelError, SourceError, StorageError, OutputBusy) as exc:
        if "scanned" in locals():
            scanned.close()
        raise JobError(str(exc)) from exc
    except OSError as exc:  # the filesystem behind SRC or DST (permissions, credentials, network)
        from ...pipeline.storage import redact_uri

        side, _, url = where.partition(" ")
        raise JobError(f"{side} {redact_uri(url)}: {type(exc).__name__}: {exc}") from exc
    try:
        return _run_locked(spec, cfg, source, scanned, lock.job_id, formats, on_progress, console)
    finally:
        with deferred():    # the lock released whole, whatever signal comes
            try:
                scanned.close()
            finally:
                lock.release()


def _check_spec(spec: JobSpec) -> None:
    """What the command line's parser refuses, for a spec made in Python."""
    if spec.runner not in RUNNERS:
        raise JobError(f"runner {spec.runner!r}: expected one of {', '.join(RUNNERS)}")
    if spec.overwrite and spec.resume:
        raise JobError("--overwrite and --resume: --overwrite removes the rows that --resume would keep")
    if spec.retry_errors and spec.overwrite:
        raise JobError("--retry-errors and --overwrite: --overwrite already transcribes every recording again")


def check_apart(source, dst: str) -> None:
    """A Parquet input and the output folder must not hold one another: the output's parts
    would be read back as input rows by the next run."""
    import posixpath

    from ...pipeline.sources import SourceError
    from ...pipeline.storage import redact_uri, url_to_fs

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


def use_storage(cfg, spec: JobSpec) -> None:
    """storage.options for the input and output protocols; a missing backend (s3fs,
    gcsfs) or an unreachable store is one line here, before any worker starts."""
    from ...pipeline.storage import check_reachable, use_options

    use_options(cfg.storage.options, [spec.input, spec.output])
    for url in (spec.input, spec.output):
        check_reachable(url, cfg.storage.options)


@contextlib.contextmanager
def _connected(cfg):
    """Connected to the cluster of ``cfg.ray.address`` for a check, and disconnected after
    unless a caller had connected."""
    import ray

    from ..plan import init_ray

    was_up = ray.is_initialized()
    init_ray(cfg)
    try:
        yield ray
    finally:
        if not was_up:
            ray.shutdown()


# Rows per work item of a manifest on Ray: the grain the runner's units are made of
# (fine enough to spread a small job over the actors; a 10M-row manifest's items are
# about 39k small dicts on the driver).
RAY_ITEM_ROWS = 256


def _check_pool_on_cluster(spec: JobSpec, cfg) -> None:
    """The model pool's asks against the cluster's resources (actors.pool_size), before
    the output folder is touched: an ask a fixed cluster can never meet is a ConfigError
    naming the key. A local instance's numbers were checked with the config."""
    if spec.runner != "ray" or not cfg.ray.address:
        return
    from ..plan import pool_plan

    with _connected(cfg):
        pool_plan(cfg)


def _model_checks_on_cluster(spec: JobSpec, cfg) -> str | None:
    """Where the model runs on Ray nodes and this driver has no CUDA (a head without a
    GPU, ``ray job submit``), ``model.device=cuda`` is checked where a model will run: the
    model's preflight and the decoder kind's run in one short task on a GPU node
    (actors.device_probe); returns that node's id. None where the driver's own checks hold
    (the in-process runner, a local instance, a driver with CUDA, any other device)."""
    if spec.runner != "ray" or not cfg.model.device.startswith("cuda") or not cfg.ray.address:
        return None
    import torch

    if torch.cuda.is_available():
        return None
    from ..device_probe import check_model_on_cluster

    with _connected(cfg):
        return check_model_on_cluster(cfg)


def dry_run_report(spec: JobSpec, cfg, scanned, device_node: str | None = None) -> dict:
    """What the job would do with ``scanned`` (the source's ids) in ``spec.output``, from
    reads alone: OutputBusy where a live job holds the folder; JobError where the folder's
    rows were made by another config and neither overwrite nor resume says what to do.
    ``message`` says it in one line."""
    from ...pipeline.config import config_hash
    from ...pipeline.output import OutputLock, new_job_id, scan_output
    from ...pipeline.resume import plan_resume
    from ...pipeline.storage import redact_uri

    OutputLock(spec.output, new_job_id(), cfg.storage.options).check_free()
    job_hash = config_hash(cfg)
    found = None if spec.overwrite else scan_output(spec.output, cfg.storage.options)
    try:
        refusal = None if found is None else _other_config(found.config_hashes, job_hash, spec, cfg)
        if refusal:
            raise JobError(refusal)
        plan = plan_resume(scanned, found)
        unreadable = 0 if found is None else len(found.unreadable)
    finally:
        if found is not None:
            found.close()
    refusal = _conflict_refusal(plan, spec)
    if refusal:
        raise JobError(refusal)
    total, done, failed, duplicates = scanned.rows, plan.done, plan.failed, plan.duplicates
    redo = failed if spec.retry_errors else 0
    message = (f"dry run: config {cfg.name} ({job_hash}), model {cfg.model.family} {cfg.model.source}, "
               f"decoder {cfg.decoder.kind}, {spec.runner} runner; {total} recordings in the input, {done} already "
               f"in {redact_uri(spec.output)} ({failed} with an error"
               + (", retried" if spec.retry_errors else "") + f"); {total - done + redo} to transcribe"
               + (f", {plan.conflicts} of them under distinct ids (their ids are in the folder from another source)"
                  if plan.conflicts else "")
               + ("; --overwrite would remove the folder's rows first" if spec.overwrite else "")
               + (f"; {unreadable} unreadable parts would be quarantined and their rows redone" if unreadable else "")
               + (f"; the folder holds {duplicates} duplicate rows of these recordings: the job would end with rows "
                  "in != rows out" if duplicates else "")
               + (f"; model.device={cfg.model.device} checked on GPU node {device_node[:12]}" if device_node else "")
               + "; nothing was started or written")
    return {"dry_run": True, "config": cfg.name, "config_hash": job_hash, "model_family": cfg.model.family,
            "model_source": cfg.model.source, "decoder": cfg.decoder.kind, "runner": spec.runner,
            "recordings": total, "done": done, "failed": failed, "to_transcribe": total - done + redo,
            "conflicts": plan.conflicts, "unreadable_parts": unreadable, "duplicate_rows": duplicates,
            "message": message}


def _conflict_refusal(plan, spec: JobSpec) -> str | None:
    """The one-line refusal when input rows' ids are in DST from another source, and
    neither --resume nor --overwrite says what to do."""
    if not plan.conflicts or spec.resume or spec.overwrite:
        return None
    from ...pipeline.storage import redact_uri

    return (f"{redact_uri(spec.output)} already holds {plan.conflicts} of this input's ids from another source "
            f"(e.g. {plan.example}); pass --resume to keep those rows and add these recordings under distinct ids "
            "(<id>~<hash of the source>), or --overwrite to replace the folder's rows")


def hold_output(dst: str, cfg):
    """Take the output folder's lock (pipeline.output); the job opens the folder once it
    knows it will change it (begin_job)."""
    from ..ray_local import reap
    from ...pipeline.output import OutputLock, new_job_id

    lock = OutputLock(dst, new_job_id(), cfg.storage.options).acquire()
    try:
        # What a driver killed on this machine left running: its local Ray's agents and workers.
        reap()
    except BaseException:   # a signal: the caller never gets the lock to release
        with deferred():
            lock.release()
        raise
    return lock


def commit(dst: str, cfg, summary: dict) -> bool:
    """The job commit: the summary, then the success marker when rows in == rows out."""
    from ...pipeline.config_record import record_config
    from ...pipeline.output import commit_job

    ok = summary["rows_out"] == summary["rows_in"] and not summary["duplicate_rows"]
    # The config beside its rows: a later job with another config is refused naming the keys.
    record_config(dst, cfg, summary["config_hash"], cfg.storage.options)
    commit_job(dst, summary, ok, cfg.storage.options)
    return ok


def _run_locked(spec: JobSpec, cfg, source, scanned, job_id: str, formats: list[str], on_progress,
                console: JobConsole) -> dict:
    from ...pipeline.config import config_hash
    from ...pipeline.formats import export_dirs
    from ...pipeline.output import begin_job, clear_output, drop_rows, quarantine_unreadable, scan_output
    from ...pipeline.resume import plan_resume
    from ...pipeline.sources import skipped_line
    from ...pipeline.storage import redact_uri

    job_hash = config_hash(cfg)
    found = None
    if spec.overwrite:
        clear_output(spec.output, cfg.storage.options, exports=export_dirs())
    else:
        # One read of every part serves the config check, --retry-errors and the rows done.
        found = scan_output(spec.output, cfg.storage.options)
    try:
        refusal = None if found is None else _other_config(found.config_hashes, job_hash, spec, cfg)
        if refusal:
            raise JobError(refusal)
        # Each input row against the folder's rows by id and source, a bucket at a time.
        plan = plan_resume(scanned, found, retry_errors=spec.retry_errors)
        refusal = _conflict_refusal(plan, spec)
        if refusal:
            raise JobError(refusal)
        # Only now the folder is about to change: a refused run leaves a finished job's
        # success marker where a scheduler waits for it, and its unreadable parts in place.
        begin_job(spec.output, job_id, cfg.storage.options)
        if found is not None:
            quarantine_unreadable(spec.output, found, job_id, cfg.storage.options)
        if spec.retry_errors:
            console.say(f"shardscribe: retrying {plan.failed} recordings whose rows in {redact_uri(spec.output)} "
                        "had an error")
            if plan.retry.num_rows and drop_rows(spec.output, found, plan.retry, job_id, cfg.storage.options):
                # a part that no longer read was quarantined: its rows are redone
                found.close()
                found = scan_output(spec.output, cfg.storage.options)
                plan = plan_resume(scanned, found)
    finally:
        if found is not None:
            found.close()
    if plan.done:
        console.say(f"shardscribe: resuming: {plan.done} of {scanned.rows} recordings already in "
                    f"{redact_uri(spec.output)}")
    if plan.conflicts:
        console.say(f"shardscribe: adding {plan.conflicts} recordings whose ids {redact_uri(spec.output)} holds "
                    "from another source under distinct ids (<id>~<hash of the source>)")
    if skipped_line(source):
        console.say(skipped_line(source))
    items = plan.work_items(scanned.items)
    return _transcribe(spec, cfg, scanned, plan, source, items, job_hash, formats, job_id, on_progress, console)


def _other_config(hashes: dict, job_hash: str, spec: JobSpec, cfg) -> str | None:
    """The refusal message when DST holds rows of another config and neither --resume nor
    --overwrite says what to do with them."""
    other = {h: n for h, n in hashes.items() if h != job_hash}
    if not other or spec.resume:
        return None
    from ...pipeline.config import config_differences, hashed_config
    from ...pipeline.config_record import recorded_config
    from ...pipeline.storage import redact_uri

    mine = hashed_config(cfg)
    made_by = []
    for h, n in other.items():
        record = recorded_config(spec.output, h, cfg.storage.options) if h else None
        if record is None:
            made_by.append(f"{n} rows by config {h or '(unrecorded)'}")
            continue
        diff = config_differences(record["keys"], mine)
        shown = "; ".join(f"{k} {_shown(a)} -> {_shown(b)}" for k, a, b in diff[:4])
        more = f"; and {len(diff) - 4} more keys" if len(diff) > 4 else ""
        made_by.append(f"{n} rows by config {record.get('config')} ({h}), whose keys differ (theirs -> this "
                       f"job's): {shown}{more}")
    return (f"{redact_uri(spec.output)} already holds rows made by another config: {', '.join(made_by)}; this "
            f"job's config is {cfg.name} ({job_hash}). Pass --overwrite to transcribe everything again, or "
            "--resume to keep those rows and add only the missing recordings")


def _shown(value) -> str:
    text = "null" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _transcribe(spec: JobSpec, cfg, scanned, plan, rows, items, job_hash, formats, job_id: str,
                on_progress, console: JobConsole) -> dict:
    """Run the job over the work ``items`` of the source ``rows`` (each carrying its
    share of the resume ``plan``: pipeline.resume), summarize and commit."""
    from ..plan import JobStalled
    from ...pipeline.kinds import decoder_kind
    from ...pipeline.kinds.registry import untranscribed_stages
    from ...pipeline.output import SUMMARY_NAME, LockLost, summarize
    from ...pipeline.storage import redact_uri

    dst = redact_uri(spec.output)
    todo = plan.todo
    kind = decoder_kind(cfg.decoder.kind)

    def report(rows_done: int, audio_s: float, errors: int, partial: float = 0.0, final: bool = False) -> None:
        if on_progress is not None:
            on_progress(JobProgress(todo, rows_done, audio_s, errors, final, max(partial, 0.0)))

    with console.session(spec.output):
        console.say(f"shardscribe: {kind.verb} {todo} recordings with config {cfg.name} ({spec.runner} runner)"
                    + (f"; Ray and worker output: {console.url}" if console.captures_output else ""))
        start, started_at = time.perf_counter(), time.time()
        ray_was_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()
        second_stage: dict = {}   # a two-stage decoder kind's second-stage counts
        cluster: dict = {}        # the Ray runner's placements and driver traffic
        try:
            if todo:
                report(0, 0.0, 0)
                _dispatch(spec.runner, rows, items, cfg, spec.output, report, job_id, second_stage.update,
                          cluster.update)
        except KeyboardInterrupt as exc:
            _release_ray(spec.runner, ray_was_up)
            raise JobInterrupted(f"{describe(exc)}: the rows committed so far stay in {dst}; the same command "
                                 "resumes after them") from exc
        except JobStalled as exc:
            _release_ray(spec.runner, ray_was_up)
            raise JobFailed(str(exc), code=3) from exc
        except LockLost as exc:
            # Another job took the folder over (this one was paused past the lock's
            # staleness): it commits nothing more, and says so in one line.
            _release_ray(spec.runner, ray_was_up)
            raise JobFailed(str(exc), code=2) from exc
        except Exception as exc:
            logging.getLogger("shardscribe").exception("the job stopped")
            _release_ray(spec.runner, ray_was_up)
            details = f" (details: {console.url})" if console.url else ""
            raise JobFailed(f"the job stopped: {_last_line(exc)}{details}") from exc
        _release_ray(spec.runner, ray_was_up)
        wall = time.perf_counter() - start
        summary = JobSummary(summarize(spec.output, plan.wanted(scanned), {
            "config": cfg.name, "config_hash": job_hash, "runner": spec.runner, "run_rows": todo,
            "skipped_existing": scanned.rows - todo, "skipped_by_type": rows.skipped_files,
            "started_at": started_at, "wall_seconds": wall,
            "log": console.url, **({"second_stage": second_stage} if second_stage else {}),
            **({"cluster": cluster} if cluster else {}), **kind.summary(cfg, spec.output, started_at, todo),
        }, options=cfg.storage.options, untranscribed=untranscribed_stages()))
        try:
            # The formats first, then the summary and _SUCCESS: a consumer waiting for
            # _SUCCESS never reads a partial set of subtitle files.
            summary.written = _write_formats(spec.output, formats, cfg.storage.options) if formats else []
            commit(spec.output, cfg, summary)
        except LockLost as exc:
            raise JobFailed(str(exc), code=2) from exc
        except KeyboardInterrupt as exc:
            raise JobInterrupted(f"{describe(exc)} while writing the formats or the summary: every row is committed "
                                 f"in {dst}, _SUCCESS is not; the same command writes them") from exc
        if todo:
            report(summary["run_rows_out"], summary["run_audio_seconds"], summary["run_errors"], final=True)
    if summary["rows_out"] != summary["rows_in"] or summary["duplicate_rows"]:
        raise JobIncomplete(f"rows in {summary['rows_in']} != rows out {summary['rows_out']} "
                            f"(duplicates {summary['duplicate_rows']}, missing e.g. {summary['missing_ids'][:5]}; "
                            f"see {dst}/{SUMMARY_NAME})", 1, summary)
    if summary["run_rows_out"] and summary["run_errors"] == summary["run_rows_out"]:
        # Every recording failing is rarely the corpus: a mount or a bucket is unreachable.
        # The rows stand (rows in = rows out), but a scheduler must not read this as done.
        kinds = ", ".join(f"{k} {n}" for k, n in list(summary["errors_by_kind"].items())[:3])
        raise JobIncomplete(f"every one of the {summary['run_rows_out']} recordings this run read failed ({kinds}); "
                            f"their error rows are in {dst}; once the input is reachable, the same command "
                            "with --retry-errors transcribes them again", 4, summary)
    return summary


def _dispatch(runner: str, rows, items, cfg, dst: str, report, job_id: str, on_second_stage=None,
              on_cluster=None) -> None:
    """The workers: the in-process runner or the Ray runner; ``report(rows, audio_s,
    errors, partial)`` gets the running totals as rows (and pieces of long ones) finish, and every half second between (the
    console's elapsed time, the log's heartbeat, while a batch runs or no event arrives)."""
    from ..progress import block_counts

    totals = [(0, 0.0, 0, 0.0)]   # rows, audio seconds, errors, partial recordings: one tuple, replaced whole
    # The runner's thread and the heartbeat both report: one at a time, so the console's
    # bar is never drawn by two.
    lock = threading.Lock()

    def add(*counts):
        with lock:
            totals[0] = tuple(a + b for a, b in zip(totals[0], counts))
            report(*totals[0])

    def poll():
        while not stop.wait(0.5):
            with lock:
                report(*totals[0])

    if runner == "ray":
        from ..plan import init_ray

        init_ray(cfg)
    stop = threading.Event()
    watcher = threading.Thread(target=poll, name="progress", daemon=True)
    watcher.start()
    try:
        if runner == "local":
            from ..local_runner import run_local

            run_local(rows, cfg, dst, progress=False, on_batch=lambda out: add(*block_counts(out)), job_id=job_id,
                      items=items, on_second_stage=on_second_stage, on_progress=lambda counts: add(*counts))
        else:
            from ..plan import run_ray

            run_ray(rows, cfg, dst, items=items, on_counts=add, job_id=job_id, on_second_stage=on_second_stage,
                    on_cluster=on_cluster)
    finally:
        stop.set()
        watcher.join()


def _release_ray(runner: str, was_up: bool) -> None:
    """Disconnect from the Ray instance this job started or joined, and stop what the
    instance it started runs, agents and workers included (actors.ray_local); a driver
    that was already connected (a caller's session, a test's cluster) stays connected."""
    if runner == "ray" and not was_up:
        from ..ray_local import stop

        stop()


def _write_formats(dst: str, formats: list[str], options: dict) -> list[str]:
    from ...pipeline.formats import write_formats

    return write_formats(dst, formats, options)


def _last_line(exc: BaseException) -> str:
    """The line of an exception that names the cause: a Ray error carries the worker's
    whole traceback, whose last line is the original exception."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(exc).__name__
    return text[:400]
