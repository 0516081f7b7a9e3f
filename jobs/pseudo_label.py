"""Pseudo-label audio for training: `shardscribe pseudo-label --input SRC --output DST
[--min-confidence C | --keep-fraction F]`.

Runs the transcribe job into DST (same inputs, options, commit protocol and resume; the
filters of the ``filters`` config section run in its pass and write ``filter_reasons``),
then picks the rows to keep (no error, no filter reason, confidence at least C or among
the top fraction F; pipeline.pseudo_label) and writes, under DST/__shardscribe__/pseudo_label/:
``manifest.jsonl`` (NeMo: audio_filepath, offset, duration, text of the kept utterances),
``dataset/`` (the same utterances as Parquet, for ``datasets.load_dataset("parquet",
data_dir=...)``), ``_report.json`` and ``pseudo_label.png``. DST's own Parquet keeps
every row. Needs matplotlib for the figure (`pip install shardscribe[report]`).
"""
from __future__ import annotations

import argparse
import sys

from jobs import transcribe

COMMAND = "pseudo-label"


def _fraction(low_open: bool):
    def parse(text: str) -> float:
        value = float(text)
        if not (0.0 < value <= 1.0 if low_open else 0.0 <= value <= 1.0):
            raise argparse.ArgumentTypeError(f"must be in {'(0' if low_open else '[0'}, 1], got {text}")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    transcribe.add_arguments(parser)
    rule = parser.add_mutually_exclusive_group()
    rule.add_argument("--min-confidence", type=_fraction(False), default=None, metavar="C",
                      help="keep rows whose calibrated confidence is at least C")
    rule.add_argument("--keep-fraction", type=_fraction(True), default=None, metavar="F",
                      help="keep the best fraction F of the rows that pass the filters, ranked by "
                           "pseudo_label.rank_by (default: fewest excess expected word errors)")


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("shardscribe: error: pseudo-label's figure needs matplotlib: pip install 'shardscribe[report]'",
              file=sys.stderr)
        return 2
    # Confidence is off in plain transcription (an extra decoder pass for attention
    # decoders); the keep rule needs it. An explicit --set confidence.enabled=... wins.
    if not any(o.split("=", 1)[0].strip() == "confidence.enabled" for o in args.overrides):
        args.overrides = ["confidence.enabled=true"] + list(args.overrides)
    code = transcribe.run(args)
    if code != 0 or args.dry_run:    # a dry run writes no rows, so no exports either
        return code
    return export(args)


def export(args: argparse.Namespace) -> int:
    """The keep rule and the exports over DST's rows (the transcribe job committed them),
    in two streamed passes: the rows' statistics to rank them, then the kept rows'
    segments into utterances, a batch at a time."""
    from pipeline.config import load_config
    from pipeline.output import iter_output
    from pipeline.pseudo_label import ExportWriter, UtteranceTally, keep_flags, report_data, row_stat, utterances

    cfg = load_config(args.config, args.overrides, model=args.model)
    pl = cfg.pseudo_label
    stats = [row_stat(r) for rows in iter_output(args.output, _STAT_COLUMNS, cfg.storage.options) for r in rows]
    kept = keep_flags(stats, args.min_confidence, args.keep_fraction, pl.rank_by, pl.filter_unit)
    kept_ids = {s.id for s, keep in zip(stats, kept) if keep}
    spans = _SourceSpans(args)
    tally = UtteranceTally()
    writer = ExportWriter(args.output, cfg.storage.options)
    try:
        for rows in iter_output(args.output, _EXPORT_COLUMNS, cfg.storage.options):
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
    rule = {"min_confidence": args.min_confidence, "keep_fraction": args.keep_fraction, "rank_by": pl.rank_by,
            "max_utterance_s": pl.max_utterance_s, "filter_unit": pl.filter_unit}
    data = report_data(stats, kept, tally, rule, pl.reliability_bins, pl.rank_by)
    written = writer.finish(data)
    print(f"Pseudo-labels: kept {data['kept']} of {data['rows']} rows ({data['errors']} errors, "
          f"{data['filtered']} filtered), {data['utterances']} utterances, {data['utterance_seconds']:.1f} s")
    for url in written:
        print(f"  {url}")
    if (args.min_confidence is not None or args.keep_fraction is not None) and not data["with_confidence"]:
        print("shardscribe: warning: no row carries a confidence (this decoder or model writes none), so "
              "--min-confidence/--keep-fraction kept nothing", file=sys.stderr)
    return 0


# The keep rule reads no segment text and no word times: only what row_stat keeps.
_STAT_COLUMNS = ["id", "text", "reference", "error", "segments", "filter_reasons", "confidence"]
_EXPORT_COLUMNS = ["id", "audio", "offset_s", "segments", "confidence"]


class _SourceSpans:
    """Where a kept row's audio is: its offset in its file (the output's ``offset_s``), and
    whether it came as bytes in a table (``<table file>#<row>``: no file for a manifest to
    point at). Reads no audio; the input is listed once."""

    def __init__(self, args: argparse.Namespace):
        from pipeline.sources import open_source
        from pipeline.storage import redact_uri

        self._args = args
        source = open_source(args.input, args.audio_column, args.text_column)
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
            from pipeline.sources import read_source

            self._manifest_offsets = {r["id"]: r["offset_s"] for r in read_source(
                self._args.input, self._args.audio_column, self._args.text_column) if r.get("offset_s")}
        return self._manifest_offsets.get(row["id"])
