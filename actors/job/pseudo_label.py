"""Pseudo-labels from Python: the transcription job with confidence on, then the keep rule
and the exports over its rows (pipeline.pseudo_label), in
DST/__pseudo_label/."""
from __future__ import annotations

import dataclasses

from .spec import JobError, JobSpec


def check_rule(min_confidence: float | None, keep_fraction: float | None) -> None:
    """What the command line's parser checks of the keep rule."""
    if min_confidence is not None and keep_fraction is not None:
        raise JobError("--min-confidence and --keep-fraction: pick one keep rule")
    if min_confidence is not None and not 0.0 <= min_confidence <= 1.0:
        raise JobError(f"--min-confidence: must be in [0, 1], got {min_confidence}")
    if keep_fraction is not None and not 0.0 < keep_fraction <= 1.0:
        raise JobError(f"--keep-fraction: must be in (0, 1], got {keep_fraction}")


def check_plotting() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise JobError("pseudo-label's figure needs matplotlib: pip install 'shardscribe[report]'") from None


def pseudo_label_spec(spec: JobSpec) -> JobSpec:
    """``spec`` with confidence on: it is off in plain transcription (an extra decoder pass
    for attention decoders), and the keep rule needs it. An explicit
    ``confidence.enabled=...`` override wins."""
    if any(o.split("=", 1)[0].strip() == "confidence.enabled" for o in spec.overrides):
        return spec
    return dataclasses.replace(spec, overrides=["confidence.enabled=true"] + list(spec.overrides))


def run_pseudo_label(spec: JobSpec, min_confidence: float | None = None, keep_fraction: float | None = None,
                     on_progress=None, log=None) -> dict:
    """The job (``run_job`` of ``spec`` with confidence on), then the exports; returns
    ``{"summary": the job's summary, "report": the export's report, "written": its URLs}``
    (a dry run: ``{"summary": what the job would do}``, nothing exported)."""
    from .run import run_job

    check_rule(min_confidence, keep_fraction)
    check_plotting()
    spec = pseudo_label_spec(spec)
    summary = run_job(spec, on_progress=on_progress, log=log)
    if spec.dry_run:
        return {"summary": summary}
    data, written = export_pseudo_labels(spec, min_confidence, keep_fraction)
    return {"summary": summary, "report": data, "written": written}


def export_pseudo_labels(spec: JobSpec, min_confidence: float | None, keep_fraction: float | None
                         ) -> tuple[dict, list[str]]:
    """The keep rule and the exports over DST's rows (the job committed them), in two
    streamed passes: the rows' statistics to rank them, then the kept rows' segments into
    utterances, a batch at a time. Returns the report and the URLs written."""
    from ...pipeline.config import load_config
    from ...pipeline.output import iter_output
    from ...pipeline.pseudo_label import ExportWriter, UtteranceTally, keep_flags, report_data, row_stat, utterances

    cfg = load_config(spec.config, list(spec.overrides), model=spec.model)
    pl = cfg.pseudo_label
    stats = [row_stat(r) for rows in iter_output(spec.output, _STAT_COLUMNS, cfg.storage.options) for r in rows]
    kept = keep_flags(stats, min_confidence, keep_fraction, pl.rank_by, pl.filter_unit)
    kept_ids = {s.id for s, keep in zip(stats, kept) if keep}
    spans = _SourceSpans(spec)
    tally = UtteranceTally()
    writer = ExportWriter(spec.output, cfg.storage.options)
    try:
        for rows in iter_output(spec.output, _EXPORT_COLUMNS, cfg.storage.options):
            for row in rows:
                if row["id"] not in kept_ids:
                    continue
                kept_ids.discard(row["id"])     # a duplicated id (two runs' parts) exports once
                if spans.from_table(row):
                    tally.left_out_no_audio_path += 1
                    continue
                pieces, lost = utterances(row, pl.max_utterance_s, spans.offset(row), tally)
                tally.add(pieces)
                tally.left_out_too_long += lost
                writer.add(pieces)
    finally:
        writer.close()
    rule = {"min_confidence": min_confidence, "keep_fraction": keep_fraction, "rank_by": pl.rank_by,
            "max_utterance_s": pl.max_utterance_s, "filter_unit": pl.filter_unit}
    data = report_data(stats, kept, tally, rule, pl.reliability_bins, pl.rank_by)
    return data, writer.finish(data)


# The keep rule reads no segment text and no word times: only what row_stat keeps.
_STAT_COLUMNS = ["id", "text", "reference", "error", "segments", "filter_reasons", "confidence"]
_EXPORT_COLUMNS = ["id", "audio", "offset_s", "segments", "confidence"]


class _SourceSpans:
    """Where a kept row's audio is: its offset in its file (the output's ``offset_s``), and
    whether it came as bytes in a table (``<table file>#<row>``: no file for a manifest to
    point at). Reads no audio; the input is listed once."""

    def __init__(self, spec: JobSpec):
        from ...pipeline.sources import open_source
        from ...pipeline.storage import redact_uri

        self._spec = spec
        source = open_source(spec.input, spec.audio_column, spec.text_column)
        self._kind = source.kind
        self._tables = {redact_uri(f) for f in source.files} if source.kind == "table" else set()
        self._manifest_offsets: dict[str, float] | None = None

    def from_table(self, row: dict) -> bool:
        head, sep, tail = (row.get("audio") or "").rpartition("#")
        return bool(sep) and tail.isdigit() and head in self._tables

    def offset(self, row: dict) -> float | None:
        if row.get("offset_s") is not None:
            return row["offset_s"]
        if self._kind != "manifest":
            return None
        # A part written before the output had offset_s: the manifest says (it holds no audio).
        if self._manifest_offsets is None:
            from ...pipeline.sources import read_source

            self._manifest_offsets = {r["id"]: r["offset_s"] for r in read_source(
                self._spec.input, self._spec.audio_column, self._spec.text_column) if r.get("offset_s")}
        return self._manifest_offsets.get(row["id"])
