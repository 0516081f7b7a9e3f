"""The second stage of a two-stage decoder kind on Ray, fed by the driver.

The plan (actors.plan) ends at the model pool; the driver already takes every finished
block to commit it (``write_output``). Of each block it commits the rows with nothing
pending at once, and the rows with pending segments go to this pool: their sub-table (the
pending states ride in it as packed safetensors bytes) is put once into the object store,
one actor prices their segments (the second stage's ``cost``), and the driver's
``PendingPool`` (pipeline.pending_pool) packs them across blocks into full token-budget
batches, which the actors (``Finisher`` as a plain Ray actor, ``ray.fallback_actors`` of
``ray.fallback_actor_cpus`` and half a GPU each, as the Ray Data pool was) finish and
return as output rows for the driver to commit.

Why the driver and not a stateful Ray Data stage: a stage that holds rows back has no
end-of-stream hook to flush them, and rows it holds when its actor dies are gone while
Ray Data counts their blocks as done. Here the driver owns every pending row (object refs)
until its finished row is committed: a killed actor is restarted and its call retried
(``max_restarts``/``max_task_retries``), a killed driver committed none of them, so the
rerun redoes exactly those rows. Ray Data keeps streaming; the driver stops taking blocks
while ``second_stage.max_pending_segments`` are held (priced, pooled or being finished).

A service thread dispatches and collects, so a batch leaves after ``max_wait_s`` even while
the driver waits for a slow block. The pending rows of the job's slow-start blocks
(``batching.first_batch``) but the last are finished as soon as they are priced (trigger
``start``), as the local runner does, so the first rows show within seconds.
"""
from __future__ import annotations

import itertools
import threading

from pipeline.pending_pool import PendingPool, SecondStageStats


def _actor_class():
    """Finisher as a Ray actor: ``finish`` in its default group (one call at a time, the
    model's), ``price`` in a group of its own, so pricing a new block never waits for a
    batch being finished."""
    import ray

    from actors.finisher import Finisher

    class SecondStageActor:
        def __init__(self, config: dict, kind, family):
            self.finisher = Finisher(config, kind, family)

        @ray.method(concurrency_group="price")
        def price(self, pending):
            return self.finisher.price_rows(pending.to_pylist())

        def finish(self, indices: list[list[int]], trigger: str, *tables):
            rows = [r for t, idx in zip(tables, indices) for r in t.take(idx).to_pylist()]
            stats = SecondStageStats()
            out = self.finisher.finish_rows(rows, stats, trigger)
            return out, stats.calls

    return ray.remote(concurrency_groups={"price": 1})(SecondStageActor)


