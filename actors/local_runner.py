"""In-process runner: the same actors and stages as the Ray plan, without Ray.

Serves benchmarks, debugging and machines without Ray (the lent GPU machine). Batches
hold ``batching.recordings_per_batch`` rows, the job's first ones fewer
(``batching.first_batch``, doubling: pipeline.batching.slow_start). Output
parts go through the same commit protocol and policy as the Ray path
(pipeline.output.PartCommitter: ``output.rows_per_part`` rows, or
``output.commit_interval_s`` since the last commit; temporary name then rename).

A two-stage decoder kind's pending rows wait in a buffer across batches
(pipeline.pending_pool, ``second_stage.*``) until a token-budget batch of them is full, the
input ends, one has waited ``second_stage.max_wait_s`` or the buffer holds
``second_stage.max_pending_segments`` (then it is decoded before the next batch is read),
or, in the slow start's batches but its last, after each of them (trigger ``start``); rows
with nothing pending are committed at once, a pending row only once finished.
"""
from __future__ import annotations

import itertools
import logging
import sys
import time

from actors.audio_prep import AudioPrep
from actors.finisher import Finisher
from actors.transcriber import Transcriber
from pipeline.batching import in_slow_start
from pipeline.decoders import decoder_kind
from pipeline.output import PartCommitter, new_job_id
from pipeline.pending_pool import PendingPool, SecondStageStats
from pipeline.records import OUTPUT_SCHEMA, table
from pipeline.sources import input_batches
from pipeline.storage import url_to_fs

log = logging.getLogger(__name__)


def build_stages(cfg, kind=None) -> tuple:
    """The job's actors for ``cfg``, in-process: ``(prep, model, second stage or None)``;
    built once, they can serve several :func:`run_local` calls (the benchmarks time runs
    with the model already loaded)."""
    kind = kind or decoder_kind(cfg.decoder.kind)
    if kind.name != cfg.decoder.kind:
        raise ValueError(f"decoder kind {kind.name!r} given for a config of decoder.kind={cfg.decoder.kind}")
    prep = AudioPrep(cfg.to_dict(), kind)
    model = Transcriber(cfg.to_dict(), kind)
    # A second stage shares the first stage's model in-process (no second copy).
    second = Finisher(cfg.to_dict(), kind, first_stage=model.decoder) if kind.two_stage else None
    return prep, model, second


def run_local(rows, cfg, dst: str, rows_per_part: int | None = None, progress: bool = True,
              kind=None, items: list[dict] | None = None, job_id: str | None = None, on_batch=None,
              stages: tuple | None = None, on_second_stage=None) -> int:
    """Transcribe ``rows`` (a list of manifest row dicts, or a pipeline.sources.Source read
    piece by piece; ``items``: its scan's work items) into Parquet parts under ``dst``;
    returns rows written. ``on_batch(table)`` sees every batch of finished output rows
    (the job's progress bar); ``stages``: :func:`build_stages`' result for ``cfg``;
    ``on_second_stage(stats)`` gets a two-stage kind's second-stage counts
    (pipeline.pending_pool.SecondStageStats.as_dict) once the run ends, however it ends."""
    prep, model, second = stages or build_stages(cfg, kind)
    fs, path = url_to_fs(dst, cfg.storage.options)
    fs.makedirs(path, exist_ok=True)
    job_id = job_id or new_job_id()
    parts = PartCommitter(dst, job_id, rows_per_part or cfg.output.rows_per_part, cfg.output.commit_interval_s,
                          cfg.storage.options)
    written = 0
    step = cfg.batching.recordings_per_batch
    start = time.perf_counter()
    total = f"/{len(rows)}" if isinstance(rows, list) else ""
    stats = SecondStageStats(cfg.batching.max_tokens) if second is not None else None
    opts = cfg.second_stage
    pool = PendingPool(cfg.batching.max_tokens, opts.max_wait_s, opts.max_pending_segments) \
        if second is not None and opts.pooled else None
    held: dict[int, dict] = {}     # pooled rows by key, their pending states as objects
    keys = itertools.count()
    read = 0

    def emit(out):
        nonlocal written
        assert out.schema == OUTPUT_SCHEMA
        # Held before on_batch: an interrupt in the progress display still commits it.
        parts.add(out)
        written += out.num_rows
        if on_batch is not None:
            on_batch(out)
        parts.commit_if_due()
        if progress:
            rate = written / max(time.perf_counter() - start, 1e-9)
            print(f"\rlocal: {written}{total} recordings ({rate:.2f}/s)", end="", file=sys.stderr)

    def dispatch(batches):
        for b in batches:
            stats.record_waits(b.waits)
            emit(second.finish_rows([held.pop(k) for k in b.keys], stats, b.trigger))

    try:
        for batch in input_batches(rows, step, items, first_batch=cfg.batching.first_batch):
            read += batch.num_rows
            if second is None:
                emit(model(prep(batch)))
                continue
            # The pending segments' states go to the second stage as objects: no table,
            # no packed bytes, between two stages of one process.
            out = model.rows(prep(batch), pending_as_bytes=False)
            if pool is None:
                emit(second.finish_rows(out, stats, "block"))
                continue
            done = [r for r in out if not r.get("pending_index")]
            pending = [r for r in out if r.get("pending_index")]
            for row, costs in zip(pending, second.price_rows(pending)):
                key = next(keys)
                held[key] = row
                pool.add(key, costs)
            if done:
                emit(table(done, OUTPUT_SCHEMA))
            # Full batches; all of it once a row has waited max_wait_s, or once the buffer
            # reaches its bound (the next batch is read only after).
            # The slow start's rows are finished batch by batch too, not held for a full
            # budget: otherwise a job whose first rows all go to the second stage shows
            # none of them until the budget fills or max_wait_s passes.
            dispatch(pool.take(drain=pool.segments >= opts.max_pending_segments,
                               start=in_slow_start(read, cfg.batching.first_batch, step)))
        if pool is not None:
            dispatch(pool.take(final=True))
    finally:
        # Finished rows are committed however the loop ends (an interrupt, a preemption's
        # SIGTERM, a failing batch): a rerun resumes after them instead of redoing up to
        # output.rows_per_part recordings. Rows still pooled are not: the rerun redoes them.
        parts.flush()
        if stats is not None and on_second_stage is not None:
            on_second_stage(stats.as_dict())
    if progress:
        print(file=sys.stderr)
    return written
