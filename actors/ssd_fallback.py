"""SSD AR-fallback actor (seed 000 eqs. 6-7): the second pool of the SSD plan.

Takes the first pool's rows, re-batches only the segments that failed verification (by
token budget, across all rows of the batch), resumes greedy decoding from each verified
prefix on the encoder states that travelled as CPU arrays, and passes every other row
through untouched. Usable with Ray Data or in-process; in-process it also starts each row
from the first stage's verification KV cache, cropped to the prefix.
"""
from __future__ import annotations

import pyarrow as pa

from actors.transcriber import build_segment_decoder
from pipeline.config import config_from_dict
from pipeline.records import OUTPUT_SCHEMA, rows_with_arrays, table
from pipeline.transcribe import complete_pending


class SSDFallback:
    def __init__(self, config: dict, first_stage=None):
        self.cfg = config_from_dict(config)
        # In-process runs pass the first stage (a Transcriber), so the model is loaded once
        # and the first stage keeps each pending row's verification KV cache for us.
        if first_stage is not None:
            self.decoder = first_stage.decoder
            self.decoder.keep_seeds = True
        else:
            self.decoder = build_segment_decoder(self.cfg)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = rows_with_arrays(batch, "pending_states", "pending_kv")
        return table(complete_pending(rows, self.decoder, self.cfg.batching.max_tokens), OUTPUT_SCHEMA)
