"""Which transcripts a CTC draft head learns from, and which it is measured on ("Self-
Speculative Decoding for LLM-based ASR with CTC Encoder Drafts": the draft is only worth
its verification pass where it agrees with the decoder, so the head learns the model's
own greedy AR text, not a reference).

The keep rule: no ``error``, no ``filter_reasons`` (the job's hallucination filters; the
same eligibility as pseudo-labelling, pipeline.pseudo_label), and a mean word confidence
of at least the threshold (the calibrated P(word right) of the job's confidence, or a
word's mean token probability where the model has no calibration). A transcript the model
got partly wrong is still what the draft should say, so the rule does not ask for a row
without errors (the row ``confidence``, P(no error), drops most long rows): it drops text
the audio does not carry. On 150 TTS clips of unseen sentences with tiny.en, rows below a
mean of 0.5 (25 of 150) had a WER of 94%, the rest 28%. Where no row carries word
confidences (an output folder transcribed without them) the threshold cannot apply and
the selection says so.
The held-out rows are a stable share by id hash, whole recordings, never trained on.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

# The columns selection and cutting read.
COLUMNS = ["id", "audio", "offset_s", "duration_s", "text", "segments", "error", "filter_reasons", "confidence",
           "reference", "config_hash"]


@dataclass
class Selection:
    """What the keep rule made of an output folder's rows."""
    rows: int = 0
    errors: int = 0
    filtered: int = 0
    filter_reasons: dict = field(default_factory=dict)
    low_confidence: int = 0          # passed the filters, mean word confidence below the threshold
    kept: int = 0
    min_confidence: float | None = None
    confidence_rule: str = "applied"   # or why it was not

    def as_dict(self) -> dict:
        return asdict(self)


def mean_word_confidence(row: dict) -> float | None:
    """The mean confidence of the row's words in usable segments; None without any."""
    from ..pseudo_label import word_confidences

    conf = word_confidences(row)
    return sum(conf) / len(conf) if conf else None


def select_rows(rows: list[dict], min_confidence: float | None) -> tuple[list[dict], Selection]:
    """The rows to learn from (input order), and the tally of the rest."""
    from ..pseudo_label import eligible, row_stat

    stats = [row_stat(r) for r in rows]
    confidence = [mean_word_confidence(r) for r in rows]
    sel = Selection(rows=len(rows), min_confidence=min_confidence)
    rule = min_confidence
    if min_confidence is not None and all(c is None for c in confidence):
        rule, sel.confidence_rule = None, "not applied: no row carries word confidences (transcribed without them)"
    elif min_confidence is None:
        sel.confidence_rule = "not applied: no threshold given"
    flags = []
    for s, conf in zip(stats, confidence):
        ok = eligible(s)
        keep = ok and (rule is None or (conf is not None and conf >= rule))
        if s.error:
            sel.errors += 1
        elif s.filter_reasons:
            sel.filtered += 1
            for reason in s.filter_reasons:
                sel.filter_reasons[reason] = sel.filter_reasons.get(reason, 0) + 1
        elif not keep:
            sel.low_confidence += 1
        flags.append(keep)
    sel.kept = sum(flags)
    return [r for r, keep in zip(rows, flags) if keep], sel


def heldout_ids(ids: list[str], share: float) -> set[str]:
    """round(share x n) ids, at least one where share > 0 and there are two, never all:
    the first by SHA-1 of the id, so a rerun, or a larger corpus, holds out the same ones."""
    if share <= 0 or len(ids) < 2:
        return set()
    k = min(len(ids) - 1, max(1, round(share * len(ids))))
    return set(sorted(ids, key=lambda i: hashlib.sha1(i.encode()).hexdigest())[:k])
