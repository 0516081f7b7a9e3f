"""CTC beam-search actor (seed 002 + seed 003): the second pool of the ctc_beam plan.

Receives rows whose segments carry CTC log-probs as CPU arrays, decodes them with the
batched beam search (LM fusion, per-row key phrases from the `key_phrases` column plus
the configured ones), and emits output rows. No model is loaded here, only the LM tensors.
Usable with Ray Data or in-process.
"""
from __future__ import annotations

import pyarrow as pa

from pipeline.beam_stage import CTCBeamFinisher
from pipeline.config import config_from_dict, resolve_device
from pipeline.records import OUTPUT_SCHEMA, rows_with_arrays, table
from pipeline.transcribe import complete_pending


class CTCBeamDecoder:
    def __init__(self, config: dict, first_stage=None):
        # first_stage is accepted for symmetry with SSDFallback: the beam search needs no model.
        self.cfg = config_from_dict(config)
        self.finisher = CTCBeamFinisher(self.cfg.beam, device=resolve_device(self.cfg.model.device))

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = rows_with_arrays(batch, "pending_states")
        return table(complete_pending(rows, self.finisher, self.cfg.batching.max_tokens), OUTPUT_SCHEMA)
