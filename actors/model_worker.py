"""The Ray runner's model actor: one per GPU (or per CPU slot), fed work units by the
driver (actors.plan), holding everything heavy itself.

For each unit (a table of input rows, or a work item of the source to read) it reads the
rows, has its own audio actors on its node decode and segment them a few batches ahead,
runs the model on blocks joined until their segments fill the token budget
(pipeline.regroup) and, for a two-stage kind, the pooled second stage in this same process
with the same weights (actors.stage_loop; no second copy of the model, no pending state
leaving the actor), and writes finished rows as parts under temporary names
(pipeline.output.handoff). What it reports to the driver are small events: rows, audio
seconds and errors finished (the console's progress), the parts written (names and ids),
the second stage's call counts, and the bytes of the event itself.

The device is chosen here, where the model runs: ``model.device=auto`` is the GPU Ray
assigned this actor (``CUDA_VISIBLE_DEVICES``), else the CPU.

Usable in-process without Ray (the audio stage then runs in this process).
"""
from __future__ import annotations

import collections
import os
import pickle
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.compute as pc

from .audio_prep import AudioPrep
from .finisher import Finisher
from .progress import block_counts
from .registrations import adopt
from .stage_loop import StageLoop
from .transcriber import Transcriber
from ..pipeline.config import config_from_dict
from ..pipeline.kinds import decoder_kind
from ..pipeline.output.handoff import PartBuffer
from ..pipeline.prepare_stream import PIECES_AHEAD
from ..pipeline.regroup import model_batches
from ..pipeline.sources import read_item, slow_start_tables

# Seconds between progress events while a unit runs (a part or the unit's end always
# reports at once): the driver's cost is per event, not per row.
PROGRESS_S = 1.0


class ModelWorker:
    def __init__(self, config: dict, kind=None, family=None, dst: str = "", job_id: str = "", source=None,
                 audio_actors: int = 1):
        adopt(kind, family)
        self.cfg = config_from_dict(config)
        self.kind = kind or decoder_kind(self.cfg.decoder.kind)
        self.incarnation = uuid.uuid4().hex[:12]
        self.source = source
        self.model = Transcriber(config, self.kind, family)
        # The second stage shares the first stage's model and state (no second copy), and
        # its token budget, sized where the model loaded.
        self.cfg.batching.max_tokens = self.model.cfg.batching.max_tokens
        self.second = Finisher(config, self.kind, family, first_stage=self.model.decoder) \
            if self.kind.two_stage else None
        if self.second is not None:
            self.second.cfg.batching.max_tokens = self.cfg.batching.max_tokens
        # One loop for the actor's life: the second stage pools rows across work units.
        self.loop = StageLoop(self.model, self.second, self.cfg, on_progress=self._progress)
        self.buffer = PartBuffer(dst, job_id, self.cfg.output.rows_per_part, self.cfg.output.commit_interval_s,
                                 self.cfg.storage.options)
        self.prep = _AudioStage(config, self.kind, family, audio_actors)
        self.lock = threading.Lock()     # the buffer and counts: run and flush may overlap
        self.unit_of: dict[str, int] = {}   # ids read and not yet emitted -> their unit
        self.counts = [0, 0.0, 0, 0.0]
        self.sent_calls = self.sent_waits = 0
        self.sent_pending = 0
        self.started = False

    def where(self) -> dict:
        """Where this actor runs: node, GPUs Ray assigned it, the device its model uses."""
        node, gpus = None, []
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
                gpus = [str(g) for g in ray.get_gpu_ids()]
        except ImportError:
            pass
        adapter = self.model.adapter
        device = str(getattr(adapter, "device", "cpu")) if adapter is not None else "cpu"
        return {"incarnation": self.incarnation, "node": node, "gpus": gpus, "device": device, "pid": os.getpid()}

    def run(self, number: int, unit: dict, skip: list[str] | None = None):
        """Unit ``number`` (``{"rows": INPUT table}`` or ``{"items": [work items]}``), less the
        ids in ``skip`` (committed by an earlier attempt): yields events (dicts) as parts
        are written and every PROGRESS_S, and one with ``read`` (the unit's rows read) at
        its end. Its rows that wait for the second stage stay pooled for the next units
        (:meth:`drain` finishes them)."""
        cfg = self.cfg
        per_block = max(1, cfg.batching.recordings_per_batch)
        read = [0]

        def tables():
            for t in _unit_tables(unit, self.source, per_block, skip):
                read[0] += t.num_rows
                self.unit_of.update(dict.fromkeys(t.column("id").to_pylist(), number))
                yield t

        batches, first = tables(), None
        if not self.started:
            # The actor's first rows finish within seconds (pipeline.batching.slow_start).
            batches, first = slow_start_tables(batches, per_block, cfg.batching.first_batch), cfg.batching.first_batch
            self.started = True
        # The model stage joins prepared blocks until their segments fill the token budget
        # (pipeline.regroup); the slow start's pieces pass alone.
        joined = model_batches(self.prep.map(batches), cfg.batching, self.model.cost, slow_start=first is not None)
        parts: list = []
        last = time.monotonic()
        for _ in self.loop.steps(joined, lambda out: self._emit(out, parts), first):
            # The slow start's rows are reported batch by batch: a job's first rows show
            # within seconds; after it, at most one report every PROGRESS_S.
            if parts or first is not None or time.monotonic() - last >= PROGRESS_S:
                yield self._event(parts)
                parts.clear()
                last = time.monotonic()
        yield self._event(parts, read=read[0])

    def drain(self) -> dict:
        """No unit is coming: finish the rows the second stage still pools and write what
        the buffer holds as a part. Only between units (the model runs here)."""
        parts: list = []
        self.loop.finish(lambda out: self._emit(out, parts))
        with self.lock:
            part = self.buffer.write()
        return self._event(parts + ([part] if part is not None else []))

    def flush(self) -> dict:
        """Write what the buffer holds as a part now (an interrupt); pooled rows stay
        unfinished, for the rerun. Safe beside a running unit."""
        with self.lock:
            part = self.buffer.write()
        return self._event([part] if part is not None else [])

    def _emit(self, out: pa.Table, parts: list) -> None:
        units = [self.unit_of.pop(i) for i in out.column("id").to_pylist()]
        with self.lock:
            self.buffer.add(out, units)
            self.counts = [a + b for a, b in zip(self.counts, block_counts(out))]
            if self.buffer.due():
                parts.append(self.buffer.write())

    def _progress(self, counts) -> None:
        with self.lock:
            self.counts = [a + b for a, b in zip(self.counts, counts)]

    def _event(self, parts: list, read: int | None = None) -> dict:
        with self.lock:
            counts, self.counts = self.counts, [0, 0.0, 0, 0.0]
        event = {"incarnation": self.incarnation, "counts": counts, "parts": list(parts), "read": read,
                 "pending_rows": self.loop.pending_rows - self.sent_pending, "calls": [], "waits": []}
        self.sent_pending = self.loop.pending_rows
        stats = self.loop.stats
        if stats is not None:
            event["calls"] = stats.calls[self.sent_calls:]
            event["waits"] = stats.waits[self.sent_waits:]
            self.sent_calls, self.sent_waits = len(stats.calls), len(stats.waits)
        # What the driver receives for this event, measured where it is cheap (here).
        event["bytes"] = len(pickle.dumps(event, protocol=5))
        return event


