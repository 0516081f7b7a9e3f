"""A one-page HTML report of a finished output folder, with PNG plots beside it
(pipeline.report_plots): throughput over the job's time, stage shares, the duration
histogram, WER by stage and by duration bucket where references exist; the errors table;
and the transcripts: the first rows by id and, where references exist, the worst rows by
WER. Every WER on the page is in percent, as the console shows it.

Reads only the Parquet parts (and the summary where there is one), so it works on any
output folder, resumed or not; written into the folder's sidecar folder.
"""
from __future__ import annotations

import heapq
import html
import json
import posixpath
from collections import Counter, defaultdict

from .metrics import word_error_counts
from .output import SIDECAR_DIR, SUMMARY_NAME, error_kind, iter_output, sidecar_path
from .report_plots import MODEL_TIMES, duration_text, plots
from .storage import redact_uri

REPORT_NAME = "report.html"
DURATION_BUCKETS = [(0, 5), (5, 10), (10, 30), (30, 60), (60, float("inf"))]
COLUMNS = ["id", "duration_s", "text", "reference", "segments", "stage", "error", "t_prepare_s",
           "t_encode_s", "t_decode_s", "t_fallback_s", "finished_at"]
STEP_TIMES = [("prepare", "t_prepare_s"), ("encode", "t_encode_s"), ("decode", "t_decode_s"),
              ("fallback", "t_fallback_s")]
FIRST_ROWS = 50
WORST_ROWS = 20
# A transcript cell is cut here: the page stays readable (and small) for hour-long rows.
TEXT_CHARS = 400


def bucket_name(low: float, high: float) -> str:
    return f"{low:g}-{high:g} s" if high != float("inf") else f">= {low:g} s"


class _Wer:
    """Word errors and reference words summed over rows (their ratio is the corpus WER),
    and the rows counted."""

    def __init__(self):
        self.errors = self.words = self.rows = 0

    def add(self, errors: int, words: int) -> None:
        self.errors, self.words, self.rows = self.errors + errors, self.words + words, self.rows + 1

    def value(self):
        return self.errors / self.words if self.words else None


def _cut(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 1] + "\u2026"


def _transcript(r: dict, counts: tuple[int, int] | None) -> dict:
    errors, words = counts or (0, 0)
    return {"id": r["id"], "duration_s": r["duration_s"], "stage": r["stage"], "text": _cut(r["text"]),
            "reference": _cut(r["reference"]), "error": r["error"], "errors": errors, "words": words,
            "wer": errors / words if words else None}


def report_data(batches) -> dict:
    """Everything the page shows, from output rows given a batch (a list of dicts) at a time
    (``iter_output``), so a million-row output is never held whole: what is kept of each
    row is a few numbers, and of the transcripts only the rows the tables show."""
    segment_stages: Counter = Counter()
    step_seconds = {name: 0.0 for name, _ in STEP_TIMES}
    total, by_stage, by_bucket = _Wer(), defaultdict(_Wer), defaultdict(_Wer)
    errors: dict[str, dict] = {}
    finished, durations, n_rows, audio_s = [], [], 0, 0.0
    first: list[dict] = []
    worst: list[tuple] = []
    for rows in batches:
        n_rows += len(rows)
        shown, ranked = [], []
        for r in rows:
            for name, col in STEP_TIMES:
                step_seconds[name] += r.get(col) or 0.0
            audio_s += r["duration_s"] or 0.0
            if r.get("finished_at"):
                busy = sum(r.get(col) or 0.0 for col in MODEL_TIMES)
                finished.append((r["finished_at"], busy, r["duration_s"] or 0.0))
            counts = None
            if r["error"]:
                e = errors.setdefault(error_kind(r["error"]), {"count": 0, "ids": [], "message": r["error"]})
                e["count"] += 1
                if len(e["ids"]) < 3:
                    e["ids"].append(r["id"])
            else:
                segment_stages.update(sg["stage"] for sg in (r["segments"] or []))
                if r["duration_s"]:
                    durations.append(r["duration_s"])
                if r["reference"]:
                    counts = word_error_counts([r["reference"]], [r["text"] or ""])
            shown.append((r, counts))
            if counts and counts[1]:
                total.add(*counts)
                by_stage[r["stage"]].add(*counts)
                for low, high in DURATION_BUCKETS:
                    if low <= (r["duration_s"] or 0.0) < high:
                        by_bucket[bucket_name(low, high)].add(*counts)
                # Highest WER first; more word errors, then the id, break ties. A row without
                # a word error is no example of one.
                if counts[0]:
                    ranked.append(((-counts[0] / counts[1], -counts[0], r["id"]), r, counts))
        worst = heapq.nsmallest(WORST_ROWS, worst + [(key, _transcript(r, c)) for key, r, c in
                                                     heapq.nsmallest(WORST_ROWS, ranked, key=lambda x: x[0])],
                                key=lambda w: w[0])
        first = heapq.nsmallest(FIRST_ROWS, first + [_transcript(r, c) for r, c in
                                                     heapq.nsmallest(FIRST_ROWS, shown, key=lambda x: x[0]["id"])],
                                key=lambda t: t["id"])
    order = [bucket_name(low, high) for low, high in DURATION_BUCKETS]
    return {"rows": n_rows, "errors": sum(e["count"] for e in errors.values()), "audio_s": audio_s,
            "durations": durations, "segment_stages": dict(segment_stages.most_common()),
            "step_seconds": step_seconds, "wer": total.value(), "wer_rows": total.rows,
            "wer_by_stage": {k: (w.value(), w.rows) for k, w in sorted(by_stage.items())},
            "wer_by_bucket": {k: (by_bucket[k].value(), by_bucket[k].rows) for k in order if k in by_bucket},
            "errors_table": dict(sorted(errors.items(), key=lambda kv: -kv[1]["count"])),
            "finished": finished, "first_rows": first, "worst_rows": [w[1] for w in worst]}


