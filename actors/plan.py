"""The Ray Data plan: read (Ray tasks) -> decode/segment (CPU actors) -> model actor pool -> the
driver, which commits finished rows to Parquet [and feeds a two-stage decoder kind's pending
rows to its second pool in full token-budget batches across blocks: actors.second_pool].

One linear chain (a fork re-runs the model once per branch). Errors are caught per row
inside the stages, never through `max_errored_blocks`, which drops blocks silently.
`num_gpus` is requested only when a GPU exists: on a machine without one, Ray waits for
it forever instead of failing.
"""
from __future__ import annotations

import os
import secrets
import sys
import warnings

from pipeline.batching import in_slow_start
from pipeline.device import resolve_device
from pipeline.decoders import decoder_kind
from pipeline.models import model_family
from pipeline.records import INPUT_SCHEMA, OUTPUT_SCHEMA, table

OUTPUT_NAMES = OUTPUT_SCHEMA.names


def init_ray(cfg) -> None:
    """Join ``ray.address``, or start a local instance that listens on loopback only and
    requires a token (Ray's token authentication, 2.5x+).

    The local instance: Ray derives its node address, and so the address every server
    binds, from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` (off: loopback; on, the Linux
    default: the host's routable address, bound on all interfaces). A fresh random token
    per job lives only in this process's environment, inherited by the Ray processes it
    starts. ``address="local"`` keeps ray.init from joining whatever cluster another user
    of this machine left in /tmp/ray. A job's SIGINT or SIGTERM stops ``ray.init`` where it
    stands (Ray's own SIGTERM handler is kept out); what it started is killed on the way
    out (actors.ray_local)."""
    from actors.ray_local import starting

    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return
    if cfg.ray.address:
        import ray

        from pipeline.storage import options_environment

        # Token and TLS settings come from Ray's own chain (RAY_AUTH_MODE,
        # RAY_AUTH_TOKEN[_PATH], ~/.ray/auth_token), as for any Ray client. The cluster's
        # workers get the job's storage options through the job's runtime environment.
        env = options_environment()
        with starting(local=False):
            ray.init(address=cfg.ray.address, **({"runtime_env": {"env_vars": env}} if env else {}), **_INIT_KWARGS)
        return
    _loopback_environment()
    import ray

    # More logical CPUs than cores (pipeline.config.RayConfig.cpus), so the CPU stage, the
    # model actors and Ray Data's tasks fit together on small machines; the OS shares the
    # real cores.
    two_stage = decoder_kind(cfg.decoder.kind).two_stage
    with starting(local=True):
        ray.init(address="local", num_cpus=cfg.ray.cpus(two_stage).local, **_INIT_KWARGS)


_INIT_KWARGS = {"include_dashboard": False, "log_to_driver": True, "configure_logging": False}


