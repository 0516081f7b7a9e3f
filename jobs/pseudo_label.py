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
    if code != 0:
        return code
    return export(args)


def export(args: argparse.Namespace) -> int:
    """The keep rule and the exports over DST's rows (the transcribe job committed them)."""
    from pipeline.config import load_config
    from pipeline.output import read_output
    from pipeline.pseudo_label import keep_flags, report_data, utterances, write_exports
    from pipeline.records import OUTPUT_SCHEMA

    cfg = load_config(args.config, args.overrides, model=args.model)
    wanted = ["id", "audio", "text", "reference", "error", "segments", "filter_reasons", "confidence", "language"]
    out = read_output(args.output, [c for c in wanted if c in OUTPUT_SCHEMA.names], cfg.storage.options)
    rows = out.to_pylist() if out is not None else []
    offsets, no_file = _source_spans(args)
    rank_by = cfg.pseudo_label.rank_by
    kept = keep_flags(rows, args.min_confidence, args.keep_fraction, rank_by)
    utts, unsplit, no_path = [], 0, 0
    for row, keep in zip(rows, kept):
        if not keep:
            continue
        if row["id"] in no_file:
            no_path += 1
            continue
        pieces, lost = utterances(row, cfg.pseudo_label.max_utterance_s, offsets.get(row["id"]))
        utts += pieces
        unsplit += lost
    rule = {"min_confidence": args.min_confidence, "keep_fraction": args.keep_fraction, "rank_by": rank_by,
            "max_utterance_s": cfg.pseudo_label.max_utterance_s}
    data = report_data(rows, kept, utts, unsplit, no_path, rule, cfg.pseudo_label.reliability_bins, rank_by)
    written = write_exports(args.output, utts, data, cfg.storage.options)
    print(f"Pseudo-labels: kept {data['kept']} of {data['rows']} rows ({data['errors']} errors, "
          f"{data['filtered']} filtered), {data['utterances']} utterances, {data['utterance_seconds']:.1f} s")
    for url in written:
        print(f"  {url}")
    if (args.min_confidence is not None or args.keep_fraction is not None) and not data["with_confidence"]:
        print("shardscribe: warning: no row carries a confidence (this decoder or model writes none), so "
              "--min-confidence/--keep-fraction kept nothing", file=sys.stderr)
    return 0


def _source_spans(args) -> tuple[dict[str, float], set[str]]:
    """Per id, where the recording starts in its file (NeMo manifests' offset), and the ids
    whose audio came as bytes (no file for a manifest to point at)."""
    import pyarrow.compute as pc

    from pipeline.sources import ROWS_PER_ITEM, iter_input_batches, open_source

    offsets, no_file = {}, set()
    source = open_source(args.input, args.audio_column, args.text_column)
    for batch in iter_input_batches(source, ROWS_PER_ITEM):
        ids = batch.column("id").to_pylist()
        for i, offset in zip(ids, batch.column("offset_s").to_pylist()):
            if offset:
                offsets[i] = offset
        for i, has_bytes in zip(ids, pc.is_valid(batch.column("audio_bytes")).to_pylist()):
            if has_bytes:
                no_file.add(i)
    return offsets, no_file
