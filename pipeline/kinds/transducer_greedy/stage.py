"""Decoder kind ``transducer_greedy``: batched greedy RNN-T / TDT decoding, the baseline of
"Pushing the Limits of Beam Search Decoding for Transducer-based ASR models", equal to
transformers' ``generate`` (pipeline.decoding.transducer.greedy); on CUDA by the
label-looping of "Label-Looping: Highly Efficient Decoding for Transducers" replayed as
CUDA graphs (pipeline.decoding.transducer.label_looping), with the same tokens."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..base import SegmentResult, encode_then
from ...decoding.transducer.words import best_path_words

if TYPE_CHECKING:
    from ...models.base import TransducerModel


class TransducerGreedyDecoder:
    name = "transducer_greedy"

    def __init__(self, adapter: TransducerModel, confidence: bool = False, max_symbols: int | None = None,
                 use_cuda_graphs: bool = True):
        from ...decoding.transducer.label_looping import LabelLoopingGreedy

        self.adapter = adapter
        self.confidence = confidence
        self.max_symbols = max_symbols      # tokens per frame; None: the model's
        self.greedy = LabelLoopingGreedy(adapter, max_symbols, use_cuda_graphs=use_cuda_graphs)

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio))

    def _greedy(self, enc):
        out = self.greedy(enc.states, enc.valid_frames)
        if not self.confidence:
            return out, None
        from ...confidence.features import transducer_words

        return out, [transducer_words(self.adapter, enc.states[i, :int(n)], toks, frs,
                                      best_path_words(self.adapter, toks, frs))
                     for i, (toks, frs, n) in enumerate(zip(out.tokens, out.frames, enc.valid_frames.tolist()))]

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        (out, words), t_enc, t_dec = encode_then(self.adapter, audios, self._greedy)
        results = [SegmentResult(self.adapter.decode_text(toks).strip(), self.name, len(toks), t_enc, t_dec)
                   for toks in out.tokens]
        if words is None:
            for res, toks, frs in zip(results, out.tokens, out.frames):
                res.words = best_path_words(self.adapter, toks, frs)
        for res, w in zip(results, words or []):
            res.words, res.word_features = w
        return results


def build(adapter: TransducerModel, cfg) -> TransducerGreedyDecoder:
    return TransducerGreedyDecoder(adapter, confidence=cfg.confidence.enabled,
                                   max_symbols=cfg.transducer.max_symbols,
                                   use_cuda_graphs=cfg.transducer.use_cuda_graphs)
