"""Decode/segment actor: manifest rows -> prepared rows (pipeline.prepare), CPU only.

A Ray actor beside each model actor on its node (actors.model_worker), or called in-process.
"""
from __future__ import annotations

import pyarrow as pa

from actors.registrations import adopt
from pipeline.config import config_from_dict
from pipeline.device import torch_threads
from pipeline.prepare import prepare_row_within
from pipeline.records import PREPARED_SCHEMA, table
from pipeline.segment import VadSegmenter
from pipeline.storage import use_options


class AudioPrep:
    def __init__(self, config: dict, kind=None, family=None):
        adopt(kind, family)
        cfg = config_from_dict(config)
        self.storage_options = cfg.storage.options
        self.quality = cfg.audio.resample_quality
        self.timeout_s = cfg.audio.read_timeout_s
        self.max_seconds = cfg.audio.max_seconds
        self.new_segmenter = lambda: VadSegmenter(cfg.audio.max_segment_s, cfg.audio.vad_threshold,
                                                  cfg.audio.vad_pad_s)
        with torch_threads(1):
            self.segmenter = self.new_segmenter()

    def __call__(self, batch: pa.Table, threads: int | None = 1) -> pa.Table:
        # One thread, for this stage only: it runs beside the model workers (in the same
        # process with the in-process runner) and the VAD is tiny. threads=None leaves
        # torch's count alone: the in-process runner prepares in a thread beside the model
        # stage, and the count is process-wide (setting it there would set the model's).
        with torch_threads(threads):
            return self._prepare(batch)

    def _prepare(self, batch: pa.Table) -> pa.Table:
        rows = []
        items = batch.to_pylist()
        # The options hold for the protocols of the audio the job reads (a no-op once set;
        # workers of a cluster started before the job have not inherited them).
        use_options(self.storage_options, [r["audio"] for r in items if r.get("audio")])
        for r in items:
            rows.append(prepare_row_within(r, self.segmenter, self.quality, self.timeout_s, self.max_seconds))
            if rows[-1].get("reader_alive"):
                # A timed-out call still blocked in a read may reach the VAD later: the next
                # rows get their own. (One that stopped at its deadline never does.)
                self.segmenter = self.new_segmenter()
        return table(rows, PREPARED_SCHEMA)
