"""Decoder kind ``transducer_beam``: ALSD++ / AES++ of "Pushing the Limits of Beam Search
Decoding for Transducer-based ASR models" as two stages, like ``ctc_beam``. The model pool
encodes and hands each segment's projected encoder frames over as CPU arrays
(``TransducerPending``); a separate pool runs the batched beam search
(pipeline.decoding.transducer.search) with its own predictor and joint (the encoder is
dropped there), the n-gram LM (NGPU-LM from ``build-lm --tokenizer MODEL_DIR``) and
per-recording phrase boosting over the model's non-blank tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..base import PENDING, PendingState, SegmentResult, encode_then
from ..ctc_beam.stages import BEAM, load_lm
from ...decoding.transducer.words import best_path_words

if TYPE_CHECKING:
    from ...models.base import TransducerModel


@dataclass
class TransducerPending(PendingState):
    frames: np.ndarray              # [T_valid, H] float32 projected encoder frames


class TransducerFramesDecoder:
    """First pool: the encoder pass; every segment leaves pending with its frames."""

    name = "transducer_beam"

    def __init__(self, adapter: TransducerModel):
        self.adapter = adapter

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio))

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        enc, t_enc, t_dec = encode_then(self.adapter, audios, lambda e: e)
        states = enc.states.float().cpu().numpy()
        return [SegmentResult("", PENDING, 0, t_enc, t_dec, pending=TransducerPending(states[i, :int(n)].copy()))
                for i, n in enumerate(enc.valid_frames.tolist())]


class TransducerBeamFinisher:
    """Second pool: batched ALSD++ / AES++ over pending encoder frames."""

    name = "transducer_beam"
    pending_type = TransducerPending

    def __init__(self, cfg, adapter: TransducerModel):
        from ...decoding.transducer.search import TransducerBeamSearch
        from ...lm.boosting import KeyPhrases

        beam, tcfg = cfg.beam, cfg.transducer
        self.cfg, self.adapter = beam, adapter
        self.confidence = cfg.confidence.enabled
        self.vocab = adapter.vocabulary()
        lm = load_lm(beam.lm_path, adapter.device) if beam.lm_path else None
        self.phrases = KeyPhrases(beam, self.vocab)
        self.search = TransducerBeamSearch(
            adapter, beam.size, algorithm=tcfg.algorithm, lm=lm, alpha_lm=beam.alpha_lm if lm is not None else 0.0,
            alpha_boost=beam.alpha_boost, blank_scoring=tcfg.blank_scoring, pruning=tcfg.pruning,
            max_symbols=tcfg.max_symbols, expansion_gamma=tcfg.expansion_gamma,
            use_cuda_graphs=tcfg.use_cuda_graphs)

    def cost(self, result: SegmentResult) -> int:
        return int(result.pending.frames.shape[0]) * self.cfg.size

    def _boost(self, results):
        return self.phrases.tree([r.key_phrases for r in results], self.adapter.device)

    def finish(self, results: list[SegmentResult]) -> float:
        t0 = time.perf_counter()
        arrays = [r.pending.frames for r in results]
        lengths = torch.tensor([a.shape[0] for a in arrays])
        frames = torch.zeros((len(arrays), max(int(lengths.max()), 1), arrays[0].shape[1]))
        for i, a in enumerate(arrays):
            frames[i, :a.shape[0]] = torch.tensor(a)   # arrow buffers are read-only
        out = self.search(frames.to(self.adapter.device, self.adapter.dtype), lengths.to(self.adapter.device),
                          boost=self._boost(results))
        for b, (r, toks) in enumerate(zip(results, out.tokens)):
            r.text, r.stage, r.tokens = self.adapter.decode_text(toks).strip(), BEAM, len(toks)
            if self.confidence:
                from ...confidence.features import transducer_words

                n = int(lengths[b])
                r.words, r.word_features = transducer_words(
                    self.adapter, frames[b, :n].to(self.adapter.device, self.adapter.dtype), toks, out.frames[b],
                    best_path_words(self.adapter, toks, out.frames[b]))
            else:
                r.words = best_path_words(self.adapter, toks, out.frames[b])
            r.pending = None
        return time.perf_counter() - t0


def build_frames(adapter: TransducerModel, cfg) -> TransducerFramesDecoder:
    return TransducerFramesDecoder(adapter)


def build_search(cfg, first_stage: TransducerFramesDecoder | None = None) -> TransducerBeamFinisher:
    """In the model's process: its adapter; elsewhere a model of its own, without its
    encoder (the search needs the predictor and the joint only)."""
    if first_stage is not None:
        return TransducerBeamFinisher(cfg, first_stage.adapter)
    from ...models import load_model

    adapter = load_model(cfg.model)
    adapter.drop_encoder()
    return TransducerBeamFinisher(cfg, adapter)
