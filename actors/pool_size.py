"""How many model actors a job runs, what each asks of Ray, and whether the cluster can
ever give it: from the config and the cluster's resources, before any actor starts.

- ``ray.decode_actors: auto`` is one model actor per GPU of the cluster, growing as GPUs
  join (up to ``ray.max_decode_actors``); on a cluster without GPUs one per node that
  fits an actor; on a local instance one. A number is exactly that many.
- A model actor takes one whole GPU where the cluster has GPUs and the model may use one
  (``model.device`` not ``cpu``, a kind that loads a model); its second stage runs in the
  same actor, on the same GPU.
- On a fixed cluster (``ray.autoscaling: false``) an ask that can never be met fails here
  in one line naming the key, instead of Ray waiting for resources for ever.

Pure: the caller reads ``ray.cluster_resources()`` and ``ray.nodes()``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from ..pipeline.config_sections import AUTO
from ..pipeline.config_values import ConfigError

log = logging.getLogger(__name__)
# Audio actors per model actor where "auto" may choose.
MAX_AUDIO_ACTORS = 4


@dataclass(frozen=True)
class PoolPlan:
    gpus: float          # per model actor
    cpus: float          # per model actor (its threads)
    audio_actors: int    # per model actor, on its node
    audio_cpus: float
    initial: int         # model actors to start now
    grows: bool          # "auto": more as the cluster grows
    maximum: int | None

    @property
    def need_cpus(self) -> float:
        """CPUs a model actor reserves on its node, its audio actors' included."""
        return self.cpus + self.audio_actors * self.audio_cpus

    def target(self, resources: dict, nodes: list[dict], local: bool) -> int:
        """Model actors the cluster holds now (for growth; the initial count where fixed)."""
        if not self.grows:
            return self.initial
        n = _auto_count(self.gpus, self.need_cpus, resources, nodes, local)
        return min(n, self.maximum) if self.maximum else n

    def describe(self) -> str:
        gpu = f"{self.gpus:g} GPU, " if self.gpus else ""
        return (f"{gpu}{self.cpus:g} CPUs and {self.audio_actors} audio actors of {self.audio_cpus:g} CPUs "
                "per model actor")


def _alive(nodes: list[dict]) -> list[dict]:
    return [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]


def _auto_count(gpus: float, need_cpus: float, resources: dict, nodes: list[dict], local: bool) -> int:
    """Model actors the nodes hold: per node one per GPU (one without GPUs) that its CPUs
    fit, ``need_cpus`` each (the actor's and its audio actors')."""
    if local and not gpus:
        return 1
    count = 0
    for r in _alive(nodes):
        slots = int(r.get("GPU", 0) // gpus) if gpus else 1
        count += min(slots, int(r.get("CPU", 0) // need_cpus + 1e-9))
    return count


def _auto_audio(gpus: float, cpus: float, audio_cpus: float, nodes: list[dict]) -> int:
    """Audio actors per model actor: what the CPUs of the leanest node that hosts model
    actors leave per actor, after the model actor's own."""
    hosts = [r for r in _alive(nodes) if r.get("CPU", 0) >= cpus and (not gpus or r.get("GPU", 0) >= gpus)]
    if not hosts:
        return 1
    share = min(r["CPU"] / (int(r.get("GPU", 0) // gpus) if gpus else 1) for r in hosts) - cpus
    return max(1, min(MAX_AUDIO_ACTORS, int(share // audio_cpus)))


def plan_pool(ray_cfg, model_device: str, uses_device: bool, resources: dict, nodes: list[dict],
              local: bool, decode_cpus: float) -> PoolPlan:
    """The pool for ``ray_cfg`` (pipeline.config_sections.RayConfig) on a cluster of
    ``resources`` (its totals) and ``nodes`` (``ray.nodes()``); ``decode_cpus``: a model
    actor's CPUs (RayConfig.cpus). Raises ConfigError for an ask that can never be met."""
    total_gpus = float(resources.get("GPU", 0))
    total_cpus = float(resources.get("CPU", 0))
    gpus = 1.0 if uses_device and model_device != "cpu" and total_gpus > 0 else 0.0
    if model_device.startswith("cuda") and uses_device and not total_gpus and not ray_cfg.autoscaling:
        raise ConfigError(f"model.device={model_device}: the Ray cluster has no GPU (its resources: "
                          f"{total_cpus:g} CPUs); use model.device=auto or cpu, or a cluster with GPUs")
    if ray_cfg.audio_actors != AUTO:
        audio = int(ray_cfg.audio_actors)
    elif local:
        audio = 1
    else:
        audio = _auto_audio(gpus, decode_cpus, ray_cfg.audio_actor_cpus, nodes)
    grows = ray_cfg.decode_actors == AUTO
    if grows:
        initial = _auto_count(gpus, decode_cpus + audio * ray_cfg.audio_actor_cpus, resources, nodes, local)
        if ray_cfg.max_decode_actors:
            initial = min(initial, ray_cfg.max_decode_actors)
    else:
        initial = int(ray_cfg.decode_actors)
    plan = PoolPlan(gpus, decode_cpus, audio, ray_cfg.audio_actor_cpus, initial, grows, ray_cfg.max_decode_actors)
    if ray_cfg.autoscaling:
        # One at least, waiting for the node an autoscaler brings (ray.start_timeout_s).
        return replace(plan, initial=max(1, plan.initial))
    _check_fits(plan, ray_cfg, resources, nodes)
    return plan


def _check_fits(plan: PoolPlan, ray_cfg, resources: dict, nodes: list[dict]) -> None:
    total_gpus = float(resources.get("GPU", 0))
    total_cpus = float(resources.get("CPU", 0))
    alive = _alive(nodes)
    if plan.initial < 1:
        raise ConfigError(f"ray.decode_actor_cpus={plan.cpus:g}: no node of the cluster fits a model actor "
                          f"({plan.describe()}; the largest node has {max((r.get('CPU', 0) for r in alive), default=0):g} "
                          "CPUs)")
    if plan.grows and plan.gpus and plan.initial < total_gpus // plan.gpus:
        log.warning("%d model actors for %g GPUs: the GPU nodes' CPUs fit no more (%s)", plan.initial, total_gpus,
                    plan.describe())
    if plan.gpus and plan.initial * plan.gpus > total_gpus:
        raise ConfigError(f"ray.decode_actors={ray_cfg.decode_actors}: the cluster has {total_gpus:g} GPUs and each "
                          f"model actor takes {plan.gpus:g}; set ray.decode_actors=auto (one per GPU) or at most "
                          f"{int(total_gpus // plan.gpus)} (ray.autoscaling=true where nodes join on demand)")
    if plan.gpus and not any(r.get("GPU", 0) >= plan.gpus and r.get("CPU", 0) >= plan.cpus for r in alive):
        raise ConfigError(f"ray.decode_actor_cpus={plan.cpus:g}: no GPU node of the cluster has that many CPUs")
    if not any(r.get("CPU", 0) >= plan.cpus for r in alive):
        raise ConfigError(f"ray.decode_actor_cpus={plan.cpus:g}: no node of the cluster has that many CPUs")
    need = plan.initial * (plan.cpus + plan.audio_actors * plan.audio_cpus)
    if need > total_cpus + 1e-9:
        key = "ray.decode_actors" if not plan.grows else "ray.audio_actors"
        raise ConfigError(f"{key}={getattr(ray_cfg, key.split('.')[1])}: {plan.initial} model actors need "
                          f"{need:g} CPUs ({plan.describe()}) and the cluster has {total_cpus:g}")
