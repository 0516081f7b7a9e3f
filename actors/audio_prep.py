"""Decode/segment actor: manifest rows -> prepared rows (pipeline.prepare_stream: a long
recording in pieces, as they are cut), CPU only.

A Ray actor beside each model actor on its node (actors.model_worker), or called in-process.
"""
from __future__ import annotations

import pyarrow as pa

from .registrations import adopt
from ..pipeline.config import config_from_dict
from ..pipeline.device import torch_threads
from ..pipeline.prepare_stream import prepare_pieces_within
from ..pipeline.records import PREPARED_SCHEMA, table
from ..pipeline.segment import VadSegmenter
from ..pipeline.storage import use_options


class AudioPrep:
    def __init__(self, config: dict, kind=None, family=None):
        adopt(kind, family)
        cfg = config_from_dict(config)
        self.storage_options = cfg.storage.options
        self.quality = cfg.audio.resample_quality
        self.timeout_s = cfg.audio.read_timeout_s
        self.max_seconds = cfg.audio.max_seconds
        self.stream = cfg.audio.stream
        self.window_s, self.overlap_s, self.piece_s = cfg.audio.window_s, cfg.audio.window_overlap_s, cfg.audio.piece_s
        self.new_segmenter = lambda: VadSegmenter(cfg.audio.max_segment_s, cfg.audio.vad_threshold,
                                                  cfg.audio.vad_pad_s)
        with torch_threads(1):
            self.segmenter = self.new_segmenter()

    def __call__(self, batch: pa.Table) -> pa.Table:
        """The prepared rows of ``batch`` in one table (a long recording's pieces in it)."""
        parts = [t for _, t in self.tables(batch)]
        return pa.concat_tables(parts) if parts else table([], PREPARED_SCHEMA)

    def tables(self, batch: pa.Table):
        """(input rows finished, prepared table) per table, in order: the rows of
        ``batch``, a table handed on at each piece of a long recording
        (pipeline.prepare_stream), so its segments reach the model as they are cut. Each
        row is read in its own reader thread, whose VAD runs on one thread
        (pipeline.segment), whatever the caller's count."""
        items = batch.to_pylist()
        # The options hold for the protocols of the audio the job reads (a no-op once set;
        # workers of a cluster started before the job have not inherited them).
        use_options(self.storage_options, [r["audio"] for r in items if r.get("audio")])
        rows, finished = [], 0
        for r in items:
            pieces = prepare_pieces_within(r, self.segmenter, self.quality, self.timeout_s, self.max_seconds,
                                           self.stream, self.window_s, self.overlap_s, self.piece_s)
            last = None
            while True:
                piece = next(pieces, None)
                if piece is None:
                    break
                last = piece
                rows.append(piece)
                if piece["pieces"] is None:     # a long recording's piece: to the model now
                    yield finished, table(rows, PREPARED_SCHEMA)
                    rows, finished = [], 0
                else:
                    finished += 1
            if last is not None and last.get("reader_alive"):
                # A timed-out call still blocked in a read may reach the VAD later: the next
                # rows get their own. (One that stopped at its deadline never does.)
                self.segmenter = self.new_segmenter()
        if rows:
            yield finished, table(rows, PREPARED_SCHEMA)
