"""Decoder kind ``transducer_greedy``: batched greedy RNN-T / TDT decoding, the baseline of
"Pushing the Limits of Beam Search Decoding for Transducer-based ASR models", equal to
transformers' ``generate`` (pipeline.decoding.transducer.greedy)."""
from __future__ import annotations

import numpy as np

from pipeline.decoders.base import SegmentResult, encode_then


class TransducerGreedyDecoder:
    name = "transducer_greedy"

    def __init__(self, adapter):
        self.adapter = adapter

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio))

    def _greedy(self, enc):
        from pipeline.decoding.transducer.greedy import transducer_greedy

        return transducer_greedy(self.adapter, enc.states, enc.valid_frames)

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        out, t_enc, t_dec = encode_then(self.adapter, audios, self._greedy)
        return [SegmentResult(self.adapter.decode_text(toks).strip(), self.name, len(toks), t_enc, t_dec)
                for toks in out.tokens]


def build(adapter, cfg) -> TransducerGreedyDecoder:
    return TransducerGreedyDecoder(adapter)
