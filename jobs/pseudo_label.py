"""Pseudo-label audio for training: `shardscribe pseudo-label --input SRC --output DST
[--min-confidence C | --keep-fraction F]`.

Runs the transcribe job into DST (same inputs, options, commit protocol and resume; the
filters of the ``filters`` config section run in its pass and write ``filter_reasons``),
then picks the rows to keep (no error, no filter reason, confidence at least C or among
the top fraction F; pipeline.pseudo_label) and writes, in DST/__pseudo_label/:
``manifest.jsonl`` (NeMo: audio_filepath, offset, duration, text of the kept utterances),
``dataset/`` (the same utterances as Parquet, for ``datasets.load_dataset("parquet",
data_dir=...)``), ``_report.json`` and ``pseudo_label.png``. DST's own Parquet keeps
every row. Needs matplotlib for the figure (`pip install shardscribe[report]`).
"""
from __future__ import annotations

import argparse
import sys

from ..actors.job.spec import JobError, JobSpec
from . import transcribe

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
                      help="keep the best round(F x n) of the n rows that pass the filters (halves "
                           "rounded up: 0.8 of 7 keeps 6, 0.5 of 5 keeps 3), ranked by "
                           "pseudo_label.rank_by (default: fewest excess expected word errors)")


def run(args: argparse.Namespace) -> int:
    from ..actors.job import pseudo_label_spec
    from ..actors.job.pseudo_label import check_plotting

    try:
        check_plotting()
    except JobError as exc:
        print(f"shardscribe: error: {exc}", file=sys.stderr)
        return 2
    spec = pseudo_label_spec(transcribe.spec_from_args(args))
    code = transcribe.execute(spec)
    if code != 0 or spec.dry_run:    # a dry run writes no rows, so no exports either
        return code
    return export(args, spec)


def export(args: argparse.Namespace, spec: JobSpec | None = None) -> int:
    """The keep rule and the exports over DST's rows (the transcribe job committed them;
    actors.job.export_pseudo_labels), and what they kept, on the console. ``spec``: the
    job's (default: read from ``args``' input, output, config, overrides and model)."""
    from ..actors.job import export_pseudo_labels

    if spec is None:
        spec = JobSpec(input=args.input, output=args.output, config=args.config, overrides=transcribe.overrides_of(args),
                       model=args.model, audio_column=args.audio_column, text_column=args.text_column)
    data, written = export_pseudo_labels(spec, args.min_confidence, args.keep_fraction)
    print(f"Pseudo-labels: kept {data['kept']} of {data['rows']} rows ({data['errors']} errors, "
          f"{data['filtered']} filtered), {data['utterances']} utterances, {data['utterance_seconds']:.1f} s")
    for url in written:
        print(f"  {url}")
    if (args.min_confidence is not None or args.keep_fraction is not None) and not data["with_confidence"]:
        print("shardscribe: warning: no row carries a confidence (this decoder or model writes none), so "
              "--min-confidence/--keep-fraction kept nothing", file=sys.stderr)
    return 0
