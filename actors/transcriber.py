"""Model actor: prepared rows -> output rows (or, for a two-stage decoder kind, rows whose
unfinished segments carry their pending state to the second stage).

Loads the model once in ``__init__`` (pipeline.models.load_model) and builds the decoder
kind's first stage. Held by the Ray runner's model actor (actors.model_worker) or the in-process runner.
"""
from __future__ import annotations

import pyarrow as pa

from .registrations import adopt
from ..pipeline.confidence.apply import ConfidenceScorer
from ..pipeline.batching import resolve_max_tokens
from ..pipeline.config import config_from_dict, config_hash
from ..pipeline.kinds import decoder_kind
from ..pipeline.device import torch_threads, worker_threads
from ..pipeline.filters import mark_rows
from ..pipeline.models import load_model
from ..pipeline.records import INTERMEDIATE_SCHEMA, OUTPUT_SCHEMA, prepared_rows, stamp, table
from ..pipeline.regroup import segments_cost
from ..pipeline.segment_runner import transcribe_prepared


class Transcriber:
    def __init__(self, config: dict, kind=None, family=None):
        adopt(kind, family)
        self.cfg = config_from_dict(config)
        self.config_hash = config_hash(self.cfg)
        self.kind = kind or decoder_kind(self.cfg.decoder.kind)
        self.threads = worker_threads(self.cfg.model.num_threads)
        with torch_threads(self.threads):
            # A kind that needs no model capability (it reads the audio alone) loads no model.
            self.adapter = load_model(self.cfg.model) if self.kind.needs else None
            if self.adapter is not None:
                # Sized where the model runs: on CUDA from its free memory, unless set.
                self.cfg.batching.max_tokens = resolve_max_tokens(self.cfg, self.adapter)
            self.decoder = self.kind.build_first_stage(self.adapter, self.cfg)
        self.schema = INTERMEDIATE_SCHEMA if self.kind.two_stage else OUTPUT_SCHEMA
        self.confidence = ConfidenceScorer.from_config(self.cfg, self.kind)

    def cost(self, batch: pa.Table) -> int:
        """What prepared ``batch``'s segments cost under the token budget
        (``cfg.batching.max_tokens``), as this model's first stage prices them."""
        return segments_cost(batch, self.decoder.segment_cost)

    def __call__(self, batch: pa.Table) -> pa.Table:
        return table(self.rows(batch), self.schema)

    def rows(self, batch: pa.Table, pending_as_bytes: bool = True) -> list[dict]:
        """The output rows of ``batch`` before they become a table; with
        ``pending_as_bytes=False`` their pending states stay objects, for a second stage in
        this process (``Finisher.finish_rows``)."""
        with torch_threads(self.threads):
            rows = transcribe_prepared(prepared_rows(batch), self.decoder, self.cfg.batching.max_tokens,
                                       confidence=self.confidence, pending_as_bytes=pending_as_bytes)
        mark_rows(rows, self.cfg.filters)
        return stamp(rows, self.config_hash)
