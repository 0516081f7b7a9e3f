"""Pseudo-label selection and exports over a transcribe job's output (what
`shardscribe pseudo-label` writes beside the rows, in DST/__pseudo_label/).

- The keep rule: a row is kept iff it has no ``error``, no ``filter_reasons``
  (pipeline.filters) and its ``confidence`` is at least C, or is among the best
  ``round(F x n)`` of the n rows that pass the first two (halves rounded up). A row
  without a confidence passes no threshold.
  Rows are never dropped from the Parquet: the rule only picks what the exports hold.
- The ranking of ``--keep-fraction`` (``pseudo_label.rank_by``): by ``confidence`` (the
  calibrated P(no error) of the row), or, the default, by *excess expected errors*: a
  row's expected word errors E_i = sum over its words of (1 - word confidence), less
  w * n_i, its n_i words at the candidate rows' expected error rate w = sum E / sum n.
  Dropping row i changes the kept rows' pooled WER (E - e_i) / (N - n_i) by, to first
  order, -(e_i - WER * n_i) / N: the rows to drop first are the ones whose errors exceed
  what their length carries at the current rate. (Ranking by P(no error) drops long
  rows first, which hold the most words, often mostly right.) Rows without word
  confidences cannot rank.
- Utterances: each kept segment is one training utterance when it is at most
  ``max_utterance_s`` long; a longer one is cut between words (its words' start/end),
  in the pause between two words; one without word times is left out and counted.
- The report: kept fraction against the WER of the kept rows (rows ranked as the keep
  rule ranks them, where references exist) and the reliability diagram (confidence bins
  against the share of their rows with no word error, with the expected calibration
  error, ECE, of "On Calibration of Modern Neural Networks", eq. 3).
- Scale: the keep rule ranks compact per-row statistics (``RowStat``), and the exports are
  written a batch of utterances at a time (``ExportWriter``), so memory grows by tens of
  bytes a row, not by a row's segments and words.
"""
from __future__ import annotations

import io
import json
import math
import posixpath
from dataclasses import dataclass

import jiwer
import pyarrow as pa
import pyarrow.parquet as pq

from .confidence.evaluation import ece as expected_calibration_error
from .config_sections import PSEUDO_LABEL_RANKINGS
from .metrics import normalize
from .output import PSEUDO_LABEL_EXPORT, SIDECAR_DIR, export_dir
from .storage import redact_uri, url_to_fs

# Beside the parts, in a folder no Parquet reader reads as DST's rows (pipeline.output).
EXPORT_DIR = export_dir(PSEUDO_LABEL_EXPORT)
FORMER_EXPORT_DIR = f"{SIDECAR_DIR}/pseudo_label"    # where an earlier version wrote them
MANIFEST_NAME = f"{EXPORT_DIR}/manifest.jsonl"
DATASET_DIR = f"{EXPORT_DIR}/dataset"
DATASET_FILE = f"{DATASET_DIR}/train-00000-of-00001.parquet"
REPORT_NAME = f"{EXPORT_DIR}/_report.json"
PLOT_NAME = f"{EXPORT_DIR}/pseudo_label.png"

# The report's kept-fraction curve has at most about this many points (evenly spaced in
# rows kept), whatever the number of rows.
CURVE_POINTS = 1000

UTTERANCE_SCHEMA = pa.schema([
    ("id", pa.string()), ("source_id", pa.string()), ("audio_filepath", pa.string()),
    ("offset", pa.float64()), ("duration", pa.float64()), ("text", pa.string()),
    ("confidence", pa.float64()),
])


def eligible(row: RowStat, filter_unit: str = "row") -> bool:
    """No error and no filter reason (with ``filter_unit="segment"``, none about the row as
    a whole): the rows a confidence rule may keep."""
    return not row.error and not (row.filter_reasons if filter_unit == "row" else row.row_reasons)


def word_confidences(row: dict) -> list[float]:
    """The confidences the row's words carry (segments without an error or a filter
    reason: the ones an export can hold)."""
    return [w["confidence"] for seg in row.get("segments") or [] if not seg.get("error")
            and not seg.get("filter_reasons") for w in seg.get("words") or [] if w.get("confidence") is not None]


def expected_errors(confidences: list[float]) -> tuple[float, int] | None:
    """(sum of 1 - confidence over words, how many words); None without any word."""
    return (sum(1.0 - c for c in confidences), len(confidences)) if confidences else None


