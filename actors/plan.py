"""The Ray runner: the driver hands work units to model actors and commits the parts they
write; no row, audio or pending state passes through it.

- **Units.** The input is cut into work units of at most ``ray.rows_per_unit`` rows,
  fewer where a job is small (about four per actor): a listing's or a list's rows, whose
  ids and paths the driver already holds, or neighbouring work items of the source
  (pipeline.sources: manifest lines or Parquet row groups, read by the actor that takes
  them).
- **Model actors** (actors.model_worker, sized by actors.pool_size): one per GPU by
  default, more as GPUs join the cluster; each prepares its units' audio with audio
  actors on its own node, runs the model and a two-stage kind's second stage itself, and
  writes finished rows as parts under temporary names (pipeline.output.handoff).
- **The driver** receives small events (progress counts, the parts written with their
  ids) and commits each part under the output lock's fence: a rename. Its cost is per
  event, not per row. A unit is done once every row of it is in a committed part.
- **Faults.** A model actor that dies (its process, its node) is restarted by Ray; the
  driver gives each unit it held and had not wholly committed to the next free actor,
  less the ids already committed, so each row is committed once. Temporary parts the dead
  actor wrote and never reported are removed at the end. An interrupt asks every actor to
  write what it holds, commits it, and stops.
- **Bounds.** No model actor started within ``ray.start_timeout_s``, or a busy actor
  silent for ``ray.no_progress_timeout_s``, ends the job in one line (JobStalled).
"""
from __future__ import annotations

import collections
import logging
import os
import secrets
import sys
import time
from dataclasses import dataclass, field

from ..pipeline.kinds import decoder_kind
from ..pipeline.models import model_family
from ..pipeline.pending_pool import SecondStageStats

log = logging.getLogger(__name__)
# How often the driver looks for GPUs and nodes that joined the cluster.
GROW_S = 2.0
# How long an interrupted job waits for its actors to write what they hold.
FLUSH_ON_STOP_S = 20.0
POLL_S = 0.5
# How often a lost actor is asked whether Ray has restarted it.
RETRY_S = 2.0


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
    from .ray_local import starting

    if "ray" in sys.modules and sys.modules["ray"].is_initialized():
        return
    if cfg.ray.address:
        import ray

        from ..pipeline.storage import options_environment

        # Token and TLS settings come from Ray's own chain (RAY_AUTH_MODE,
        # RAY_AUTH_TOKEN[_PATH], ~/.ray/auth_token), as for any Ray client. The cluster's
        # workers get the job's storage options through the job's runtime environment.
        env = options_environment()
        with starting(local=False):
            ray.init(address=cfg.ray.address, **({"runtime_env": {"env_vars": env}} if env else {}), **_INIT_KWARGS)
        return
    _loopback_environment()
    import ray

    # More logical CPUs than cores (pipeline.config_sections.RayConfig.cpus), so the audio
    # and model actors fit together on small machines; the OS shares the real cores.
    with starting(local=True):
        ray.init(address="local", num_cpus=cfg.ray.cpus().local, **_INIT_KWARGS)


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


def _single_node(cfg) -> bool:
    """A local instance (or one node joined as such): sized like one machine."""
    import ray

    return cfg.ray.address is None and sum(1 for n in ray.nodes() if n.get("Alive")) <= 1


class JobStalled(RuntimeError):
    """No model actor started, or a busy one stopped reporting, within the job's bounds."""


def pool_plan(cfg, kind=None):
    """The model pool for ``cfg`` on the cluster Ray is connected to (actors.pool_size);
    raises ConfigError for an ask the cluster can never meet."""
    import ray

    from .pool_size import plan_pool

    kind = kind or decoder_kind(cfg.decoder.kind)
    resources = ray.cluster_resources()
    local = _single_node(cfg)
    decode_cpus = cfg.ray.cpus(instance_cpus=resources.get("CPU") if local else None).decode_actor
    return plan_pool(cfg.ray, cfg.model.device, kind.uses_device, resources, ray.nodes(), local, decode_cpus)


