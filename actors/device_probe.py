"""The model's preflight run where the model will run: a job submitted from a head node
without a GPU (the usual KubeRay head, ``ray job submit``) to a cluster whose nodes have
GPUs asks one GPU node, in one short task, whether ``model.device`` is usable there and
whether the checkpoint and the decoder kind's options fit (pipeline.models.preflight, the
kind's ``preflight``: config files read, no weights loaded), instead of refusing because
the driver itself has no CUDA.
"""
from __future__ import annotations

from ..pipeline.models.errors import ModelError

# Longest wait for a GPU node to take the check (a busy cluster queues it).
PROBE_TIMEOUT_S = 60.0


def _probe(config: dict, kind, family) -> dict:
    import ray

    from .registrations import adopt
    from ..pipeline.config import config_from_dict
    from ..pipeline.config_values import ConfigError
    from ..pipeline.models.preflight import check_model

    adopt(kind, family)
    node = ray.get_runtime_context().get_node_id()
    try:
        cfg = config_from_dict(config)
        check_model(cfg.model)
        kind.check(cfg)
    except (ModelError, ConfigError) as exc:
        return {"node": node, "error": str(exc)}
    return {"node": node, "error": None}


def check_model_on_cluster(cfg, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """Run the model's and the decoder kind's preflight on a GPU node of the connected
    cluster; returns the node's id. ModelError (one line) where the cluster has no GPU, no
    GPU node takes the task in ``timeout_s``, or the check fails there."""
    import ray

    from ..pipeline.kinds import decoder_kind
    from ..pipeline.models import model_family

    device = cfg.model.device
    gpus = ray.cluster_resources().get("GPU", 0)
    if not gpus:
        raise ModelError(f"model.device={device}: neither this machine nor the Ray cluster has a GPU; "
                         "use model.device=cpu or auto")
    # No CPU asked: the check must not wait behind a busy node's CPU tasks.
    task = ray.remote(num_gpus=1, num_cpus=0, max_retries=0)(_probe)
    ref = task.remote(cfg.to_dict(), decoder_kind(cfg.decoder.kind), model_family(cfg.model.family))
    ready, _ = ray.wait([ref], timeout=timeout_s)
    if not ready:
        ray.cancel(ref, force=True)
        raise ModelError(f"model.device={device}: no GPU node of the cluster ran the model's checks within "
                         f"{timeout_s:g} s ({gpus:g} GPUs, all busy?)")
    result = ray.get(ref)
    if result["error"]:
        raise ModelError(f"{result['error']} (checked on GPU node {result['node'][:12]})")
    return result["node"]
