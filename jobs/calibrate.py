"""Fit the confidence calibration: `shardscribe calibrate --input MANIFEST --config X --output FILE`.

MANIFEST holds recordings with references (held out from anything the model or its
thresholds were tuned on). The job decodes them in-process with the config's decoder kind,
labels every word against the reference (pipeline.confidence.evaluation) and fits, per
decoder kind and segment stage, a logistic regression over the word's confidence features
followed by isotonic regression of its output where cross-validation says it pays
(scikit-learn), and an utterance map over
statistics of the calibrated word confidences against "the recording has no error". FILE is
JSON (pipeline.confidence.calibration) that a job reads with `--set
confidence.calibration=FILE`, without scikit-learn. `--merge` adds to (or replaces keys of)
an existing FILE, so one file can serve several decoder kinds.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

COMMAND = "calibrate"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="JSONL manifest (or any source) with references")
    parser.add_argument("--config", default=None, help="conf/<name>.yaml name or path (default: default)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key")
    parser.add_argument("--output", required=True, help="calibration JSON to write")
    parser.add_argument("--limit", type=int, default=0, help="use only the first N recordings")
    parser.add_argument("--merge", action="store_true", help="keep FILE's maps for other keys")


@dataclass
class Recording:
    reference: str
    segments: list = field(default_factory=list)     # final SegmentResults, in order

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.segments if s.text)

    def words(self) -> list[tuple[str, dict, dict]]:
        """(stage, word, features) of every word of every segment."""
        return [(s.stage, w, f) for s in self.segments if s.words and s.word_features
                for w, f in zip(s.words, s.word_features)]


def decode_recordings(cfg, recordings: list[list]) -> list[list]:
    """Every recording's segments (16-kHz arrays) decoded in-process by the config's decoder
    kind, both stages, with confidence features: per recording its final SegmentResults."""
    import numpy as np

    from ..pipeline.batching import pack_by_budget
    from ..pipeline.kinds import decoder_kind
    from ..pipeline.kinds.base import PENDING
    from ..pipeline.models import load_model
    from ..pipeline.segment_runner import decode_segments

    kind = decoder_kind(cfg.decoder.kind)
    adapter = load_model(cfg.model) if kind.needs else None
    first = kind.build_first_stage(adapter, cfg)
    second = kind.build_second_stage(cfg, first) if kind.two_stage else None
    flat = [(r, np.asarray(a, dtype=np.float32)) for r, segs in enumerate(recordings) for a in segs]
    results = decode_segments(first, [a for _, a in flat], cfg.batching.max_tokens) if flat else []
    pending = [res for res in results if res.stage == PENDING]
    if pending:
        for batch in pack_by_budget([second.cost(r) for r in pending], cfg.batching.max_tokens):
            second.finish([pending[i] for i in batch])
    out: list[list] = [[] for _ in recordings]
    for (r, _), res in zip(flat, results):
        out[r].append(res)
    return out


def collect(cfg, manifest: str, limit: int = 0) -> list[Recording]:
    from ..pipeline.heldout import load_recordings

    recordings, refs = load_recordings(manifest, limit, cfg)
    return [Recording(ref, segs) for ref, segs in zip(refs, decode_recordings(cfg, recordings))]


def labelled_words(recs: list[Recording]) -> list[tuple[str, dict, bool]]:
    """(stage, features, correct) of every labelled word."""
    from ..pipeline.confidence.evaluation import word_labels

    out = []
    for rec in recs:
        words = rec.words()
        labels = word_labels([w["word"] for _, w, _ in words], rec.reference) if rec.reference else []
        out += [(stage, feats, y) for (stage, _, feats), y in zip(words, labels) if y is not None]
    return out


def fit_map(rows: list[dict], labels: list[bool], features: list[str] | None = None,
            isotonic: bool | None = None, folds: int = 5):
    """A CalibrationMap: standardised features -> logistic regression -> isotonic, fitted
    with scikit-learn; a constant map at the base rate where one class is missing.

    ``isotonic`` None: keep the isotonic step only where it lowers the Brier score of
    ``folds``-fold cross-validation on these rows (contiguous folds, so a recording's words
    stay together). Isotonic regression is a step function fitted to the labels; on a few
    hundred items with few of one class its end steps are 0 or 1, a claim of certainty
    that held-out rows break, where the logistic output alone is smoother."""
    import numpy as np

    from ..pipeline.confidence.calibration import CalibrationMap

    names = features or sorted({k for r in rows for k, v in r.items() if v is not None and math.isfinite(v)})
    x = np.array([[r.get(f, math.nan) for f in names] for r in rows], dtype=np.float64).reshape(-1, len(names))
    y = np.asarray(labels, dtype=np.int64)
    with np.errstate(all="ignore"):
        mean = np.nan_to_num(np.nanmean(x, 0), nan=0.0) if len(x) else np.zeros(len(names))
        scale = np.nan_to_num(np.nanstd(x, 0), nan=1.0) if len(x) else np.ones(len(names))
    scale[scale < 1e-9] = 1.0
    cmap = CalibrationMap(names, mean, scale, np.zeros(len(names)), 0.0, np.array([0.0, 1.0]), np.array([0.5, 0.5]))
    rate = float(y.mean()) if len(y) else 0.5
    if len(set(y.tolist())) < 2:
        cmap.intercept = math.log(max(rate, 1e-6) / max(1 - rate, 1e-6))
        cmap.iso_y = np.array([rate, rate])
        return cmap
    z = cmap.matrix(rows)
    if isotonic is None:
        isotonic = _isotonic_pays(cmap, z, y, folds)
    _fit_logistic_isotonic(cmap, z, y, isotonic)
    return cmap


def _fit_logistic_isotonic(cmap, z, y, isotonic: bool) -> None:
    """Fit ``cmap``'s logistic regression and, with ``isotonic``, the isotonic step on its
    output (else the identity on [0, 1]) to standardised features ``z`` and labels ``y``."""
    import numpy as np
    from sklearn.isotonic import IsotonicRegression
    from sklearn.linear_model import LogisticRegression

    lr = LogisticRegression(C=1.0, max_iter=2000).fit(z, y)
    cmap.coef, cmap.intercept = lr.coef_[0].astype(np.float64), float(lr.intercept_[0])
    cmap.iso_x, cmap.iso_y = np.array([0.0, 1.0]), np.array([0.0, 1.0])
    if isotonic:
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(cmap.logistic(z), y)
        cmap.iso_x, cmap.iso_y = np.asarray(iso.X_thresholds_, float), np.asarray(iso.y_thresholds_, float)


def _isotonic_pays(cmap, z, y, folds: int) -> bool:
    """Whether logistic + isotonic beats the logistic alone in cross-validated Brier score,
    each fold's map read as a job reads it."""
    import dataclasses

    import numpy as np

    n = len(y)
    fold = np.arange(n) * folds // n
    err = {True: 0.0, False: 0.0}
    for f in range(folds):
        train, held = fold != f, fold == f
        if len(set(y[train].tolist())) < 2 or not held.any():
            continue
        for iso in err:
            m = dataclasses.replace(cmap)
            _fit_logistic_isotonic(m, z[train], y[train], iso)
            p = np.interp(m.logistic(z[held]), m.iso_x, m.iso_y)
            err[iso] += float(((p - y[held]) ** 2).sum())
    return err[True] < err[False]