def _unit_tables(unit: dict, source, per_block: int, skip: list[str] | None):
    """The unit's INPUT tables of at most ``per_block`` rows, less ``skip``."""
    if "rows" in unit:
        data = unit["rows"]
        tables = (data.slice(i, per_block) for i in range(0, data.num_rows, per_block))
    else:
        tables = (t for item in unit["items"] for t in read_item(source, item, per_block))
    if not skip:
        yield from tables
        return
    drop = pa.array(skip, pa.string())
    for t in tables:
        kept = t.filter(pc.invert(pc.is_in(t.column("id"), value_set=drop)))
        if kept.num_rows:
            yield kept


class _AudioStage:
    """Decode and segment: ``n`` audio actors on this actor's node, a few batches ahead of
    the model, in input order; in this process where Ray is not running."""

    def __init__(self, config: dict, kind, family, n: int):
        self.local = None
        self.actors = []
        try:
            import ray

            running = ray.is_initialized()
        except ImportError:
            running = False
        if not running:
            self.local = AudioPrep(config, kind, family)
            return
        cfg = config_from_dict(config)
        cls = ray.remote(_PrepActor)
        # In the model actor's placement group (actors.plan), so on its node: the prepared
        # audio never crosses the network. Retried on a restarted actor: preparing a batch
        # has no side effect.
        self.actors = [cls.options(num_cpus=cfg.ray.audio_actor_cpus, max_restarts=-1, max_task_retries=-1)
                       .remote(config, kind, family) for _ in range(max(1, n))]

    def map(self, tables):
        """(rows finished, prepared table) per table, in order: one per input table, and
        one per piece of a long recording (AudioPrep.tables)."""
        if self.local is not None:
            for t in tables:
                yield from self.local.tables(t)
            return
        import ray

        ahead = collections.deque()
        depth = len(self.actors) + 1
        turn = 0
        for t in tables:
            # A stream of tables per input table; an audio actor stops PIECES_AHEAD tables
            # ahead of the model, so a long recording's pieces never pile up in the object
            # store.
            ahead.append(self.actors[turn % len(self.actors)].tables.options(
                num_returns="streaming", _generator_backpressure_num_objects=PIECES_AHEAD).remote(t))
            turn += 1
            if len(ahead) > depth:
                yield from (ray.get(ref) for ref in ahead.popleft())
        while ahead:
            yield from (ray.get(ref) for ref in ahead.popleft())


class _PrepActor:
    def __init__(self, config: dict, kind, family):
        self.prep = AudioPrep(config, kind, family)

    def tables(self, batch: pa.Table):
        yield from self.prep.tables(batch)
