"""The Ray Data plan: read -> decode/segment (CPU actors) -> model actor pool [-> second
pool of a two-stage decoder kind] -> Parquet.

One linear chain (a fork re-runs the model once per branch). Errors are caught per row
inside the stages, never through `max_errored_blocks`, which drops blocks silently.
`num_gpus` is requested only when a GPU exists: on a machine without one, Ray waits for
it forever instead of failing.
"""
from __future__ import annotations

import os

from pipeline.device import resolve_device
from pipeline.decoders import decoder_kind
from pipeline.models import model_family
from pipeline.records import INPUT_SCHEMA, table


def init_ray(cfg) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs = {"include_dashboard": False, "log_to_driver": True, "configure_logging": False}
    if cfg.ray.address:
        ray.init(address=cfg.ray.address, **kwargs)
    else:
        # More logical CPUs than cores, so the CPU stage and the model actors fit together
        # on small machines; the OS shares the real cores.
        num_cpus = cfg.ray.num_cpus or max(4, 2 * (os.cpu_count() or 1))
        ray.init(num_cpus=num_cpus, **kwargs)


def build_dataset(rows: list[dict], cfg, kind=None, tally=None):
    """The plan for ``rows``. The decoder kind (default: the registry's entry for
    decoder.kind) and the model family travel to every actor, so a kind or family
    registered only in the driver works in the workers. A ``tally``
    (actors.progress.RayTally) counts the finished rows for the console."""
    import ray
    from ray.data import ActorPoolStrategy, DataContext

    from actors.audio_prep import AudioPrep
    from actors.finisher import Finisher
    from actors.transcriber import Transcriber

    ctx = DataContext.get_current()
    ctx.execution_options.preserve_order = False
    if hasattr(ctx, "execution_no_progress_timeout_s"):
        ctx.execution_no_progress_timeout_s = cfg.ray.no_progress_timeout_s
    per_block = max(1, cfg.batching.recordings_per_batch)
    ds = ray.data.from_arrow(table(rows, INPUT_SCHEMA))
    ds = ds.repartition(max(1, -(-len(rows) // per_block)))
    config = cfg.to_dict()
    kind = kind or decoder_kind(cfg.decoder.kind)
    if kind.name != cfg.decoder.kind:
        raise ValueError(f"decoder kind {kind.name!r} given for a config of decoder.kind={cfg.decoder.kind}")
    args = {"config": config, "kind": kind, "family": model_family(cfg.model.family)}
    ds = ds.map_batches(AudioPrep, fn_constructor_kwargs=args,
                        batch_size=per_block, batch_format="pyarrow",
                        compute=ActorPoolStrategy(size=cfg.ray.audio_actors),
                        num_cpus=cfg.ray.audio_actor_cpus)
    gpu = resolve_device(cfg.model.device).startswith("cuda")
    # Both pools of a two-stage plan share one GPU; a whole GPU each would need two.
    extra = {"num_gpus": 0.5 if kind.two_stage else 1.0} if gpu else {}
    ds = ds.map_batches(Transcriber, fn_constructor_kwargs=args,
                        batch_size=per_block, batch_format="pyarrow",
                        compute=ActorPoolStrategy(size=cfg.ray.decode_actors),
                        num_cpus=cfg.ray.decode_actor_cpus, **extra)
    # Second pool: only the pending segments are decoded there (SSD's AR fallback, CTC
    # beam search); their state arrives through the object store as bytes in the rows.
    if kind.two_stage:
        ds = ds.map_batches(Finisher, fn_constructor_kwargs=args,
                            batch_size=per_block, batch_format="pyarrow",
                            compute=ActorPoolStrategy(size=cfg.ray.fallback_actors),
                            num_cpus=cfg.ray.fallback_actor_cpus, **extra)
    return tally.attach(ds) if tally is not None else ds


def run_ray(rows: list[dict], cfg, dst: str, kind=None, tally=None) -> None:
    init_ray(cfg)
    build_dataset(rows, cfg, kind, tally=tally).write_parquet(dst)
