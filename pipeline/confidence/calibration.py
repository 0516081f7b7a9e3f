"""A fitted confidence calibration as plain JSON, applied with numpy (no scikit-learn at run
time; `shardscribe calibrate` fits it with scikit-learn).

Two levels, each a map from features to P(correct):
- ``word``, keyed ``"<decoder kind>:<segment stage>"`` (stages differ in the evidence they
  have: an SSD ``ctc_gate`` segment has no decoder-text agreement to weigh);
- ``utterance``, keyed by decoder kind, over statistics of the calibrated word confidences
  (``utterance_features``): the probability that a segment (or a row) has no error.

A map is a logistic regression over standardised features (a missing feature is the
training mean, i.e. 0 after standardising) followed by isotonic regression of its output
(the identity on [0, 1] where fitting found that the step does not pay),
stored as the isotonic fit's thresholds and read with linear interpolation, clipped at the
ends, which is how scikit-learn's ``IsotonicRegression.predict`` reads them
(``out_of_bounds="clip"``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "shardscribe-confidence-calibration/1"
EMBEDDED = "embedded"
EMBEDDED_PATH = Path(__file__).resolve().parent.parent / "assets/confidence/calibration.json"
UTTERANCE_FEATURES = ("conf_mean", "conf_min", "conf_logprod", "conf_low_share", "log_words")


def utterance_features(word_confidences: list[float]) -> dict[str, float]:
    """Statistics of a segment's (or a row's) calibrated word confidences."""
    c = np.asarray([x for x in word_confidences if x is not None], dtype=np.float64)
    if c.size == 0:
        return {"conf_mean": math.nan, "conf_min": math.nan, "conf_logprod": 0.0, "conf_low_share": math.nan,
                "log_words": 0.0}
    return {"conf_mean": float(c.mean()), "conf_min": float(c.min()),
            "conf_logprod": float(np.log(np.clip(c, 1e-6, 1.0)).sum()), "conf_low_share": float((c < 0.5).mean()),
            "log_words": math.log1p(c.size)}


@dataclass
class CalibrationMap:
    features: list[str]
    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    iso_x: np.ndarray
    iso_y: np.ndarray

    @classmethod
    def from_dict(cls, d: dict) -> "CalibrationMap":
        return cls(list(d["features"]), np.asarray(d["mean"], float), np.asarray(d["scale"], float),
                   np.asarray(d["coef"], float), float(d["intercept"]), np.asarray(d["isotonic"]["x"], float),
                   np.asarray(d["isotonic"]["y"], float))

    def to_dict(self) -> dict:
        return {"features": self.features, "mean": self.mean.tolist(), "scale": self.scale.tolist(),
                "coef": self.coef.tolist(), "intercept": self.intercept,
                "isotonic": {"x": self.iso_x.tolist(), "y": self.iso_y.tolist()}}

    def matrix(self, rows: list[dict]) -> np.ndarray:
        """Standardised feature matrix [N, F] of feature dicts (missing / NaN -> 0)."""
        x = np.array([[r.get(f, math.nan) for f in self.features] for r in rows], dtype=np.float64).reshape(-1, len(self.features))
        z = (x - self.mean) / self.scale
        return np.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0)

    def logistic(self, z: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-(z @ self.coef + self.intercept)))

    def __call__(self, rows: list[dict]) -> np.ndarray:
        if not rows:
            return np.zeros(0)
        return np.interp(self.logistic(self.matrix(rows)), self.iso_x, self.iso_y)


@dataclass
class Calibration:
    model: dict
    word: dict[str, CalibrationMap]
    utterance: dict[str, CalibrationMap]
    notes: dict

    @classmethod
    def from_dict(cls, d: dict) -> "Calibration":
        if d.get("format") != FORMAT:
            raise ValueError(f"not a confidence calibration (format {d.get('format')!r}, expected {FORMAT})")
        return cls(dict(d.get("model") or {}), {k: CalibrationMap.from_dict(v) for k, v in d["word"].items()},
                   {k: CalibrationMap.from_dict(v) for k, v in d["utterance"].items()}, dict(d.get("notes") or {}))

    def to_dict(self) -> dict:
        return {"format": FORMAT, "model": self.model, "notes": self.notes,
                "word": {k: v.to_dict() for k, v in sorted(self.word.items())},
                "utterance": {k: v.to_dict() for k, v in sorted(self.utterance.items())}}

    @classmethod
    def load(cls, path: str | Path) -> "Calibration":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"confidence.calibration: cannot read {path}: {exc}") from None
        return cls.from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def model_identity(model_cfg) -> dict:
    """What a calibration was fitted for: the model's family, source and CTC head."""
    return {"family": model_cfg.family, "source": model_cfg.source, "ctc_head": model_cfg.ctc_head}


def load_for(cfg) -> Calibration | None:
    """The calibration ``cfg.confidence.calibration`` names: "embedded" is the shipped one,
    which applies only to the embedded model it was fitted on (None for another model: an
    uncalibrated confidence is better than one fitted on someone else's errors); a path is
    taken as given; null: none."""
    name = cfg.confidence.calibration
    if name is None:
        return None
    if name == EMBEDDED:
        if not EMBEDDED_PATH.exists():
            return None
        cal = Calibration.load(EMBEDDED_PATH)
        ident = model_identity(cfg.model)
        # The shipped maps serve the embedded model with its embedded CTC head or without
        # one (the attention decoder's features do not read the head).
        same = (cal.model.get("family") == ident["family"] and cal.model.get("source") == ident["source"]
                and ident["ctc_head"] in (None, cal.model.get("ctc_head")))
        return cal if same else None
    return Calibration.load(name)