# Reasons about the row as a whole (pipeline.filters.row_reasons); every other reason a
# row carries came from one of its segments.
ROW_REASONS = ("no_speech", "language_mismatch")


@dataclass(frozen=True, slots=True)
class RowStat:
    """What the keep rule and the report need of a row, without its segments: the export
    holds one per output row, so a million-row job ranks in a few hundred MB."""
    id: str
    error: bool
    filter_reasons: tuple[str, ...]
    row_reasons: tuple[str, ...]           # those about the whole row (filter_unit=segment keeps the rest)
    confidence: float | None
    expected: tuple[float, int] | None     # expected word errors and words (expected_errors)
    counts: tuple[int, int] | None         # word errors against the reference (row_errors); None for an error row


def row_stat(row: dict) -> RowStat:
    error = bool(row.get("error"))
    reasons = tuple(row.get("filter_reasons") or ())
    segments = row.get("segments") or []
    # "empty" is the row's own when no segment holds text (it is also a segment reason).
    own = tuple(r for r in reasons if r in ROW_REASONS or (
        r == "empty" and not any((s.get("text") or "").strip() and not s.get("filter_reasons") for s in segments)))
    return RowStat(id=row["id"], error=error, filter_reasons=reasons, row_reasons=own,
                   confidence=row.get("confidence"), expected=expected_errors(word_confidences(row)),
                   counts=None if error else row_errors(row.get("reference"), row.get("text")))


def excess_errors(counts: list[tuple[float, int] | None]) -> list[float | None]:
    """e_i - w * n_i per (expected errors, words) pair, w = sum e / sum n over the pairs
    given (the module's docstring); None stays None. Lower is better."""
    known = [c for c in counts if c is not None]
    words = sum(n for _, n in known)
    rate = sum(e for e, _ in known) / words if words else 0.0
    return [None if c is None else c[0] - rate * c[1] for c in counts]


def rank_scores(rows: list[RowStat], rank_by: str = "excess_errors") -> list[float | None]:
    """Per row, a score where higher ranks first (None: cannot rank), over ``rows`` as the
    candidates."""
    if rank_by == "confidence":
        return [r.confidence for r in rows]
    if rank_by != "excess_errors":
        raise ValueError(f"rank_by: expected one of {PSEUDO_LABEL_RANKINGS}, got {rank_by!r}")
    # A row without a confidence passes no rule, whatever its words say.
    counts = [r.expected if r.confidence is not None else None for r in rows]
    return [None if x is None else -x for x in excess_errors(counts)]


def kept_count(keep_fraction: float, rows: int) -> int:
    """``round(F x rows)`` with halves rounded up (0.5 of 5 rows keeps 3): Python's
    ``round`` takes halves to the even neighbour, so 0.5 would keep 2 of 5 yet 4 of 7. The
    tolerance keeps a product such as 0.29 x 50 = 14.499999999999998 a half."""
    return math.floor(keep_fraction * rows + 0.5 + 1e-9)


def keep_flags(rows: list[RowStat], min_confidence: float | None = None,
               keep_fraction: float | None = None, rank_by: str = "excess_errors",
               filter_unit: str = "row") -> list[bool]:
    """Per row, whether the keep rule keeps it (one of the two thresholds, or neither:
    every eligible row)."""
    ok = [eligible(r, filter_unit) for r in rows]
    if min_confidence is not None:
        return [o and r.confidence is not None and r.confidence >= min_confidence for o, r in zip(ok, rows)]
    if keep_fraction is None:
        return ok
    # The fraction F of the eligible rows, the best ranked first; ties broken by id so that
    # a rerun keeps the same rows.
    n_keep = kept_count(keep_fraction, sum(ok))
    candidates = [i for i in range(len(rows)) if ok[i]]
    scores = dict(zip(candidates, rank_scores([rows[i] for i in candidates], rank_by)))
    ranked = sorted((i for i in candidates if scores[i] is not None), key=lambda i: (-scores[i], rows[i].id))
    chosen = set(ranked[:n_keep])
    return [i in chosen for i in range(len(rows))]