def fit_calibration(cfg, recs: list[Recording], notes: dict | None = None):
    """The Calibration of ``cfg``'s decoder kind fitted on ``recs``."""
    from ..pipeline.confidence.apply import ConfidenceScorer
    from ..pipeline.kinds import decoder_kind
    from ..pipeline.confidence.calibration import Calibration, model_identity, utterance_features
    from ..pipeline.confidence.evaluation import utterance_correct

    kind = cfg.decoder.kind
    words = labelled_words(recs)
    cal = Calibration(model_identity(cfg.model), {}, {}, dict(notes or {}))
    for stage in sorted({s for s, _, _ in words}):
        group = [(f, y) for s, f, y in words if s == stage]
        cal.word[f"{kind}:{stage}"] = fit_map([f for f, _ in group], [y for _, y in group])
    scorer = ConfidenceScorer(cal, decoder_kind(kind))
    rows, labels = [], []
    for rec in recs:
        if not rec.reference.strip():
            continue
        confs = []
        for seg in rec.segments:
            if seg.words and seg.word_features:
                confs += scorer.words(seg.stage, seg.word_features)
        rows.append(utterance_features(confs))
        labels.append(utterance_correct(rec.text, rec.reference))
    from ..pipeline.confidence.calibration import UTTERANCE_FEATURES

    cal.utterance[kind] = fit_map(rows, labels, list(UTTERANCE_FEATURES))
    cal.notes.setdefault("fitted_on", {})[kind] = {"recordings": len(rows), "words": len(words)}
    return cal


def run(args: argparse.Namespace) -> int:
    import sys

    from ..pipeline.confidence.calibration import Calibration
    from ..pipeline.config import ConfigError, load_config
    from ..pipeline.models.preflight import ModelError, check_model
    from ..pipeline.sources import SourceError, open_source
    from ..pipeline.storage import StorageError

    # What transcribe refuses before it starts, refused here too: one line, exit 2.
    try:
        cfg = load_config(args.config, ["confidence.enabled=true"] + list(args.overrides))
        check_model(cfg.model)
        open_source(str(args.input))
    except (ConfigError, ModelError, SourceError, StorageError) as exc:
        print(f"shardscribe: error: {exc}", file=sys.stderr)
        return 2
    recs = collect(cfg, args.input, args.limit)
    cal = fit_calibration(cfg, recs, {"input": str(args.input), "config": cfg.name})
    out = Path(args.output)
    if args.merge and out.exists():
        old = Calibration.load(out)
        heads = {old.model.get("ctc_head"), cal.model.get("ctc_head")} - {None}
        same = all(old.model.get(k) == cal.model.get(k) for k in ("family", "source")) and len(heads) <= 1
        if not same:
            raise SystemExit(f"calibrate: {out} was fitted for another model ({old.model}); not merging")
        # A kind without a CTC head (ar) shares the file of the same model with its head.
        old.model["ctc_head"] = next(iter(heads), None)
        old.word.update(cal.word)
        old.utterance.update(cal.utterance)
        old.notes.setdefault("fitted_on", {}).update(cal.notes["fitted_on"])
        cal = old
    out.parent.mkdir(parents=True, exist_ok=True)
    cal.save(out)
    print(f"calibration for {', '.join(sorted(cal.word))} written to {out}")
    return 0
