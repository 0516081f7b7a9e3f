"""actors.model_worker.ModelWorker as a Ray actor: ``run`` streams one work unit's events
at a time; ``where``, ``flush`` and ``drain`` run in a group of their own, so an
interrupt's ``flush`` never waits for the unit the actor is decoding. Imported only where
Ray runs the job (actors.plan)."""
from __future__ import annotations

import ray

from .model_worker import ModelWorker


@ray.remote(concurrency_groups={"control": 1})
class ModelActor:
    def __init__(self, *args, **kwargs):
        self.worker = ModelWorker(*args, **kwargs)

    @ray.method(concurrency_group="control")
    def where(self) -> dict:
        return self.worker.where()

    @ray.method(concurrency_group="control")
    def flush(self) -> dict:
        return self.worker.flush()

    @ray.method(concurrency_group="control")
    def drain(self) -> dict:
        # Called by the driver only while no unit runs: the model is free.
        return self.worker.drain()

    def run(self, number: int, unit: dict, skip: list[str]):
        yield from self.worker.run(number, unit, skip)
