"""In-process runner: the same actors and stages as the Ray plan, without Ray.

Serves benchmarks, debugging and machines without Ray (the lent GPU machine). Batches
hold ``batching.recordings_per_batch`` rows, the job's first ones fewer
(``batching.first_batch``, doubling: pipeline.batching.slow_start). Output
parts go through the same commit protocol and policy as the Ray path
(pipeline.output.PartCommitter: ``output.rows_per_part`` rows, or
``output.commit_interval_s`` since the last commit; temporary name then rename).

The audio of the next batches is read, decoded and segmented in a thread while the model
runs on the current one (pipeline.prefetch), in input order, and after the slow start
the model stage joins blocks until their segments fill the token budget
(``batching.max_joined_blocks`` at most; pipeline.regroup):
they are bucketed by length under the budget together, not block by block.

A two-stage decoder kind's pending rows are pooled across batches by the loop both
runners share (actors.stage_loop); rows with nothing pending are committed at once, a
pending row only once finished.
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import time

from .audio_prep import AudioPrep
from .finisher import Finisher
from .stage_loop import StageLoop
from .transcriber import Transcriber
from ..pipeline.kinds import decoder_kind
from ..pipeline.output import PartCommitter, new_job_id
from ..pipeline.prefetch import prefetched
from ..pipeline.regroup import model_batches
from ..pipeline.records import OUTPUT_SCHEMA
from ..pipeline.sources import input_batches
from ..pipeline.storage import url_to_fs

log = logging.getLogger(__name__)

# Prepared batches that may wait ahead of the model stage (pipeline.prefetch): enough to
# hide a batch's reading and decoding behind the model's, few enough to bound memory.
PREFETCH_BATCHES = 2


def build_stages(cfg, kind=None) -> tuple:
    """The job's actors for ``cfg``, in-process: ``(prep, model, second stage or None)``;
    built once, they can serve several :func:`run_local` calls (the benchmarks time runs
    with the model already loaded)."""
    kind = kind or decoder_kind(cfg.decoder.kind)
    if kind.name != cfg.decoder.kind:
        raise ValueError(f"decoder kind {kind.name!r} given for a config of decoder.kind={cfg.decoder.kind}")
    prep = AudioPrep(cfg.to_dict(), kind)
    model = Transcriber(cfg.to_dict(), kind)
    # A second stage shares the first stage's model in-process (no second copy), and its
    # token budget, sized where the model loaded.
    second = Finisher(cfg.to_dict(), kind, first_stage=model.decoder) if kind.two_stage else None
    if second is not None:
        second.cfg.batching.max_tokens = model.cfg.batching.max_tokens
    return prep, model, second


def run_local(rows, cfg, dst: str, rows_per_part: int | None = None, progress: bool = True,
              kind=None, items: list[dict] | None = None, job_id: str | None = None, on_batch=None,
              stages: tuple | None = None, on_second_stage=None, on_progress=None) -> int:
    """Transcribe ``rows`` (a list of manifest row dicts, or a pipeline.sources.Source read
    piece by piece; ``items``: its scan's work items) into Parquet parts under ``dst``;
    returns rows written. ``on_batch(table)`` sees every batch of finished output rows
    (the job's progress bar); ``stages``: :func:`build_stages`' result for ``cfg``;
    ``on_second_stage(stats)`` gets a two-stage kind's second-stage counts
    (pipeline.pending_pool.SecondStageStats.as_dict) once the run ends, however it ends;
    ``on_progress(counts)`` the progress of long recordings' pieces (actors.stage_loop)."""
    prep, model, second = stages or build_stages(cfg, kind)
    fs, path = url_to_fs(dst, cfg.storage.options)
    fs.makedirs(path, exist_ok=True)
    job_id = job_id or new_job_id()
    parts = PartCommitter(dst, job_id, rows_per_part or cfg.output.rows_per_part, cfg.output.commit_interval_s,
                          cfg.storage.options)
    written = 0
    start = time.perf_counter()
    total = f"/{len(rows)}" if isinstance(rows, list) else ""
    sized = getattr(model, "cfg", cfg).batching.max_tokens
    if sized != cfg.batching.max_tokens:
        # sized from the GPU's memory where the model loaded (batching.max_tokens unset)
        cfg = dataclasses.replace(cfg, batching=dataclasses.replace(cfg.batching, max_tokens=sized))
    loop = StageLoop(model, second, cfg, on_progress=on_progress)

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

    batches = input_batches(rows, cfg.batching.recordings_per_batch, items, first_batch=cfg.batching.first_batch)
    # The next batches are read and decoded in a thread while the model runs on this one;
    # the model stage's batches join the blocks held that way (pipeline.regroup).
    prepared = prefetched(((n, t) for b in batches for n, t in prep.tables(b)), PREFETCH_BATCHES, "audio-prep")
    joined = model_batches(prepared, cfg.batching, model.cost, slow_start=True)
    try:
        for _ in loop.steps(joined, emit, cfg.batching.first_batch):
            pass
        loop.finish(emit)
    finally:
        # Finished rows are committed however the loop ends (an interrupt, a preemption's
        # SIGTERM, a failing batch): a rerun resumes after them instead of redoing up to
        # output.rows_per_part recordings. Rows still pooled are not: the rerun redoes them.
        prepared.close()   # the reading thread stops before its next batch
        parts.flush()
        if loop.stats is not None and on_second_stage is not None:
            on_second_stage(loop.stats.as_dict())
    if progress:
        print(file=sys.stderr)
    return written
