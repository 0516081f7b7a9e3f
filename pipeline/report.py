"""A one-page HTML report of a finished output folder, with PNG plots beside it: throughput
over time (from each row's ``finished_at``), stage shares (segments by decoding stage and
time by pipeline step), the duration histogram, WER by stage and by duration bucket where
references exist, and the errors table.

Reads only the Parquet parts (and the summary where there is one), so it works on any
output folder, resumed or not; written into the folder's sidecar folder.
"""
from __future__ import annotations

import html
import json
import posixpath
from collections import Counter, defaultdict

from pipeline.metrics import word_error_counts
from pipeline.output import SIDECAR_DIR, SUMMARY_NAME, error_kind, iter_output, sidecar_path
from pipeline.storage import redact_uri

REPORT_NAME = "report.html"
DURATION_BUCKETS = [(0, 5), (5, 10), (10, 30), (30, 60), (60, float("inf"))]
COLUMNS = ["id", "duration_s", "text", "reference", "segments", "stage", "error", "t_prepare_s",
           "t_encode_s", "t_decode_s", "t_fallback_s", "finished_at"]
STEP_TIMES = [("prepare", "t_prepare_s"), ("encode", "t_encode_s"), ("decode", "t_decode_s"),
              ("fallback", "t_fallback_s")]


def bucket_name(low: float, high: float) -> str:
    return f"{low:g}-{high:g} s" if high != float("inf") else f">= {low:g} s"


class _Wer:
    """Word errors and reference words summed over batches (their ratio is the corpus WER),
    and the rows counted."""

    def __init__(self):
        self.errors = self.words = self.rows = 0

    def add(self, pairs: list[tuple[str, str]]) -> None:
        if pairs:
            e, w = word_error_counts([a for a, _ in pairs], [b for _, b in pairs])
            self.errors, self.words, self.rows = self.errors + e, self.words + w, self.rows + len(pairs)

    def value(self):
        return self.errors / self.words if self.words else None


def report_data(batches) -> dict:
    """Everything the page shows, from output rows given a batch (a list of dicts) at a time
    (``iter_output``), so a million-row output is never held whole."""
    segment_stages: Counter = Counter()
    step_seconds = {name: 0.0 for name, _ in STEP_TIMES}
    total, by_stage, by_bucket = _Wer(), defaultdict(_Wer), defaultdict(_Wer)
    errors: dict[str, dict] = {}
    finished, durations, n_rows, audio_s = [], [], 0, 0.0
    for rows in batches:
        n_rows += len(rows)
        pairs_stage, pairs_bucket, pairs = defaultdict(list), defaultdict(list), []
        for r in rows:
            for name, col in STEP_TIMES:
                step_seconds[name] += r.get(col) or 0.0
            audio_s += r["duration_s"] or 0.0
            if r.get("finished_at"):
                finished.append((r["finished_at"], r["duration_s"] or 0.0))
            if r["error"]:
                e = errors.setdefault(error_kind(r["error"]), {"count": 0, "ids": [], "message": r["error"]})
                e["count"] += 1
                if len(e["ids"]) < 3:
                    e["ids"].append(r["id"])
                continue
            segment_stages.update(sg["stage"] for sg in (r["segments"] or []))
            if r["duration_s"]:
                durations.append(r["duration_s"])
            if r["reference"]:
                pair = (r["reference"], r["text"] or "")
                pairs.append(pair)
                pairs_stage[r["stage"]].append(pair)
                for low, high in DURATION_BUCKETS:
                    if low <= (r["duration_s"] or 0.0) < high:
                        pairs_bucket[bucket_name(low, high)].append(pair)
        total.add(pairs)
        for key, group in pairs_stage.items():
            by_stage[key].add(group)
        for key, group in pairs_bucket.items():
            by_bucket[key].add(group)
    order = [bucket_name(low, high) for low, high in DURATION_BUCKETS]
    return {"rows": n_rows, "errors": sum(e["count"] for e in errors.values()), "audio_s": audio_s,
            "durations": durations, "segment_stages": dict(segment_stages.most_common()),
            "step_seconds": step_seconds, "wer": total.value(), "wer_rows": total.rows,
            "wer_by_stage": {k: (w.value(), w.rows) for k, w in sorted(by_stage.items())},
            "wer_by_bucket": {k: (by_bucket[k].value(), by_bucket[k].rows) for k in order if k in by_bucket},
            "errors_table": dict(sorted(errors.items(), key=lambda kv: -kv[1]["count"])),
            "finished": sorted(finished)}