def _table(header: list[str] | None, rows: list[list]) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _transcripts(rows: list[dict], with_reference: bool) -> str:
    header = ["id", "duration", "stage"] + (["WER", "text", "reference"] if with_reference else ["text"])
    body = []
    for t in rows:
        text = f"error: {t['error']}" if t["error"] else t["text"]
        cells = [t["id"], _seconds(t["duration_s"]), t["stage"] or "-"]
        body.append(cells + ([_pct(t["wer"]), text, t["reference"]] if with_reference else [text]))
    return _table(header, body).replace("<table>", "<table class=transcripts>", 1)


def render_html(dst: str, data: dict, summary: dict | None, figures: list[tuple[str, str]]) -> str:
    facts = [["rows", data["rows"]], ["errors", data["errors"]], ["audio", duration_text(data["audio_s"])]]
    if summary:
        if summary.get("wall_seconds"):
            facts.append(["wall time of the last run", duration_text(summary["wall_seconds"])])
        if summary.get("rtfx"):
            facts.append(["RTFx of the last run", f"{summary['rtfx']:.1f}"])
        if summary.get("config"):
            facts.append(["config", f"{summary['config']} ({summary.get('config_hash', '')})"])
    if data["wer"] is not None:
        facts.append(["WER", f"{_pct(data['wer'])} over {data['wer_rows']} rows with a reference"])
    parts = [f"<h1>shardscribe report</h1><p class=dst>{html.escape(redact_uri(dst))}</p>", _table(None, facts)]
    for name, caption in figures:
        parts.append(f"<figure><img src=\"{html.escape(name)}\" alt=\"{html.escape(caption)}\">"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    if data["wer_by_stage"] or data["wer_by_bucket"]:
        parts.append("<h2>WER</h2>")
        parts.append(_table(["stage", "WER", "rows"],
                            [[k, _pct(w), n] for k, (w, n) in data["wer_by_stage"].items()]))
        parts.append(_table(["duration", "WER", "rows"],
                            [[k, _pct(w), n] for k, (w, n) in data["wer_by_bucket"].items()]))
    parts.append("<h2>Errors</h2>")
    if data["errors_table"]:
        parts.append(_table(["kind", "rows", "example ids", "example message"],
                            [[k, e["count"], ", ".join(e["ids"]), e["message"]]
                             for k, e in data["errors_table"].items()]))
    else:
        parts.append("<p>No errors.</p>")
    with_reference = data["wer"] is not None
    if with_reference:
        n = len(data["worst_rows"])
        parts.append(f"<h2 id=worst>The {n} row{'s' if n != 1 else ''} with the highest WER</h2>")
        parts.append(_transcripts(data["worst_rows"], True) if data["worst_rows"] else
                     "<p>No row with a reference has a word error.</p>")
    if data["first_rows"]:
        shown = len(data["first_rows"])
        parts.append(f"<h2 id=transcripts>Transcripts: the first {shown} of {data['rows']} rows by id</h2>")
        parts.append(_transcripts(data["first_rows"], with_reference))
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
             "text-align:left;vertical-align:top}figure{margin:1em 0}img{max-width:100%}.dst{color:#666}"
             ".transcripts td{font-size:90%;overflow-wrap:break-word}")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>shardscribe report</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def write_report(dst: str, options: dict | None = None) -> str:
    """Write the report of output folder ``dst`` (opened with the storage ``options``);
    returns the URL of the HTML page."""
    import io

    from .storage import url_to_fs

    fs, path = url_to_fs(dst, options)
    if not any(True for _ in iter_output(dst, ["id"], options, batch_rows=1)):
        raise FileNotFoundError(f"{redact_uri(dst)}: no Parquet parts (not a transcription output folder)")
    side = posixpath.join(path, SIDECAR_DIR)
    fs.makedirs(side, exist_ok=True)

    def save(fig, name):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        with fs.open(posixpath.join(side, name), "wb") as fh:
            fh.write(buf.getvalue())
        return name

    summary = None
    if fs.exists(posixpath.join(path, SUMMARY_NAME)):
        with fs.open(posixpath.join(path, SUMMARY_NAME)) as fh:
            summary = json.load(fh)
    data = report_data(iter_output(dst, COLUMNS, options))
    data["started_at"] = (summary or {}).get("started_at")
    data["wall_seconds"] = (summary or {}).get("wall_seconds")
    page = render_html(dst, data, summary, plots(data, save))
    with fs.open(posixpath.join(side, REPORT_NAME), "w") as fh:
        fh.write(page)
    return sidecar_path(redact_uri(dst), REPORT_NAME)
