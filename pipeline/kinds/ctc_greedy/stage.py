"""Decoder kind ``ctc_greedy``: the greedy CTC draft alone (encoder + CTC output, no
decoder pass), the first step of "Self-Speculative Decoding for LLM-based ASR with CTC
Encoder Drafts" (eq. 2) used as a transcript. With ``decoder.pack_windows`` short clips
share encoder windows (pipeline.packing). Each segment's words are timed from the greedy
path (pipeline.decoding.ctc_words) where the model family names its CTC vocabulary."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..base import SegmentResult, encode_then

if TYPE_CHECKING:
    from ...models.base import CTCModel


class CTCGreedySegmentDecoder:
    name = "ctc_greedy"

    def __init__(self, adapter: CTCModel, pack: bool = False, vocabulary=None, confidence: bool = False):
        self.adapter = adapter
        self.pack = pack
        self.vocabulary = vocabulary
        self.confidence = confidence
        self.stride_s = adapter.frame_stride_s

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio), packed=self.pack)

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        draft, t_enc, t_dec = encode_then(self.adapter, audios, self.adapter.ctc_draft, packed=self.pack)
        paths = draft.log_probs.argmax(-1)
        words = self.words(paths, draft.lengths)
        out = [SegmentResult(t.strip(), "ctc_greedy", len(t), t_enc, t_dec, max_entropy=float(h), words=w)
               for t, h, w in zip(draft.texts, draft.max_entropy.tolist(), words)]
        if self.confidence and self.vocabulary is not None:
            from ...confidence.features import ctc_words

            lp = draft.log_probs.float().cpu()
            for i, (res, n) in enumerate(zip(out, draft.lengths.tolist())):
                res.words, res.word_features = ctc_words(lp[i, :n], paths[i, :n].tolist(), self.vocabulary.blank,
                                                         self.vocabulary, self.stride_s)
        return out

    def words(self, paths, lengths) -> list[list[dict] | None]:
        """Word timings of each row's frame path [B, T] over its valid frames."""
        from ...decoding.ctc_words import words_from_path

        if self.vocabulary is None or self.stride_s is None:
            return [None] * len(lengths)
        return [words_from_path(p[:n], self.vocabulary.blank, self.vocabulary, self.stride_s)
                for p, n in zip(paths.tolist(), lengths.tolist())]


def word_vocabulary(cfg):
    """The CTC vocabulary that times words, where the model family names one."""
    from ...models import model_family
    from ...models.base import BEAM_VOCABULARY

    family = model_family(cfg.model.family)
    if family.vocabulary is None or BEAM_VOCABULARY not in family.capabilities(cfg.model):
        return None
    return family.ctc_vocabulary(cfg.model)


def build(adapter: CTCModel, cfg) -> CTCGreedySegmentDecoder:
    return CTCGreedySegmentDecoder(adapter, pack=cfg.decoder.pack_windows, vocabulary=word_vocabulary(cfg),
                                   confidence=cfg.confidence.enabled)
