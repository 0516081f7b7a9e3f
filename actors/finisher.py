"""Second-pool actor of a two-stage decoder kind: finishes the segments the model pool
left pending (SSD's AR fallback, CTC beam search), re-batched by token budget across the
rows it is given; every other row and segment passes through untouched.

The runners pool pending rows across input batches (actors.stage_loop, in the process
that holds the model) and hand this stage full token-budget batches: ``price_rows`` tells
them each pending segment's cost, ``finish_rows`` finishes a batch.

In-process (``first_stage`` given) the kind's second stage may share the first stage's
model and in-process state; in its own Ray pool it builds what it needs from the config.
"""
from __future__ import annotations

import pyarrow as pa

from .registrations import adopt
from ..pipeline.confidence.apply import ConfidenceScorer
from ..pipeline.config import config_from_dict, config_hash
from ..pipeline.kinds import decoder_kind
from ..pipeline.device import torch_threads, worker_threads
from ..pipeline.filters import mark_rows
from ..pipeline.records import OUTPUT_SCHEMA, stamp, table
from ..pipeline.segment_runner import complete_pending, pending_costs


class Finisher:
    def __init__(self, config: dict, kind=None, family=None, first_stage=None):
        adopt(kind, family)
        self.cfg = config_from_dict(config)
        self.config_hash = config_hash(self.cfg)
        self.kind = kind or decoder_kind(self.cfg.decoder.kind)
        self.threads = worker_threads(self.cfg.model.num_threads)
        with torch_threads(self.threads):
            self.stage = self.kind.build_second_stage(self.cfg, first_stage)
        self.confidence = ConfidenceScorer.from_config(self.cfg, self.kind)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return self.finish_rows(batch.to_pylist())

    def price_rows(self, rows: list[dict]) -> list[list[int]]:
        """Per row, the second stage's cost of each of its pending segments."""
        return [pending_costs(row, self.stage) for row in rows]

    def finish_rows(self, rows: list[dict], stats=None, trigger: str | None = None) -> pa.Table:
        """The first stage's rows, as dicts (``Transcriber.rows`` in this process, or a
        batch of its table), finished into an output table. ``stats``: a
        pipeline.pending_pool.SecondStageStats to record the calls in, ``trigger`` what
        dispatched these rows."""
        with torch_threads(self.threads):
            rows = complete_pending(rows, self.stage, self.cfg.batching.max_tokens, confidence=self.confidence,
                                    stats=stats, trigger=trigger)
        rows = mark_rows(rows, self.cfg.filters)
        return table(stamp(rows, self.config_hash), OUTPUT_SCHEMA)
