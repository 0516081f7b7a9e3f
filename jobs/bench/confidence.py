"""Confidence benchmark: how well each decoder kind's calibrated word and utterance
confidence (pipeline.confidence) ranks and estimates correctness, against the
max-probability baseline (the mean probability of a word's tokens, faster-whisper's word
probability; its mean over a recording's words) in the same run.

    shardscribe bench confidence --sets DATA [--kinds ar,ssd,ctc_greedy,ctc_beam]
                                 [--calibration-out FILE] [--quick] [--out R.json]

DATA is a `shardscribe make-bench-sets` output. The calibration is fitted on hv_dev (the
dev half of the held-out voices) and the held-out-text clips whose sentence hashes even;
it is scored on heldout_voice (the test half of the voices), the held-out-text clips whose
sentence hashes odd, the real recordings of DATA/real/real_all.jsonl where make-bench-sets
wrote them, and the clips in pipeline/assets/samples; a test clip whose
normalised sentence also occurs in the fitting split is dropped, so the two share neither
clips nor sentences. Without --sets, --manifest (default: the samples) is split the same
way by sentence.

Per decoder kind and level (word, utterance), for the calibrated confidence and the
baseline: AUC-ROC and AUC-PR of detecting wrong items (scikit-learn), NCE and ECE (10
bins); the WER of the 80% of recordings ranked best against the WER of all, ranked by the
utterance confidence, by its baseline, by `pseudo-label --keep-fraction`'s rule (excess
expected word errors) and by the same rule on the true errors (the oracle: about the best
any confidence could do on the set); and, where a word has a second view (the SSD draft, the CTC beam's greedy path), the
precision of agreement as a trust signal: P(word correct | the two agree). A PNG holds the
word-level reliability diagrams and kept fraction against WER of the kept rows.
"""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

KINDS = ("ar", "ssd", "ctc_greedy", "ctc_beam")
KEEP = 0.8


def add_arguments(parser) -> None:
    parser.add_argument("--sets", default=None, help="make-bench-sets output directory")
    parser.add_argument("--kinds", default=",".join(KINDS), help="decoder kinds (conf/<kind>.yaml each)")
    parser.add_argument("--calibration-out", default=None, help="write the fitted calibration (all kinds) here")
    parser.add_argument("--plot", default=None, help="PNG path (default: beside --out, else confidence.png)")
    parser.add_argument("--limit", type=int, default=0, help="recordings per split (0: all)")
    parser.add_argument("--cost-clips", type=int, default=0, metavar="N",
                        help="also time ar and ssd on N fit-split recordings with confidence on vs off")


def _odd(text: str) -> bool:
    from ...pipeline.metrics import normalize

    return hashlib.sha256(normalize(text).encode()).digest()[0] % 2 == 1


def splits(args):
    """(fit, test) lists of (recording segments, reference, subset name)."""
    from .data import DEFAULT_MANIFEST, load_recordings
    from ...pipeline.metrics import normalize

    def load(path, tag):
        recs, refs = load_recordings(str(path))
        return [(a, r, tag) for a, r in zip(recs, refs)]

    samples = load(DEFAULT_MANIFEST, "samples")
    if args.sets:
        base = Path(args.sets) / "tts_v1"
        text = load(base / "heldout_text_all.jsonl", "synthetic")
        fit = load(base / "hv_dev.jsonl", "synthetic") + [x for x in text if not _odd(x[1])]
        test = load(base / "heldout_voice.jsonl", "synthetic") + [x for x in text if _odd(x[1])]
        real = Path(args.sets) / "real" / "real_all.jsonl"
        if real.exists():
            test += load(real, "real")
    else:
        pool = load(args.manifest, "manifest") if args.manifest else []
        fit = [x for x in pool if not _odd(x[1])]
        test = [x for x in pool if _odd(x[1])]
        if not fit:     # the samples alone: fit on their even half, score on the rest
            fit = [x for x in samples if not _odd(x[1])]
            samples = [x for x in samples if _odd(x[1])]
    seen = {normalize(x[1]) for x in fit}
    test = [x for x in test + samples if normalize(x[1]) not in seen]
    limit = args.limit or (40 if args.quick else 0)
    if limit:
        fit, test = fit[:limit], test[:limit]
    return fit, test