def _loopback_environment() -> None:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    explicit = {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"} & set(os.environ)
    if not explicit:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    if "ray" in sys.modules:
        # Ray read both settings when it was imported: update what it read (ray.init's
        # own token switch does the same Config refresh).
        from ray._private import ray_constants
        from ray._raylet import Config

        ray_constants.ENABLE_RAY_CLUSTER = False
        Config.initialize("")


def _read_source(source, per_block: int, items: list[dict] | None, first_batch: int | None = None):
    """The input rows as a dataset of INPUT blocks, read by Ray tasks: one task per work
    item of pipeline.sources (a few thousand manifest lines, or a Parquet row group),
    streaming its rows in batches, so the driver holds neither rows nor audio bytes. The
    resume's exclusions travel once through the object store, not with every task. A
    listing's first blocks grow from ``first_batch`` rows (pipeline.sources.slow_start_tables)."""
    import dataclasses
    import json

    import ray

    from pipeline.sources import read_item, scan, slow_start_tables

    items = scan(source).items if items is None else items
    if source.kind == "files":
        # A listing holds only ids and paths, already on the driver.
        tables = list(slow_start_tables((t for it in items for t in read_item(source, it, per_block)), per_block,
                                        first_batch or per_block))
        return ray.data.from_arrow(tables or [table([], INPUT_SCHEMA)])
    exclude_ref = [ray.put(source.exclude)] if source.exclude is not None else None
    bare = dataclasses.replace(source, exclude=None)

    def read(batch):
        src = bare if exclude_ref is None else dataclasses.replace(bare, exclude=ray.get(exclude_ref[0]))
        for spec in batch.column("item").to_pylist():
            yield from read_item(src, json.loads(spec), per_block)

    ds = ray.data.from_items([{"item": json.dumps(it)} for it in items], override_num_blocks=len(items))
    return ds.map_batches(read, batch_size=1, batch_format="pyarrow")


def build_dataset(rows, cfg, kind=None, items: list[dict] | None = None):
    """The plan for ``rows``: a list of INPUT dicts, or a pipeline.sources.Source (read by
    Ray tasks; ``items``: its scan's work items, if already made). The decoder kind
    (default: the registry's entry for decoder.kind) and the model family travel to every
    actor, so a kind or family registered only in the driver works in the workers.

    Blocks carry batching.recordings_per_batch rows, shaped by a streaming repartition
    (split and combine neighbouring blocks), never an all-to-all shuffle of the audio.
    Where the rows are known on the driver (a list, a files listing) the first blocks
    are smaller (batching.first_batch, doubling: pipeline.batching.slow_start), so the
    first rows of a job finish within seconds."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    from actors.audio_prep import AudioPrep
    from actors.transcriber import Transcriber

    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = False
    if hasattr(ctx, "execution_no_progress_timeout_s"):
        ctx.execution_no_progress_timeout_s = cfg.ray.no_progress_timeout_s
    per_block = max(1, cfg.batching.recordings_per_batch)
    # Blocks of one batch each, never an all-to-all repartition, which would also switch
    # off Ray Data's no-progress guard (the job's watchdog).
    first = cfg.batching.first_batch
    if isinstance(rows, list):
        from pipeline.sources import input_batches

        ds = ray.data.from_arrow(list(input_batches(rows, per_block, first_batch=first)) or [table([], INPUT_SCHEMA)])
    else:
        ds = _read_source(rows, per_block, items, first)
        if rows.kind != "files":   # a listing is already in blocks of per_block rows
            ds = ds.repartition(target_num_rows_per_block=per_block)
    # Blocks made here hold at most per_block rows: each is one batch as it is. A
    # batch_size would bundle the small first blocks back into whole batches.
    batch = None if isinstance(rows, list) or rows.kind == "files" else per_block
    config = cfg.to_dict()
    kind = kind or decoder_kind(cfg.decoder.kind)
    if kind.name != cfg.decoder.kind:
        raise ValueError(f"decoder kind {kind.name!r} given for a config of decoder.kind={cfg.decoder.kind}")
    args = {"config": config, "kind": kind, "family": model_family(cfg.model.family)}
    ds = ds.map_batches(AudioPrep, fn_constructor_kwargs=args,
                        batch_size=batch, batch_format="pyarrow",
                        compute=ActorPoolStrategy(size=cfg.ray.audio_actors),
                        num_cpus=cfg.ray.audio_actor_cpus)
    gpu = resolve_device(cfg.model.device).startswith("cuda")
    # Both pools of a two-stage plan share one GPU; a whole GPU each would need two.
    extra = {"num_gpus": 0.5 if kind.two_stage else 1.0} if gpu else {}
    ds = ds.map_batches(Transcriber, fn_constructor_kwargs=args,
                        batch_size=batch, batch_format="pyarrow",
                        compute=ActorPoolStrategy(size=cfg.ray.decode_actors),
                        num_cpus=_decode_actor_cpus(cfg, kind), **extra)
    # A two-stage kind's second pool is no stage of this plan: the driver pools the
    # pending rows of every block and feeds that pool's actors (actors.second_pool), whose
    # resources Ray Data must leave alone (none for a one-stage kind: the setting is the
    # process's, and a previous job's must not stay).
    from ray.data import ExecutionResources

    second = cfg.ray.fallback_actors if kind.two_stage else 0
    with warnings.catch_warnings():
        # Deprecated in favour of node labels, which a single node or a user's own
        # cluster does not have; still honoured in 2.60.
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx.execution_options.exclude_resources = ExecutionResources(
            cpu=second * cfg.ray.fallback_actor_cpus, gpu=second * extra["num_gpus"] if gpu else 0.0)
    return ds


def _decode_actor_cpus(cfg, kind) -> float:
    """A model actor's CPUs, fitted to the local instance that is running (it may have been
    started for another config, or by the caller)."""
    import ray

    running = ray.cluster_resources().get("CPU") if cfg.ray.address is None else None
    return cfg.ray.cpus(kind.two_stage, instance_cpus=running).decode_actor


def write_output(ds, cfg, dst: str, job_id: str, on_batch=None, kind=None, on_second_stage=None) -> dict | None:
    """The write side: the driver takes the plan's finished blocks as they come and
    commits them under the output protocol and the local runner's policy
    (pipeline.output.PartCommitter: ``output.rows_per_part`` rows, or
    ``output.commit_interval_s`` since the last commit). A Ray Data sink cannot do this:
    it bundles a write task's rows by count only, so a crash lost up to rows_per_part
    finished rows per writer. The rows already taken are committed however the run ends
    (an interrupt, a failed block, the watchdog); a stalled plan ends in one line naming
    the watchdog's setting. ``on_batch(table)`` sees each block once it is held for a
    commit (the job's progress).

    For a two-stage decoder kind (``kind``, default: decoder.kind's) the blocks hold the
    model pool's rows: those with nothing pending are committed at once, the others go to
    the second pool (actors.second_pool) and are committed once finished, never before;
    rows still pending when the run stops are not committed, so a rerun redoes them. The
    second stage's counts (pipeline.pending_pool.SecondStageStats.as_dict) go to
    ``on_second_stage(stats)`` however the run ends, and are returned (None for a
    one-stage kind)."""
    import threading

    import pyarrow.compute as pc
    from ray.data.exceptions import ExecutionTimeoutError

    from pipeline.output import PartCommitter

    kind = kind or decoder_kind(cfg.decoder.kind)
    parts = PartCommitter(dst, job_id, cfg.output.rows_per_part, cfg.output.commit_interval_s, cfg.storage.options)
    lock = threading.Lock()   # the second pool's thread commits too

    def commit(table):
        with lock:
            parts.add(table)
            if on_batch is not None:
                on_batch(table)
            parts.commit_if_due()

    second = None
    stats = None
    # The job's first batch comes in growing blocks (batching.first_batch): the pending
    # rows of those blocks but the last are finished block by block, as the local runner
    # does, so a job whose first rows all go to the second stage shows them within seconds.
    per_block = max(1, cfg.batching.recordings_per_batch)
    taken = 0
    try:
        if kind.two_stage:
            from actors.second_pool import RaySecondStage

            second = RaySecondStage(cfg, kind, model_family(cfg.model.family), commit,
                                    gpu=resolve_device(cfg.model.device).startswith("cuda"))
        # Each block whole (batch_size=None) and as soon as it is finished: with Ray's
        # default prefetch_batches=1 the iterator yields a block only once the next one has
        # arrived, which holds a finished block back for as long as the next one takes.
        for block in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=0):
            if second is None:
                commit(_output_table(block))
                continue
            if not block.num_rows:
                continue
            taken += block.num_rows
            counts = pc.list_value_length(block.column("pending_index")).fill_null(0)
            waiting = pc.greater(counts, 0)
            done = block.filter(pc.invert(waiting))
            if done.num_rows:
                commit(_output_table(done.select(OUTPUT_NAMES)))
            pending = block.filter(waiting)
            if pending.num_rows:
                second.offer(pending, int(pc.sum(counts).as_py()),
                             start=in_slow_start(taken, cfg.batching.first_batch, per_block))
            # The next block only while the pending rows held stay under the bound.
            second.throttle()
        if second is not None:
            second.drain()
    except ExecutionTimeoutError as exc:
        raise JobStalled(f"no progress for ray.no_progress_timeout_s={cfg.ray.no_progress_timeout_s:g} s; "
                         "parts written so far are kept and a rerun resumes after them") from exc
    finally:
        if second is not None:
            stats = second.close()
            if on_second_stage is not None:
                on_second_stage(stats)
        with lock:
            parts.flush()
    return stats


def _output_table(block):
    """A finished block as a table of exactly OUTPUT_SCHEMA (its metadata included), so
    the blocks of one part concatenate and every part has one schema; raises where a
    column's type differs."""
    import pyarrow as pa

    from pipeline.records import OUTPUT_SCHEMA

    return pa.Table.from_batches(block.to_batches(), schema=OUTPUT_SCHEMA)


class JobStalled(RuntimeError):
    """The plan made no progress within ray.no_progress_timeout_s."""


def run_ray(rows, cfg, dst: str, kind=None, items: list[dict] | None = None, job_id: str | None = None,
            on_batch=None, on_second_stage=None) -> dict | None:
    """The job on Ray; returns a two-stage kind's second-stage counts (write_output)."""
    from pipeline.output import new_job_id

    init_ray(cfg)
    kind = kind or decoder_kind(cfg.decoder.kind)
    return write_output(build_dataset(rows, cfg, kind, items), cfg, dst, job_id or new_job_id(), on_batch=on_batch,
                        kind=kind, on_second_stage=on_second_stage)