class RaySecondStage:
    """The driver's side: ``offer`` a block's pending sub-table, ``throttle`` before
    taking the next block, ``drain`` at the end, ``close`` always. ``commit(table)``
    receives every finished table (from the service thread, under the caller's lock)."""

    POLL_S = 0.05

    def __init__(self, cfg, kind, family, commit, gpu: bool):
        import ray

        self.ray = ray
        self.commit = commit
        opts = cfg.second_stage
        self.pooled = opts.pooled
        self.max_pending = opts.max_pending_segments
        self.pool = PendingPool(cfg.batching.max_tokens, opts.max_wait_s, opts.max_pending_segments)
        self.stats = SecondStageStats(cfg.batching.max_tokens)
        extra = {"num_gpus": 0.5} if gpu else {}
        cls = _actor_class()
        args = (cfg.to_dict(), kind, family)
        self.actors = [cls.options(num_cpus=cfg.ray.fallback_actor_cpus, max_restarts=-1, max_task_retries=-1,
                                   **extra).remote(*args) for _ in range(max(1, cfg.ray.fallback_actors))]
        self.load = {i: 0 for i in range(len(self.actors))}   # calls in flight per actor
        self.cond = threading.Condition()
        self.blocks: dict[int, list] = {}   # block no -> [object ref, rows not yet finished]
        self.pricing: dict = {}             # price future -> block no
        self.finishing: dict = {}           # finish future -> (actor, [(block, row)], segments)
        self.held = 0                       # pending segments offered and not yet committed
        self.final = False
        self.starting: set[int] = set()     # slow-start blocks not yet priced
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self._numbers = itertools.count()
        self._next_actor = itertools.cycle(range(len(self.actors)))
        self.thread = threading.Thread(target=self._serve, name="second-stage", daemon=True)
        self.thread.start()

    # -- the driver's thread -------------------------------------------------------------
    def offer(self, pending, segments: int, start: bool = False) -> None:
        """A block's rows with pending segments (an INTERMEDIATE table), ``segments`` of
        them pending in all; ``start``: a block of the job's slow start, whose rows are
        finished once priced (trigger ``start``) instead of waiting for a full budget."""
        ref = self.ray.put(pending)
        block = next(self._numbers)
        with self.cond:
            self._raise()
            self.blocks[block] = [ref, pending.num_rows]
            self.held += segments
            if self.pooled:
                self.pricing[self.actors[next(self._next_actor)].price.remote(ref)] = block
                if start:
                    self.starting.add(block)
            else:
                # Unpooled: the block's pending rows as one call, as the old per-block stage.
                self._dispatch([(block, i) for i in range(pending.num_rows)], "block", [], segments)
            self.cond.notify_all()

    def throttle(self) -> None:
        """Wait while the pending segments held reach ``max_pending_segments``."""
        with self.cond:
            while self.held >= self.max_pending and self.error is None:
                self.cond.wait(self.POLL_S * 4)
            self._raise()

    def drain(self) -> None:
        """The input is exhausted: finish and commit everything held."""
        with self.cond:
            self.final = True
            self.cond.notify_all()
            while (self.blocks or self.pricing or self.finishing) and self.error is None:
                self.cond.wait(self.POLL_S * 4)
            self._raise()

    def close(self) -> dict:
        self.stop.set()
        self.thread.join(timeout=30)
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:   # already gone with its node, or Ray shut down
                pass
        return self.stats.as_dict()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    # -- the service thread --------------------------------------------------------------
    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                self._step()
            except BaseException as exc:   # handed to the driver's thread
                with self.cond:
                    self.error = exc
                    self.cond.notify_all()
                return

    def _step(self) -> None:
        with self.cond:
            futures = list(self.pricing) + list(self.finishing)
        if futures:
            ready, _ = self.ray.wait(futures, num_returns=len(futures), timeout=self.POLL_S)
        else:
            ready = []
            self.stop.wait(self.POLL_S)
        start = False
        with self.cond:
            for fut in ready:
                if fut in self.pricing:
                    block = self.pricing.pop(fut)
                    self._priced(block, self.ray.get(fut))
                    if block in self.starting:
                        self.starting.discard(block)
                        start = True
            finished = [(fut, self.finishing.pop(fut)) for fut in ready if fut in self.finishing]
        for fut, (actor, keys, segments) in finished:
            out, calls = self.ray.get(fut)
            self.commit(out)   # outside our lock: it takes the committer's
            with self.cond:
                self.stats.merge(calls)
                self.load[actor] -= 1
                self.held -= segments
                for block, _ in keys:
                    self.blocks[block][1] -= 1
                    if not self.blocks[block][1]:
                        del self.blocks[block]   # its object ref goes: the store frees it
                self.cond.notify_all()
        with self.cond:
            if self.pooled:
                nothing_moves = not self.finishing and not self.pricing
                drain = self.held >= self.max_pending and nothing_moves
                for batch in self.pool.take(final=self.final and not self.pricing, drain=drain, start=start):
                    self._dispatch(batch.keys, batch.trigger, batch.waits, batch.segments)
            self.cond.notify_all()

    def _priced(self, block: int, costs: list[list[int]]) -> None:
        for row, row_costs in enumerate(costs):
            self.pool.add((block, row), row_costs)

    def _dispatch(self, keys: list, trigger: str, waits: list, segments: int) -> None:
        by_block: dict[int, list[int]] = {}
        for block, row in keys:
            by_block.setdefault(block, []).append(row)
        actor = min(self.load, key=self.load.get)
        self.load[actor] += 1
        self.stats.record_waits(waits)
        blocks = list(by_block)
        fut = self.actors[actor].finish.remote([by_block[b] for b in blocks], trigger,
                                               *[self.blocks[b][0] for b in blocks])
        self.finishing[fut] = (actor, keys, segments)
