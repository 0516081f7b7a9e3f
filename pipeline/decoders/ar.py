"""Decoder kind ``ar``: full autoregressive greedy decoding of each segment, the baseline
every speculative decoder must reproduce or beat (pipeline.decoding.ar_greedy)."""
from __future__ import annotations

import numpy as np

from pipeline.decoders.base import SegmentResult, encode_then
from pipeline.decoding.ar_greedy import greedy_decode


class ARSegmentDecoder:
    name = "ar"

    def __init__(self, adapter, max_new_tokens: int = 224):
        self.adapter = adapter
        self.max_new_tokens = max_new_tokens

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio))

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        tokens, t_enc, t_dec = encode_then(
            self.adapter, audios,
            lambda enc: greedy_decode(self.adapter, enc.states, max_new_tokens=self.max_new_tokens))
        return [SegmentResult(self.adapter.text(t), "ar", len(t), t_enc, t_dec, generated=len(t))
                for t in tokens]


def build(adapter, cfg) -> ARSegmentDecoder:
    return ARSegmentDecoder(adapter, cfg.decoder.max_new_tokens)
