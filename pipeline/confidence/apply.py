"""Fills ``confidence`` of the words, segments and rows of a job's output.

A word's confidence is the calibrated P(correct) of its features
(pipeline.confidence.calibration, keyed by decoder kind and segment stage, or by the key the
kind names for a stage it has no map of: ``DecoderKind.calibration_fallbacks``); a segment's
and a row's are the utterance map's P(no error) over their words' confidences. Without a
calibration for the kind and stage, a word's confidence is its mean token probability
(faster-whisper's word probability, uncalibrated) and a segment's or row's the mean of
its words'; a word without features (a decoder with no token-to-word map) gets none.
"""
from __future__ import annotations

import math

from .calibration import Calibration, load_for, utterance_features


class ConfidenceScorer:
    """Scores one decoder kind's words; ``kind`` is its registry entry (its ``name`` keys the
    calibration, its ``calibration_fallbacks`` name the maps of stages it has none of)."""

    def __init__(self, calibration: Calibration | None, kind):
        self.calibration = calibration
        self.kind = kind.name
        # stage -> the calibration key a stage without its own map reads (the kind says which:
        # a segment it decoded as another kind would carries that kind's evidence)
        self.fallbacks = dict(kind.calibration_fallbacks)

    @classmethod
    def from_config(cls, cfg, kind) -> "ConfidenceScorer | None":
        if not cfg.confidence.enabled:
            return None
        return cls(load_for(cfg), kind)

    def words(self, stage: str, features: list[dict]) -> list[float | None]:
        cal = None
        if self.calibration:
            cal = self.calibration.word.get(f"{self.kind}:{stage}")
            if cal is None and stage in self.fallbacks:
                cal = self.calibration.word.get(self.fallbacks[stage])
        if cal is not None:
            return [float(x) for x in cal(features)]
        return [_finite(f.get("prob_mean")) for f in features]

    def utterance(self, word_confidences: list[float | None]) -> float | None:
        known = [c for c in word_confidences if c is not None]
        if not known:
            return None
        cal = self.calibration.utterance.get(self.kind) if self.calibration else None
        if cal is None:
            return sum(known) / len(known)
        return float(cal([utterance_features(known)])[0])

    def fill_result(self, res) -> None:
        """A final SegmentResult: its words' confidences, then its own."""
        feats = getattr(res, "word_features", None)
        if res.error or res.words is None or feats is None or len(feats) != len(res.words):
            res.confidence = None
            return
        for w, c in zip(res.words, self.words(res.stage, feats)):
            w["confidence"] = c
        res.confidence = self.utterance([w["confidence"] for w in res.words]) if res.words else None

    def fill_row(self, row: dict) -> dict:
        """A finished output row: the utterance map over all its words."""
        if row.get("error") or not row.get("segments"):
            row["confidence"] = None
            return row
        confs = [w.get("confidence") for sg in row["segments"] for w in (sg.get("words") or [])]
        if not confs and all(sg.get("confidence") is None for sg in row["segments"]):
            row["confidence"] = None
            return row
        row["confidence"] = self.utterance(confs)
        return row


def _finite(x) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None
