"""Decoder kind ``ctc_greedy``: the greedy CTC draft alone (encoder + CTC output, no
decoder pass), the first step of "Self-Speculative Decoding for LLM-based ASR with CTC
Encoder Drafts" (eq. 2) used as a transcript. With ``decoder.pack_windows`` short clips
share encoder windows (pipeline.packing)."""
from __future__ import annotations

import numpy as np

from pipeline.decoders.base import SegmentResult, encode_then


class CTCGreedySegmentDecoder:
    name = "ctc_greedy"

    def __init__(self, adapter, pack: bool = False):
        self.adapter = adapter
        self.pack = pack

    def segment_cost(self, audio: np.ndarray) -> int:
        return self.adapter.segment_cost(len(audio), packed=self.pack)

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        draft, t_enc, t_dec = encode_then(self.adapter, audios, self.adapter.ctc_draft, packed=self.pack)
        return [SegmentResult(t.strip(), "ctc_greedy", len(t), t_enc, t_dec, max_entropy=float(h))
                for t, h in zip(draft.texts, draft.max_entropy.tolist())]


def build(adapter, cfg) -> CTCGreedySegmentDecoder:
    return CTCGreedySegmentDecoder(adapter, pack=cfg.decoder.pack_windows)