def _split_words(seg: dict, max_s: float) -> tuple[list[tuple[float, float, str]], int]:
    """(start, end, text) pieces of a segment cut between words, each at most ``max_s``,
    and the number of words that fit in no piece (a single word longer than ``max_s``).

    Words are taken greedily while their own span fits; a piece reaches from the middle of
    the pause before its first word to the middle of the pause after its last (the
    segment's ends outside), trimmed back towards its words where that is too long."""
    words = [w for w in seg["words"] if (w.get("word") or "").strip()]
    cuts = [seg["start"]] + [(a["end"] + b["start"]) / 2 for a, b in zip(words, words[1:])] + [seg["end"]]
    pieces, dropped, a = [], 0, 0
    while a < len(words):
        b = a
        while b < len(words) and words[b]["end"] - words[a]["start"] <= max_s + 1e-9:
            b += 1
        if b == a:
            dropped += 1
            a += 1
            continue
        lo, hi = cuts[a], cuts[b]
        excess = (hi - lo) - max_s
        if excess > 0:
            left, right = max(0.0, words[a]["start"] - lo), max(0.0, hi - words[b - 1]["end"])
            dl = min(left, excess / 2)
            dr = min(right, excess - dl)
            dl = min(left, excess - dr)
            lo, hi = lo + dl, hi - dr
        pieces.append((lo, hi, " ".join(w["word"].strip() for w in words[a:b])))
        a = b
    return pieces, dropped


def utterances(row: dict, max_s: float, offset_s: float | None = None,
               tally: "UtteranceTally | None" = None) -> tuple[list[dict], int]:
    """Training utterances of a kept row, as NeMo manifest entries (times in the file:
    ``offset_s`` is where the recording starts in it), and how many segments (or words)
    could not be cut to ``max_s``. A segment with a filter reason is left out (counted in
    ``tally``): under filter_unit=row its row is never kept anyway."""
    base = offset_s or 0.0
    out, dropped = [], 0
    for seg in row.get("segments") or []:
        text = (seg.get("text") or "").strip()
        if not text or seg.get("error"):
            continue
        if seg.get("filter_reasons"):
            if tally is not None:
                tally.left_out_filtered_segments += 1
            continue
        if seg["end"] - seg["start"] <= max_s + 1e-9:
            pieces = [(seg["start"], seg["end"], text)]
        elif seg.get("words") and all(w.get("start") is not None and w.get("end") is not None
                                      for w in seg["words"]):
            # Only measured word times can place a cut (an attention decoder's words
            # without model.word_timestamps carry confidences and null times).
            pieces, lost = _split_words(seg, max_s)
            dropped += lost
        else:
            pieces, dropped = [], dropped + 1
        # The segment's own confidence where the decoder gives one, else the row's.
        conf = seg.get("confidence") if seg.get("confidence") is not None else row.get("confidence")
        for start, end, piece in pieces:
            out.append({"id": f"{row['id']}#{len(out)}", "source_id": row["id"], "audio_filepath": row["audio"],
                        "offset": round(base + start, 3), "duration": round(end - start, 3), "text": piece,
                        "confidence": conf})
    return out, dropped


def row_errors(reference: str, hypothesis: str) -> tuple[int, int] | None:
    """(word errors, reference words) after Whisper's normalisation; None without a
    reference that has words."""
    ref, hyp = normalize(reference or ""), normalize(hypothesis or "")
    if not ref:
        return None
    out = jiwer.process_words(ref, hyp)
    return out.substitutions + out.deletions + out.insertions, len(ref.split())


def _scored_rows(rows: list[RowStat]) -> list[tuple[RowStat, int, int]]:
    """(row, word errors, reference words) of the rows without an error that have a
    confidence and a reference."""
    return [(r, *r.counts) for r in rows if not r.error and r.confidence is not None and r.counts is not None]


def kept_fraction_curve(rows: list[RowStat], rank_by: str = "excess_errors") -> list[dict]:
    """WER of the best ranked rows against the fraction kept, over the rows without an
    error that have a reference and a confidence (ranked as ``--keep-fraction`` ranks,
    though the excess ranking's rate w is then taken over these rows, not over every
    eligible row); each point also carries the ranking's score of the last row kept."""
    scored = _scored_rows(rows)
    scores = rank_scores([r for r, _, _ in scored], rank_by)
    ranked = sorted(((s, r.id, e, n) for (r, e, n), s in zip(scored, scores) if s is not None),
                    key=lambda x: (-x[0], x[1]))
    curve, errors, words = [], 0, 0
    step = math.ceil(len(ranked) / CURVE_POINTS) if ranked else 1
    for k, (score, _, e, n) in enumerate(ranked, 1):
        errors, words = errors + e, words + n
        if k % step == 0 or k == len(ranked):
            curve.append({"kept_fraction": k / len(ranked), "wer": errors / words, "score": score})
    return curve