def unit_rows(total: int, per_unit: int, actors: int) -> int:
    """Rows per unit for an input of ``total`` rows known on the driver: ``per_unit``, or
    fewer so that each of ``actors`` model actors gets about four units (a small job
    spreads over the whole pool, and the last units even out the actors' ends)."""
    return max(1, min(per_unit, -(-total // (4 * max(1, actors)))))


def _units(rows, per_unit: int, items: list[dict] | None, actors: int):
    """The job's work units, lazily: ``{"rows": INPUT table}`` or ``{"items": [work items]}``."""
    from ..pipeline.records import INPUT_SCHEMA, table
    from ..pipeline.sources import read_item, scan

    if isinstance(rows, list):
        per_unit = unit_rows(len(rows), per_unit, actors)
        for i in range(0, len(rows), per_unit):
            yield {"rows": table(rows[i:i + per_unit], INPUT_SCHEMA)}
        return
    items = scan(rows).items if items is None else items
    per_unit = unit_rows(sum(it.get("rows", 0) for it in items), per_unit, actors)
    if rows.kind == "files":
        # A listing holds only ids and paths, already on the driver.
        for it in items:
            for t in read_item(rows, it, per_unit):
                yield {"rows": t}
        return
    # Neighbouring work items, read by the actor that takes them.
    unit, held = [], 0
    for it in items:
        unit.append(it)
        held += it.get("rows", 0)
        if held >= per_unit:
            yield {"items": unit}
            unit, held = [], 0
    if unit:
        yield {"items": unit}


@dataclass
class _Unit:
    payload: dict
    committed: set = field(default_factory=set)
    expected: int | None = None      # rows in all, once an attempt has finished reading it
    skipped: int = 0                 # rows committed before the current attempt


@dataclass
class _Slot:
    actor: object
    ready: object = None             # the where() call of a starting (or restarting) actor
    where: dict | None = None
    gen: object = None               # the running unit's event stream
    unit: int | None = None
    since: float = 0.0               # the last event of the running unit (or its dispatch)
    held: set = field(default_factory=set)   # units it ran and has not wholly committed
    group: object = None             # its placement group (with its audio actors)
    retry_at: float = 0.0            # when to ask a lost actor again whether it is back


class RayRunner:
    """The driver's side of a job on Ray (module docstring)."""

    def __init__(self, rows, cfg, dst: str, job_id: str, kind=None, items=None, on_counts=None):
        import ray

        self.ray = ray
        self.cfg, self.dst, self.job_id = cfg, dst, job_id
        self.kind = kind or decoder_kind(cfg.decoder.kind)
        if self.kind.name != cfg.decoder.kind:
            raise ValueError(f"decoder kind {self.kind.name!r} given for a config of decoder.kind={cfg.decoder.kind}")
        self.on_counts = on_counts
        self.plan = pool_plan(cfg, self.kind)
        self.local = _single_node(cfg)
        self.source_ref = None if isinstance(rows, list) or rows.kind == "files" else ray.put(rows)
        self.feed = _units(rows, cfg.ray.rows_per_unit, items, self.plan.initial)
        self.exhausted = False
        self.queue: collections.deque = collections.deque()     # units to run again, first
        self.units: dict[int, _Unit] = {}
        self.next_unit = 0
        self.slots: list[_Slot] = []
        self.stats = SecondStageStats(cfg.batching.max_tokens) if self.kind.two_stage else None
        self.driver = {"events": 0, "bytes_received": 0, "pending_rows": 0, "parts": 0}
        self.placements: dict[str, dict] = {}

    # -- actors ---------------------------------------------------------------------------
    def _start_actor(self) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        plan = self.plan
        gpu = {"GPU": plan.gpus} if plan.gpus else {}
        # One reservation on one node for the model actor and its audio actors (its
        # children join it), so an audio actor never waits for a CPU the cluster gave away.
        group = placement_group([{"CPU": plan.cpus + plan.audio_actors * plan.audio_cpus, **gpu}],
                                strategy="STRICT_PACK")
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0,
                                                 placement_group_capture_child_tasks=True)
        # Restarted by Ray where it dies (its units go to other actors meanwhile); a unit
        # is never retried by Ray itself: the driver redoes only its uncommitted rows.
        from .model_actor import ModelActor

        actor = ModelActor.options(num_cpus=plan.cpus, num_gpus=plan.gpus, max_restarts=-1,
                                            max_task_retries=0, scheduling_strategy=where).remote(
            self.cfg.to_dict(), self.kind, model_family(self.cfg.model.family), self.dst, self.job_id,
            self.source_ref, plan.audio_actors)
        self.slots.append(_Slot(actor, ready=actor.where.remote(), group=group))

    def _grow(self) -> None:
        if not self.plan.grows:
            return
        target = self.plan.target(self.ray.cluster_resources(), self.ray.nodes(), self.local)
        for _ in range(max(0, target - len(self.slots))):
            self._start_actor()

    # -- units ----------------------------------------------------------------------------
    def _next_unit(self) -> int | None:
        if self.queue:
            return self.queue.popleft()
        if self.exhausted:
            return None
        payload = next(self.feed, None)
        if payload is None:
            self.exhausted = True
            return None
        number = self.next_unit
        self.next_unit += 1
        self.units[number] = _Unit(payload)
        return number

    def _dispatch(self, slot: _Slot) -> bool:
        number = self._next_unit()
        if number is None:
            return False
        unit = self.units[number]
        unit.skipped, unit.expected = len(unit.committed), None
        slot.unit, slot.since = number, time.monotonic()
        slot.held.add(number)
        slot.gen = slot.actor.run.options(num_returns="streaming").remote(number, unit.payload,
                                                                         sorted(unit.committed))
        return True

    def _lost(self, slot: _Slot) -> None:
        """``slot``'s actor died: every unit it held and had not wholly committed runs
        again, less its committed rows, once an actor is free."""
        self._requeue(slot, slot.held)
        slot.gen, slot.unit, slot.where = None, None, None
        slot.ready = slot.actor.where.remote()

    def _requeue(self, slot: _Slot, numbers) -> None:
        """Units ``slot``'s actor held and lost (its process gone): they run again first,
        in order, less their committed rows."""
        numbers = set(numbers)
        self.queue.extendleft(sorted((n for n in numbers if n in self.units), reverse=True))
        slot.held -= numbers

    def _complete(self, number: int) -> bool:
        unit = self.units.get(number)
        if unit is None:
            return True
        if unit.expected is not None and len(unit.committed) >= unit.expected:
            del self.units[number]
            return True
        return False

    # -- events ---------------------------------------------------------------------------
    def _event(self, slot: _Slot, event: dict) -> None:
        from ..pipeline.output.handoff import commit_written

        if slot.where is not None and event["incarnation"] != slot.where["incarnation"]:
            # A restart the driver had not seen: what the old process held is gone.
            self._requeue(slot, slot.held - {slot.unit})
            slot.where = None
        self.driver["events"] += 1
        self.driver["bytes_received"] += event["bytes"]
        self.driver["pending_rows"] += event["pending_rows"]
        for part in event["parts"]:
            commit_written(self.dst, self.job_id, part, self.cfg.storage.options)
            self.driver["parts"] += 1
            for number, ids in part.ids.items():
                if number in self.units:
                    self.units[number].committed.update(ids)
        if self.stats is not None and (event["calls"] or event["waits"]):
            self.stats.merge(event["calls"], event["waits"])
        rows = event["counts"][0]
        if slot.where is not None:
            self.placements[slot.where["incarnation"]]["rows"] += rows
        if any(event["counts"]) and self.on_counts is not None:
            self.on_counts(*event["counts"])
        if event["read"] is not None and slot.unit is not None and slot.unit in self.units:
            unit = self.units[slot.unit]
            unit.expected = unit.skipped + event["read"]
        slot.held = {n for n in slot.held if not self._complete(n)}

    def _ready(self, slot: _Slot, where: dict) -> None:
        slot.ready, slot.where = None, where
        self.placements.setdefault(where["incarnation"], {**{k: where[k] for k in ("node", "gpus", "device")},
                                                          "rows": 0})

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        ray = self.ray
        cfg = self.cfg
        for _ in range(self.plan.initial):
            self._start_actor()
        none_ready_since = time.monotonic()    # the job's start, or since its last actor was lost
        grown = none_ready_since
        watchdog = cfg.ray.no_progress_timeout_s
        while True:
            now = time.monotonic()
            for slot in self.slots:
                if slot.where is None and slot.ready is None and now >= slot.retry_at:
                    slot.ready = slot.actor.where.remote()
                if slot.where is not None and slot.gen is None and not self._dispatch(slot) and slot.held \
                        and not self.queue:
                    self._drain(slot)
            if self.exhausted and not self.queue and not self.units:
                return
            waiting = {s.ready: s for s in self.slots if s.ready is not None}
            streams = {s.gen: s for s in self.slots if s.gen is not None}
            if waiting or streams:
                ready, _ = ray.wait(list(waiting) + list(streams), num_returns=1, timeout=POLL_S)
            else:
                ready = []
                time.sleep(POLL_S)
            for obj in ready:
                if obj in waiting:
                    self._on_ready(waiting[obj], obj)
                else:
                    self._on_stream(streams[obj])
            now = time.monotonic()
            if any(s.where is not None for s in self.slots):
                none_ready_since = now
            elif now - none_ready_since > cfg.ray.start_timeout_s:
                raise JobStalled(f"no model actor started within ray.start_timeout_s={cfg.ray.start_timeout_s:g} s "
                                 f"({self.plan.describe()}; the cluster has {_resources_text(ray)}); parts written "
                                 "so far are kept and a rerun resumes after them")
            if watchdog != -1:
                for s in self.slots:
                    if s.gen is not None and now - s.since > watchdog:
                        raise JobStalled(f"no progress for ray.no_progress_timeout_s={watchdog:g} s; parts written "
                                         "so far are kept and a rerun resumes after them")
            if now - grown >= GROW_S:
                grown = now
                self._grow()

    def _on_ready(self, slot: _Slot, ref) -> None:
        try:
            self._ready(slot, self.ray.get(ref))
        except _actor_lost_errors():
            # Restarting, its node gone and no room elsewhere yet: asked again in a while
            # (the job's bound is ray.start_timeout_s without any actor ready).
            slot.ready, slot.retry_at = None, time.monotonic() + RETRY_S

    def _on_stream(self, slot: _Slot) -> None:
        ray = self.ray
        _ACTOR_LOST = _actor_lost_errors()
        try:
            ref = next(slot.gen)
        except StopIteration:
            slot.gen, slot.unit = None, None
            return
        try:
            event = ray.get(ref)
        except _ACTOR_LOST:
            log.warning("a model actor was lost; its unfinished rows run again on another")
            self._lost(slot)
            return
        slot.since = time.monotonic()
        self._event(slot, event)

    def _drain(self, slot: _Slot) -> None:
        """An idle actor's held rows (pooled for the second stage, or finished and not yet
        written), finished, written and committed now: no unit is left for it."""
        watchdog = self.cfg.ray.no_progress_timeout_s
        try:
            event = self.ray.get(slot.actor.drain.remote(), timeout=None if watchdog == -1 else watchdog)
        except self.ray.exceptions.GetTimeoutError:
            raise JobStalled(f"no progress for ray.no_progress_timeout_s={watchdog:g} s (a model actor finishing "
                             "its pooled rows); parts written so far are kept and a rerun resumes after them") from None
        except _actor_lost_errors():
            self._lost(slot)
            return
        self._event(slot, event)
        # Units not complete after a drain were held by a process that restarted since.
        self._requeue(slot, slot.held)

    def stop(self) -> None:
        """However the run ends: every live actor writes what it holds (an interrupt's
        rows are committed, as the local runner's are), then every actor is killed."""
        from ..pipeline.output.handoff import remove_uncommitted

        ray = self.ray
        calls = {s.actor.flush.remote(): s for s in self.slots if s.where is not None}
        deadline = time.monotonic() + FLUSH_ON_STOP_S
        while calls and time.monotonic() < deadline:
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            slot = calls.pop(ready[0])
            try:
                self._event(slot, ray.get(ready[0]))
            except Exception as exc:   # a lost actor's rows are redone by the rerun
                log.warning("a model actor could not write its rows on the way out: %s", exc)
        from ray.util.placement_group import remove_placement_group

        for s in self.slots:
            try:
                ray.kill(s.actor)
                remove_placement_group(s.group)
            except Exception:   # already gone with its node, or Ray shut down
                pass
        try:
            remove_uncommitted(self.dst, self.job_id, self.cfg.storage.options)
        except Exception as exc:
            log.warning("could not remove the job's uncommitted temporary parts: %s", exc)

    def report(self) -> dict:
        d = dict(self.driver)
        d["bytes_per_pending_row"] = round(d["bytes_received"] / d["pending_rows"], 1) if d["pending_rows"] else None
        return {"model_actors": list(self.placements.values()), "driver": d,
                "pool": {"gpus_per_actor": self.plan.gpus, "cpus_per_actor": self.plan.cpus,
                         "audio_actors_per_actor": self.plan.audio_actors, "initial": self.plan.initial,
                         "grows": self.plan.grows}}


def _actor_lost_errors() -> tuple:
    import ray

    return tuple(e for e in (ray.exceptions.RayActorError, getattr(ray.exceptions, "ActorUnavailableError", None))
                 if e is not None)


def _resources_text(ray) -> str:
    r = ray.cluster_resources()
    return f"{r.get('CPU', 0):g} CPUs, {r.get('GPU', 0):g} GPUs"


def run_ray(rows, cfg, dst: str, kind=None, items: list[dict] | None = None, job_id: str | None = None,
            on_counts=None, on_second_stage=None, on_cluster=None) -> dict | None:
    """The job on Ray: ``rows`` (a list of INPUT dicts, or a pipeline.sources.Source;
    ``items``: its scan's work items, if already made) into parts under ``dst``.
    ``on_counts(rows, audio_s, errors, partial)`` gets each report of finished rows (and
    of the pieces of long recordings, pipeline.pieces);
    ``on_second_stage(stats)`` a two-stage kind's second-stage counts and ``on_cluster``
    the pool's placements and the driver's own traffic, however the run ends. Returns the
    second-stage counts (None for a one-stage kind)."""
    from ..pipeline.output import new_job_id
    from ..pipeline.storage import url_to_fs

    init_ray(cfg)
    fs, path = url_to_fs(dst, cfg.storage.options)
    fs.makedirs(path, exist_ok=True)
    runner = RayRunner(rows, cfg, dst, job_id or new_job_id(), kind, items, on_counts)
    stats = None
    try:
        runner.run()
    finally:
        runner.stop()
        if runner.stats is not None:
            stats = runner.stats.as_dict()
            if on_second_stage is not None:
                on_second_stage(stats)
        if on_cluster is not None:
            on_cluster(runner.report())
    return stats
