"""Scoring confidence against references: labels and the metrics of "Fast Entropy-Based
Methods of Word-Level Confidence Estimation for End-to-End Automatic Speech Recognition"
(AUC-ROC and AUC-PR for detecting wrong words, normalised cross-entropy, expected
calibration error), and the ECE a perfectly calibrated confidence would show on the same
items: consistency resampling ("Increasing the Reliability of Reliability Diagrams",
Bröcker and Smith 2007), labels drawn as Bernoulli(confidence) many times. A binned ECE is
biased upwards on a few hundred items (each bin's accuracy is a noisy estimate), so a
measured ECE is read against that reference.

A hypothesis word is correct when every token of its normalised form (the normaliser the
project's WER uses, pipeline.metrics.normalize) is aligned as a match to the normalised
reference (jiwer's alignment); a word that normalises to nothing has no label. An utterance
is correct when its normalised text equals the normalised reference.
"""
from __future__ import annotations

import math

import numpy as np


def word_labels(words: list[str], reference: str) -> list[bool | None]:
    """Correctness of each hypothesis word against ``reference`` (None: no label)."""
    import jiwer

    from ..metrics import normalize

    pieces = [normalize(w).split() for w in words]
    hyp = [p for ps in pieces for p in ps]
    ref = normalize(reference).split()
    ok = [False] * len(hyp)
    if hyp and ref:
        out = jiwer.process_words(" ".join(ref), " ".join(hyp))
        for chunk in out.alignments[0]:
            if chunk.type == "equal":
                for j in range(chunk.hyp_start_idx, chunk.hyp_end_idx):
                    ok[j] = True
    labels, k = [], 0
    for ps in pieces:
        labels.append(all(ok[k:k + len(ps)]) if ps else None)
        k += len(ps)
    return labels


def utterance_correct(text: str, reference: str) -> bool:
    from ..metrics import normalize

    return normalize(text).split() == normalize(reference).split()


def _binned_ece(c: np.ndarray, y: np.ndarray, bins: int) -> np.ndarray:
    """ECE of each row of labels ``y`` [R, N] against confidences ``c`` [N]."""
    which = np.minimum((c * bins).astype(np.int64), bins - 1)
    total = np.zeros(y.shape[0])
    for b in range(bins):
        m = which == b
        if m.any():
            total += m.mean() * np.abs(y[:, m].mean(axis=1) - c[m].mean())
    return total


def ece(confidence, correct, bins: int = 10) -> float:
    """Expected calibration error: sum over equal-width confidence bins of the bin's share
    times |accuracy - mean confidence| in it (a confidence of 1.0 falls in the last bin)."""
    c = np.asarray(confidence, dtype=np.float64)
    y = np.asarray(correct, dtype=np.float64)
    return float(_binned_ece(c, y[None, :], bins)[0])


def ece_if_calibrated(confidence, bins: int = 10, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Mean and 95th percentile of :func:`ece` over ``draws`` label sets drawn as
    Bernoulli(confidence): the ECE of a confidence that is exactly P(correct), on these
    items (consistency resampling)."""
    c = np.asarray(confidence, dtype=np.float64)
    if not len(c):
        return math.nan, math.nan
    y = np.random.default_rng(seed).random((draws, len(c))) < c     # [draws, n]
    total = _binned_ece(c, y, bins)
    return float(total.mean()), float(np.quantile(total, 0.95))


def nce(confidence, correct, eps: float = 1e-7) -> float:
    """Normalised cross-entropy: (H(C) - H(C | confidence)) / H(C), H(C) the entropy of the
    labels at their base rate; 1 is perfect, 0 no better than the base rate, negative worse.
    NaN when every label is the same."""
    c = np.clip(np.asarray(confidence, dtype=np.float64), eps, 1.0 - eps)
    y = np.asarray(correct, dtype=bool)
    p = y.mean()
    if p in (0.0, 1.0):
        return math.nan
    h = -(y.sum() * math.log(p) + (~y).sum() * math.log(1.0 - p))
    h_c = -(np.log(c[y]).sum() + np.log(1.0 - c[~y]).sum())
    return float((h - h_c) / h)


def scores(confidence, correct) -> dict:
    """AUC-ROC and AUC-PR of detecting wrong items (scikit-learn), NCE, ECE, and the mean
    and 95th percentile of the ECE a calibrated confidence would show on these items."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    c = np.asarray(confidence, dtype=np.float64)
    wrong = ~np.asarray(correct, dtype=bool)
    both = 0 < wrong.sum() < len(wrong)
    return {"n": int(len(c)), "error_rate": float(wrong.mean()) if len(c) else math.nan,
            "auc_roc": float(roc_auc_score(wrong, -c)) if both else math.nan,
            "auc_pr": float(average_precision_score(wrong, -c)) if both else math.nan,
            "nce": nce(c, ~wrong), "ece": ece(c, ~wrong),
            **dict(zip(("ece_if_calibrated", "ece_if_calibrated_p95"), ece_if_calibrated(c)))}