def reliability(rows: list[RowStat], bins: int) -> dict:
    """Confidence bins [i/bins, (i+1)/bins) against the share of the bin's rows with no word
    error (what a row's ``confidence``, P(no error), estimates), with the expected
    calibration error: sum_b n_b/N |acc_b - conf_b|."""
    pairs = [(min(max(r.confidence, 0.0), 1.0), 1.0 if e == 0 else 0.0) for r, e, _ in _scored_rows(rows)]
    table = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [(c, a) for c, a in pairs if lo <= c < hi or (b == bins - 1 and c == 1.0)]
        if members:
            table.append({"low": lo, "high": hi, "rows": len(members),
                          "confidence": sum(c for c, _ in members) / len(members),
                          "accuracy": sum(a for _, a in members) / len(members)})
    ece = expected_calibration_error([c for c, _ in pairs], [a for _, a in pairs], bins) if pairs else None
    return {"rows": len(pairs), "bin_width": 1 / bins, "bins": table, "ece": ece}


def _wer(rows: list[RowStat]) -> float | None:
    counts = [r.counts for r in rows if not r.error and r.counts is not None]
    words = sum(n for _, n in counts)
    return sum(e for e, _ in counts) / words if words else None


@dataclass
class UtteranceTally:
    """The exported utterances, counted as they are written."""
    count: int = 0
    seconds: float = 0.0
    longest: float | None = None
    left_out_too_long: int = 0        # segments or words that could not be cut to max_utterance_s
    left_out_no_audio_path: int = 0   # kept rows whose audio came as bytes in a table
    left_out_filtered_segments: int = 0   # segments of kept rows with a filter reason (filter_unit=segment)

    def add(self, utts: list[dict]) -> None:
        for u in utts:
            self.count += 1
            self.seconds += u["duration"]
            self.longest = u["duration"] if self.longest is None else max(self.longest, u["duration"])


def report_data(rows: list[RowStat], kept: list[bool], tally: UtteranceTally, rule: dict, bins: int,
                rank_by: str = "excess_errors") -> dict:
    reasons: dict[str, int] = {}
    for r in rows:
        for reason in r.filter_reasons:
            reasons[reason] = reasons.get(reason, 0) + 1
    kept_rows = [r for r, k in zip(rows, kept) if k]
    # The job's own operating point on the curve's population (rows with a reference and a
    # confidence, no error).
    population = [(r, k) for r, k in zip(rows, kept) if not r.error and r.confidence is not None
                  and r.counts is not None]
    point_rows = [r for r, k in population if k]
    point = ({"kept_fraction": len(point_rows) / len(population), "wer": _wer(point_rows)}
             if population and point_rows else None)
    return {
        "rows": len(rows),
        "errors": sum(1 for r in rows if r.error),
        "filtered": sum(1 for r in rows if not r.error and r.filter_reasons),
        "filter_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        "with_confidence": sum(1 for r in rows if r.confidence is not None),
        "kept": len(kept_rows),
        "kept_fraction": len(kept_rows) / len(rows) if rows else None,
        "kept_with_error": sum(1 for r in kept_rows if r.error),
        "rule": rule,
        "utterances": tally.count,
        "utterance_seconds": round(tally.seconds, 3),
        "longest_utterance_s": tally.longest,
        "left_out_too_long": tally.left_out_too_long,
        "left_out_no_audio_path": tally.left_out_no_audio_path,
        "left_out_filtered_segments": tally.left_out_filtered_segments,
        "wer_all": _wer(rows),
        "wer_kept": _wer(kept_rows),
        "curve": kept_fraction_curve(rows, rank_by),
        "rank_by": rank_by,
        "kept_point": point,
        "reliability": reliability(rows, bins),
    }