def _baseline(feats: dict) -> float:
    v = feats.get("prob_mean")
    return 1.0 if v is None or not math.isfinite(v) else float(v)


def evaluate(cfg, cal, test) -> tuple[dict, dict]:
    """Rows of metrics and the curves for the plot of one kind on the test split."""
    import numpy as np

    from ..calibrate import labelled_words
    from ...pipeline.confidence.apply import ConfidenceScorer
    from ...pipeline.kinds import decoder_kind
    from ...pipeline.confidence.evaluation import scores, utterance_correct
    from ...pipeline.metrics import corpus_wer
    from ...pipeline.pseudo_label import excess_errors, expected_errors, row_errors

    kind = cfg.decoder.kind
    scorer = ConfidenceScorer(cal, decoder_kind(kind))
    words = labelled_words(test)
    y = np.array([c for _, _, c in words], dtype=bool)
    calibrated = np.array([scorer.words(s, [f])[0] for s, f, _ in words], dtype=np.float64)
    base = np.array([_baseline(f) for _, f, _ in words])
    out = {"word": {"calibrated": scores(calibrated, y), "baseline": scores(base, y)}}
    agree = np.array([f.get("agree", math.nan) for _, f, _ in words], dtype=np.float64)
    has = ~np.isnan(agree)
    if has.any():
        a = agree[has] > 0.5
        yy = y[has]
        out["agreement"] = {"words": int(has.sum()), "agree_share": float(a.mean()),
                            "precision": float(yy[a].mean()) if a.any() else math.nan,
                            "p_correct_disagree": float(yy[~a].mean()) if (~a).any() else math.nan,
                            "base_accuracy": float(yy.mean()),
                            "recall_of_correct": float(a[yy].mean()) if yy.any() else math.nan}
    refs, hyps, u_cal, u_base, u_y, expected, true = [], [], [], [], [], [], []
    for rec in test:
        if not rec.reference.strip():
            continue
        confs, probs = [], []
        for seg in rec.segments:
            if seg.words and seg.word_features:
                confs += scorer.words(seg.stage, seg.word_features)
                probs += [_baseline(f) for f in seg.word_features]
        c = scorer.utterance(confs)
        u_cal.append(0.0 if c is None else c)
        u_base.append(float(np.mean(probs)) if probs else 0.0)
        u_y.append(utterance_correct(rec.text, rec.reference))
        expected.append(expected_errors(confs))
        true.append(row_errors(rec.reference, rec.text) or (0, 0))
        refs.append(rec.reference)
        hyps.append(rec.text)
    out["utterance"] = {"calibrated": scores(u_cal, u_y), "baseline": scores(u_base, u_y)}
    wer_all = corpus_wer(refs, hyps)
    curves = {"reliability": (calibrated, base, y), "kept": {}}
    # The rankings of the kept rows: the utterance confidence (P(no error)) and its
    # baseline, `pseudo-label --keep-fraction`'s default (excess expected word errors,
    # pipeline.pseudo_label), and the same rule on the true error counts: the ceiling of
    # any confidence on this set.
    rankings = (("calibrated", u_cal), ("baseline", u_base),
                ("excess_errors", [-math.inf if x is None else -x for x in excess_errors(expected)]),
                ("oracle", [-x for x in excess_errors(true)]))
    for name, conf in rankings:
        order = np.argsort(-np.asarray(conf), kind="stable")
        fracs, wers = [], []
        for frac in np.linspace(0.1, 1.0, 19):
            k = max(1, int(math.ceil(frac * len(order))))
            keep = order[:k]
            fracs.append(frac)
            wers.append(corpus_wer([refs[i] for i in keep], [hyps[i] for i in keep]) or 0.0)
        k = int(math.ceil(KEEP * len(order)))
        keep = order[:k]
        kept = corpus_wer([refs[i] for i in keep], [hyps[i] for i in keep])
        out.setdefault("kept", {})[name] = {"wer_all": wer_all, "wer_kept_80": kept,
                                            "ratio": kept / wer_all if wer_all else math.nan}
        curves["kept"][name] = (fracs, wers)
    out["stages"] = {}
    for rec in test:
        for seg in rec.segments:
            out["stages"][seg.stage] = out["stages"].get(seg.stage, 0) + 1
    return out, curves


