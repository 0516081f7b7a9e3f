"""Training and evaluation of the CTC draft head on cached frozen-encoder states.

CTC (Graves et al. 2006) over characters; the encoder is frozen as in SSD, so
training reads cached states only (the loop: pipeline.models.whisper.ctc_head_fit).
Evaluation reports what SSD needs to know about its draft: greedy-CTC CER/WER next to
Whisper's own greedy AR on the same utterances, and a reliability table of the eq. 3 gate statistic (max frame entropy over valid frames)
against the share of drafts that are exactly right after Whisper normalisation.
"""
from __future__ import annotations

import math

# The fitting loop and its helpers are the runtime's (a job may fit a head in its model
# actor); the lab's tools import them from there.
from ..models.whisper.ctc_head_fit import (FitOptions, collate, examples, fit_ctc_head,  # noqa: F401
                                           greedy_drafts, length_batches, time_mask)

ENTROPY_EDGES = [0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, math.inf]


def train_head(head, train_rows: list[dict], eval_rows: list[dict], *, epochs: int, lr: float,
               seed: int, frame_budget: int, device="cpu", time_masks: int = 2,
               mask_width: int = 10, max_minutes: float | None = None, log_every: int = 25,
               stop_after_epoch: int | None = None, log=print) -> list[dict]:
    """AdamW with linear warm-up and cosine decay; returns the per-epoch curve
    (pipeline.models.whisper.ctc_head_fit.fit_ctc_head, the one loop that fits the head).

    ``stop_after_epoch`` ends the run early while keeping the schedule of the full
    ``epochs`` budget, so a short run reproduces the first epochs of a long one step for
    step (the cheap reproduction check of the model card)."""
    options = FitOptions(epochs=epochs, lr=lr, seed=seed, frame_budget=frame_budget, device=str(device),
                         time_masks=time_masks, mask_width=mask_width, max_minutes=max_minutes,
                         stop_after_epoch=stop_after_epoch, log_every=log_every)
    return fit_ctc_head(head, train_rows, eval_rows, options, log=log)


def _exact(ref: str, hyp: str) -> bool:
    from ..metrics import normalize

    return normalize(ref) == normalize(hyp)


def evaluate(rows: list[dict], ctc_texts: list[str], max_entropy: list[float]) -> dict:
    """Per split: CER/WER of greedy CTC and Whisper AR (normalised), raw cased CER."""
    import jiwer

    from ..metrics import corpus_cer, corpus_wer

    result = {}
    for split in sorted({r["split"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["split"] == split]
        refs = [rows[i]["text"] for i in idx]
        ctc = [ctc_texts[i] for i in idx]
        entry = {"utterances": len(idx),
                 "ctc_cer": corpus_cer(refs, ctc), "ctc_wer": corpus_wer(refs, ctc),
                 "ctc_raw_cer": jiwer.cer(refs, [c if c else " " for c in ctc]),
                 "ctc_exact": sum(_exact(r, c) for r, c in zip(refs, ctc)) / len(idx)}
        ar = [rows[i].get("ar_text") for i in idx]
        if all(a is not None for a in ar):
            entry.update(ar_cer=corpus_cer(refs, ar), ar_wer=corpus_wer(refs, ar),
                         ar_exact=sum(_exact(r, a) for r, a in zip(refs, ar)) / len(idx))
            entry["wer_ratio_ctc_over_ar"] = (entry["ctc_wer"] / entry["ar_wer"]
                                              if entry["ar_wer"] else math.inf)
        result[split] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in entry.items()}
    return result


def calibration_table(rows: list[dict], ctc_texts: list[str], max_entropy: list[float],
                      edges: list[float] = ENTROPY_EDGES) -> list[dict]:
    """Buckets of max frame entropy (nats, valid frames) -> share of exactly-right drafts,
    and the cumulative view SSD's τ_CTC reads: accept every draft below the upper edge."""
    table = []
    for lo, hi in zip(edges, edges[1:]):
        idx = [i for i, e in enumerate(max_entropy) if lo <= e < hi]
        below = [i for i, e in enumerate(max_entropy) if e < hi]
        table.append({
            "max_entropy": f"[{lo:g}, {hi:g})", "utterances": len(idx),
            "exact": round(sum(_exact(rows[i]["text"], ctc_texts[i]) for i in idx) / len(idx), 3)
            if idx else None,
            "accepted_if_tau_is_upper_edge": round(len(below) / len(rows), 3),
            "exact_among_accepted": round(sum(_exact(rows[i]["text"], ctc_texts[i])
                                              for i in below) / len(below), 3) if below else None,
        })
    return table