def _plots(data: dict, save) -> list[tuple[str, str]]:
    """(file name, caption) of each PNG written through ``save(fig, name)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    if data["finished"]:
        # From the last run's start where the summary has it (else the first finished row).
        t0 = min(data["finished"][0][0], data.get("started_at") or float("inf"))
        minutes = [0.0] + [(t - t0) / 60 for t, _ in data["finished"]]
        audio_h, total = [0.0], 0.0
        for _, d in data["finished"]:
            total += d
            audio_h.append(total / 3600)
        fig, ax = plt.subplots(figsize=(7, 3.2))
        ax.step(minutes, range(len(minutes)), where="post", color="tab:blue")
        ax.set_xlabel("minutes since the start" if data.get("started_at") else "minutes since the first finished row")
        ax.set_ylabel("recordings finished", color="tab:blue")
        ax2 = ax.twinx()
        ax2.step(minutes, audio_h, where="post", color="tab:orange")
        ax2.set_ylabel("audio hours finished", color="tab:orange")
        ax.set_title("Throughput over time")
        out.append((save(fig, "report_throughput.png"), "Recordings and audio hours finished over time"))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
    stages = data["segment_stages"] or {"(none)": 0}
    a1.barh(list(stages), list(stages.values()), color="tab:green")
    a1.set_title("Segments by decoding stage")
    a1.invert_yaxis()
    steps = {k: v for k, v in data["step_seconds"].items() if v > 0} or {"(none)": 0}
    a2.barh(list(steps), list(steps.values()), color="tab:purple")
    a2.set_title("Time by pipeline step (s)")
    a2.invert_yaxis()
    fig.tight_layout()
    out.append((save(fig, "report_stages.png"), "Stage shares: segments per stage, seconds per step"))
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.hist(data["durations"] or [0.0], bins=30, color="tab:gray")
    ax.set_xlabel("recording duration (s)")
    ax.set_ylabel("recordings")
    ax.set_title("Duration histogram")
    out.append((save(fig, "report_durations.png"), "Recording durations (rows without an error)"))
    if data["wer_by_stage"] or data["wer_by_bucket"]:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
        for ax, table, title in ((a1, data["wer_by_stage"], "WER by stage (%)"),
                                 (a2, data["wer_by_bucket"], "WER by duration (%)")):
            names = list(table)
            ax.bar(names, [100 * (table[n][0] or 0.0) for n in names], color="tab:red")
            ax.set_title(title)
            ax.tick_params(axis="x", rotation=30)
        fig.tight_layout()
        out.append((save(fig, "report_wer.png"), "WER by recording stage and by duration bucket"))
    plt.close("all")
    return out


def _table(header: list[str] | None, rows: list[list]) -> str:
    head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def render_html(dst: str, data: dict, summary: dict | None, plots: list[tuple[str, str]]) -> str:
    facts = [["rows", data["rows"]], ["errors", data["errors"]], ["audio", f"{data['audio_s'] / 3600:.2f} h"]]
    if summary:
        if summary.get("wall_seconds"):
            facts.append(["wall time of the last run", f"{summary['wall_seconds']:.1f} s"])
        if summary.get("rtfx"):
            facts.append(["RTFx of the last run", f"{summary['rtfx']:.1f}"])
        if summary.get("config"):
            facts.append(["config", f"{summary['config']} ({summary.get('config_hash', '')})"])
    if data["wer"] is not None:
        facts.append(["WER", f"{_pct(data['wer'])} over {data['wer_rows']} rows with a reference"])
    parts = [f"<h1>shardscribe report</h1><p class=dst>{html.escape(redact_uri(dst))}</p>", _table(None, facts)]
    for name, caption in plots:
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
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .6em;"
             "text-align:left}figure{margin:1em 0}img{max-width:100%}.dst{color:#666}")
    return (f"<!doctype html><html><head><meta charset=utf-8><title>shardscribe report</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")


def write_report(dst: str, options: dict | None = None) -> str:
    """Write the report of output folder ``dst`` (opened with the storage ``options``);
    returns the URL of the HTML page."""
    import io

    from pipeline.storage import url_to_fs

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
    page = render_html(dst, data, summary, _plots(data, save))
    with fs.open(posixpath.join(side, REPORT_NAME), "w") as fh:
        fh.write(page)
    return sidecar_path(redact_uri(dst), REPORT_NAME)
