"""Decoder kind ``ar``: full autoregressive greedy decoding of each segment, the baseline
every speculative decoder must reproduce or beat (pipeline.decoding.ar_greedy); with
``decoder.token_map``, drafted from a token map ("Model-free Speculative Decoding for
Transformer-based ASR with Token Map Drafting"), with the same output."""
from __future__ import annotations

import numpy as np

from pipeline.decoders.base import SegmentResult, encode_then
from pipeline.decoding.ar_greedy import MapDrafting, greedy_decode


def map_drafting(adapter, cfg) -> MapDrafting | None:
    """The token-map drafting ``cfg`` asks for (None where decoder.token_map is null), its
    map checked against the adapter's vocabulary; one policy per decoder, kept across
    batches."""
    if cfg.decoder.token_map is None:
        return None
    from pipeline.decoding.token_map import TokenMap
    from pipeline.draft_policy import DraftPolicy

    token_map = TokenMap.load(cfg.decoder.token_map)
    if token_map.max_token >= adapter.vocab_size:
        raise ValueError(f"decoder.token_map: {cfg.decoder.token_map} holds token {token_map.max_token}, beyond the "
                         f"model's vocabulary ({adapter.vocab_size}): built with another tokenizer")
    tm = cfg.token_map
    return MapDrafting(token_map, tm.candidates, tm.max_draft, DraftPolicy() if tm.adaptive else None,
                       map_first=not tm.lookahead_first)


class ARSegmentDecoder:
    name = "ar"

    def __init__(self, adapter, max_new_tokens: int = 224, drafting: MapDrafting | None = None,
                 confidence: bool = False):
        self.adapter = adapter
        self.max_new_tokens = max_new_tokens
        self.drafting = drafting
        self.confidence = confidence

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio))

    def _decode(self, enc):
        tokens = greedy_decode(self.adapter, enc.states, max_new_tokens=self.max_new_tokens,
                               map_drafting=self.drafting)
        if not self.confidence:
            return tokens, None
        from pipeline.confidence.features import decoder_words
        from pipeline.models.base import CTC

        # A model with a CTC head offers a second view for free: agreement with its draft.
        drafts = self.adapter.ctc_draft(enc).texts if CTC in self.adapter.capabilities else None
        return tokens, decoder_words(self.adapter, enc.states, tokens, drafts)

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        (tokens, words), t_enc, t_dec = encode_then(self.adapter, audios, self._decode)
        out = [SegmentResult(self.adapter.text(t), "ar", len(t), t_enc, t_dec, generated=len(t)) for t in tokens]
        for res, w in zip(out, words or []):
            res.words, res.word_features = w
        return out


def build(adapter, cfg) -> ARSegmentDecoder:
    return ARSegmentDecoder(adapter, cfg.decoder.max_new_tokens, map_drafting(adapter, cfg),
                            confidence=cfg.confidence.enabled)
