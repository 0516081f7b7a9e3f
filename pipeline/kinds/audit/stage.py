"""Decoder kind ``audit``: no model, no transcript. Every segment the prepare stage cut is
reported with an empty text and stage ``audit``, so a job under this kind reads, decodes
and segments every recording exactly as a transcription job would and writes one row per
recording with its `duration_s` or its `error`: the corpus audit `shardscribe validate`
runs before a long job."""
from __future__ import annotations

import numpy as np

from . import STAGE
from ..base import SegmentResult


class AuditSegments:
    name = "audit"

    def __init__(self, adapter, cfg):
        self.adapter = adapter   # None: the kind needs no model capability, so none is loaded

    def segment_cost(self, audio: np.ndarray) -> int:
        return 1

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        return [SegmentResult("", STAGE) for _ in audios]


def build(adapter, cfg) -> AuditSegments:
    return AuditSegments(adapter, cfg)
