"""Decode/segment actor: manifest rows -> prepared rows (pipeline.prepare), CPU only.

Usable with Ray Data (`map_batches(AudioPrep, ...)`) or called in-process.
"""
from __future__ import annotations

import pyarrow as pa

from actors.registrations import adopt
from pipeline.config import config_from_dict
from pipeline.prepare import prepare_row
from pipeline.records import PREPARED_SCHEMA, table
from pipeline.segment import VadSegmenter


class AudioPrep:
    def __init__(self, config: dict, kind=None, family=None):
        import torch

        # One thread: this stage runs beside the model workers and VAD is tiny.
        torch.set_num_threads(1)
        adopt(kind, family)
        cfg = config_from_dict(config)
        self.quality = cfg.audio.resample_quality
        self.segmenter = VadSegmenter(cfg.audio.max_segment_s, cfg.audio.vad_threshold, cfg.audio.vad_pad_s)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = [prepare_row(r, self.segmenter, self.quality) for r in batch.to_pylist()]
        return table(rows, PREPARED_SCHEMA)