def plot(data: dict):
    """The report's figure: kept fraction vs WER of the kept rows, and the reliability
    diagram (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    curve = data["curve"]
    if curve:
        left.plot([p["kept_fraction"] for p in curve], [p["wer"] for p in curve], marker=".")
        if data["wer_all"] is not None:
            left.axhline(data["wer_all"], color="grey", linestyle="--", label="all rows")
        point = data["kept_point"]
        if point is not None:
            left.scatter([point["kept_fraction"]], [point["wer"]], color="red", zorder=3, label="kept by this job")
        left.legend()
    else:
        left.text(0.5, 0.5, "no rows with both a reference\nand a confidence", ha="center", va="center")
    left.set(xlabel=f"fraction of rows kept (best first by {data.get('rank_by', 'excess_errors')})",
             ylabel="WER of the kept rows",
             title="Kept fraction vs WER")
    bins = data["reliability"]["bins"]
    right.plot([0, 1], [0, 1], color="grey", linestyle="--")
    if bins:
        right.bar([(b["low"] + b["high"]) / 2 for b in bins], [b["accuracy"] for b in bins],
                  width=0.9 * data["reliability"]["bin_width"], alpha=0.7, edgecolor="black")
    ece = data["reliability"]["ece"]
    right.set(xlabel="confidence: P(no error)", ylabel="share of rows with no error", xlim=(0, 1), ylim=(0, 1),
              title="Reliability" + (f" (ECE {ece:.3f})" if ece is not None else " (no confidence or references)"))
    fig.tight_layout()
    return fig


class ExportWriter:
    """The NeMo manifest and the datasets folder, written a batch of utterances at a time,
    then the report and its figure, in DST/__pseudo_label/ (``finish`` returns their URLs).
    Exports an earlier version left in the sidecar folder go: one set, the current one."""

    NEMO_KEYS = ("audio_filepath", "offset", "duration", "text", "confidence")
    # Utterances per Parquet row group: a group per kept row would grow the file's footer
    # (held in memory until close) with every row.
    GROUP_ROWS = 8192

    def __init__(self, dst: str, options: dict | None = None):
        self._fs, self._path = url_to_fs(dst, options)
        self._root = redact_uri(dst).rstrip("/")     # the URLs returned are printed
        former = posixpath.join(self._path, FORMER_EXPORT_DIR)
        if self._fs.exists(former):
            self._fs.rm(former, recursive=True)
        self._fs.makedirs(posixpath.join(self._path, DATASET_DIR), exist_ok=True)
        self._manifest = self._fs.open(posixpath.join(self._path, MANIFEST_NAME), "w", encoding="utf-8")
        self._dataset_file = self._fs.open(posixpath.join(self._path, DATASET_FILE), "wb")
        self._dataset = pq.ParquetWriter(self._dataset_file, UTTERANCE_SCHEMA)
        self.written = [f"{self._root}/{MANIFEST_NAME}", f"{self._root}/{DATASET_FILE}"]
        self._pending: list[dict] = []

    def add(self, utterance_rows: list[dict]) -> None:
        self._pending += utterance_rows
        if len(self._pending) >= self.GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        self._manifest.write("".join(json.dumps({k: u[k] for k in self.NEMO_KEYS}, ensure_ascii=False) + "\n"
                                     for u in self._pending))
        self._dataset.write_table(pa.Table.from_pylist(self._pending, schema=UTTERANCE_SCHEMA))
        self._pending = []

    def close(self) -> None:
        if self._manifest is None:
            return
        try:
            self._flush()
        finally:
            self._manifest.close()
            self._dataset.close()
            self._dataset_file.close()
            self._manifest = None

    def finish(self, data: dict, with_plot: bool = True) -> list[str]:
        self.close()
        self._put(REPORT_NAME, json.dumps(data, indent=2).encode())
        if with_plot:
            import matplotlib.pyplot as plt

            fig = plot(data)
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=100)
            plt.close(fig)
            self._put(PLOT_NAME, png.getvalue())
        return self.written

    def _put(self, name: str, data_bytes: bytes) -> None:
        with self._fs.open(posixpath.join(self._path, name), "wb") as fh:
            fh.write(data_bytes)
        self.written.append(f"{self._root}/{name}")


def write_exports(dst: str, utterance_rows: list[dict], data: dict, options: dict | None = None,
                  with_plot: bool = True) -> list[str]:
    """Every export at once, for utterances already in memory; returns their URLs."""
    writer = ExportWriter(dst, options)
    try:
        writer.add(utterance_rows)
    finally:
        writer.close()
    return writer.finish(data, with_plot)