def plot(path: str, curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from .data import save_figure

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax1.plot([0, 1], [0, 1], color="grey", lw=0.8)
    for i, (kind, cv) in enumerate(curves.items()):
        color = f"C{i}"
        cal, base, y = cv["reliability"]
        for conf, style, label in ((cal, "-o", kind), (base, ":", f"{kind} max-prob")):
            which = np.minimum((np.asarray(conf) * 10).astype(int), 9)
            xs = [np.mean(conf[which == b]) for b in range(10) if (which == b).any()]
            ys = [np.mean(y[which == b]) for b in range(10) if (which == b).any()]
            ax1.plot(xs, ys, style, color=color, label=label, ms=3)
        labels = {"calibrated": "P(no error)", "baseline": "max-prob", "excess_errors": "excess errors (rule)",
                  "oracle": "oracle"}
        for name, style in (("calibrated", "-"), ("baseline", ":"), ("excess_errors", "--"), ("oracle", "-.")):
            fr, w = cv["kept"][name]
            ax2.plot(fr, w, style, color=color, label=f"{kind}: {labels[name]}", lw=0.8 if name == "oracle" else 1.5)
    ax1.set(xlabel="word confidence", ylabel="share of words correct", title="Reliability (test split)")
    ax2.set(xlabel="fraction of recordings kept (best ranked first)", ylabel="WER of kept recordings",
            title="Kept fraction vs WER")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    save_figure(fig, path, dpi=110)


def cost(recordings: list[list], kinds=("ar", "ssd"), rounds: int = 2) -> dict:
    """Seconds to decode ``recordings`` with confidence features on and off, per kind: the
    same built stages with their flag toggled, the two timed in turn for ``rounds`` rounds
    after a warm-up round, fastest kept."""
    import numpy as np

    from ...pipeline.batching import pack_by_budget
    from ...pipeline.config import load_config
    from ...pipeline.kinds import decoder_kind
    from ...pipeline.kinds.base import PENDING
    from ...pipeline.models import load_model
    from ...pipeline.segment_runner import decode_segments
    from ...pipeline.timing import timed

    audios = [np.asarray(a, dtype=np.float32) for segs in recordings for a in segs]
    out = {}
    for name in kinds:
        cfg = load_config(name)
        kind = decoder_kind(cfg.decoder.kind)
        first = kind.build_first_stage(load_model(cfg.model), cfg)
        second = kind.build_second_stage(cfg, first) if kind.two_stage else None

        def decode():
            res = decode_segments(first, audios, cfg.batching.max_tokens)
            pend = [r for r in res if r.stage == PENDING]
            for batch in (pack_by_budget([second.cost(r) for r in pend], cfg.batching.max_tokens) if pend else []):
                second.finish([pend[i] for i in batch])

        best = {}
        for r in range(rounds + 1):
            for on in (True, False):
                for stage in (first, second):
                    if stage is not None:
                        stage.confidence = on
                _, secs = timed(decode)
                if r:
                    best[on] = min(best.get(on, secs), secs)
        out[name] = {"segments": len(audios), "on_s": best[True], "off_s": best[False],
                     "ratio": best[True] / best[False]}
    return out


def run(args) -> dict:
    from ..calibrate import Recording, decode_recordings, fit_calibration
    from ...pipeline.confidence.calibration import Calibration
    from ...pipeline.config import load_config

    fit, test = splits(args)
    rows, curves, merged = [], {}, None
    summary = {"fit_recordings": len(fit), "test_recordings": len(test),
               "test_subsets": {t: sum(x[2] == t for x in test) for t in sorted({x[2] for x in test})}}
    for kind in [k for k in args.kinds.split(",") if k]:
        cfg = load_config(kind, ["confidence.enabled=true"])
        if args.device:
            cfg.model.device = args.device
        decoded = decode_recordings(cfg, [x[0] for x in fit + test])
        recs = [Recording(x[1], d) for x, d in zip(fit + test, decoded)]
        cal = fit_calibration(cfg, recs[:len(fit)], {"bench": "confidence"})
        test_recs = recs[len(fit):]
        res, curves[kind] = evaluate(cfg, cal, test_recs)
        for tag in sorted({x[2] for x in test}):
            part = [r for r, x in zip(test_recs, test) if x[2] == tag]
            sub, _ = evaluate(cfg, cal, part)
            for level in ("word", "utterance"):
                for method in ("calibrated", "baseline"):
                    rows.append({"decoder": kind, "level": f"{level}/{tag}", "confidence": method,
                                 **sub[level][method]})
            res.setdefault("subsets", {})[tag] = {
                "recordings": len(part), "word_auc_roc": sub["word"]["calibrated"]["auc_roc"],
                "word_auc_roc_baseline": sub["word"]["baseline"]["auc_roc"],
                "word_ece": sub["word"]["calibrated"]["ece"], "word_ece_baseline": sub["word"]["baseline"]["ece"],
                "word_ece_if_calibrated": sub["word"]["calibrated"]["ece_if_calibrated"],
                "word_ece_if_calibrated_p95": sub["word"]["calibrated"]["ece_if_calibrated_p95"],
                "kept_80_ratio": sub["kept"]["calibrated"]["ratio"],
                "kept_80_ratio_excess_errors": sub["kept"]["excess_errors"]["ratio"],
                "kept_80_ratio_oracle": sub["kept"]["oracle"]["ratio"], "wer_all": sub["kept"]["calibrated"]["wer_all"]}
        if merged is None:
            merged = Calibration(dict(cal.model, ctc_head="embedded"), {}, {}, {"fitted_on": {}})
        merged.word.update(cal.word)
        merged.utterance.update(cal.utterance)
        merged.notes["fitted_on"].update(cal.notes["fitted_on"])
        for level in ("word", "utterance"):
            for method in ("calibrated", "baseline"):
                rows.append({"decoder": kind, "level": level, "confidence": method, **res[level][method]})
        summary[kind] = {
            "word_auc_roc": res["word"]["calibrated"]["auc_roc"],
            "word_auc_roc_baseline": res["word"]["baseline"]["auc_roc"],
            "word_ece": res["word"]["calibrated"]["ece"], "word_ece_baseline": res["word"]["baseline"]["ece"],
            "utt_auc_roc": res["utterance"]["calibrated"]["auc_roc"], "utt_ece": res["utterance"]["calibrated"]["ece"],
            # what a confidence equal to P(correct) would measure on the same items
            "word_ece_if_calibrated": res["word"]["calibrated"]["ece_if_calibrated"],
            "utt_ece_if_calibrated": res["utterance"]["calibrated"]["ece_if_calibrated"],
            "utt_ece_if_calibrated_p95": res["utterance"]["calibrated"]["ece_if_calibrated_p95"],
            "wer_all": res["kept"]["calibrated"]["wer_all"], "wer_kept_80": res["kept"]["calibrated"]["wer_kept_80"],
            "kept_80_ratio": res["kept"]["calibrated"]["ratio"],
            "kept_80_ratio_baseline": res["kept"]["baseline"]["ratio"],
            "kept_80_ratio_excess_errors": res["kept"]["excess_errors"]["ratio"],
            "kept_80_ratio_oracle": res["kept"]["oracle"]["ratio"],
            "agreement": res.get("agreement"), "stages": res["stages"], "subsets": res.get("subsets"),
            "targets": {"word_auc_roc>=0.85": res["word"]["calibrated"]["auc_roc"] >= 0.85,
                        "word_ece<=0.05": res["word"]["calibrated"]["ece"] <= 0.05,
                        "kept_80_ratio<=0.5": res["kept"]["excess_errors"]["ratio"] <= 0.5}}
    if args.cost_clips:
        summary["cost"] = cost([x[0] for x in fit[:args.cost_clips]])
    if args.calibration_out and merged is not None:
        merged.notes["made_by"] = "shardscribe bench confidence" + (f" --sets {args.sets}" if args.sets else "")
        merged.save(args.calibration_out)
    path = args.plot or (str(Path(args.out).with_suffix(".png")) if getattr(args, "out", None) else "confidence.png")
    plot(path, curves)
    summary["plot"] = path
    return {"rows": rows, "summary": summary}
