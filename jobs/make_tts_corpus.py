"""Render the synthetic speech corpus for the CTC draft head: the CTC drafts of
"Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts".

    shardscribe make-tts-corpus --output DIR --num N [--seed S] [--heldout-voice N]
                                [--heldout-text N] [--workers W]

Writes DIR/audio/*.flac, DIR/manifest.jsonl (all rows), DIR/{train,heldout_voice,
heldout_text}.jsonl and DIR/summary.json. Same seed and sizes give the same corpus.
"""
from __future__ import annotations

import argparse
import json

COMMAND = "make-tts-corpus"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--num", type=int, required=True, help="utterances in all splits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout-voice", type=int, default=150,
                        help="utterances by held-out voices (train-pool texts)")
    parser.add_argument("--heldout-text", type=int, default=150,
                        help="utterances of held-out texts (training voices)")
    parser.add_argument("--domain-share", type=float, default=0.35,
                        help="share of maintenance-domain sentences (rest: prose)")
    parser.add_argument("--augment-share", type=float, default=0.7,
                        help="share of training utterances that are augmented")
    parser.add_argument("--workers", type=int, default=2, help="rendering processes")


def run(args: argparse.Namespace) -> int:
    from ..pipeline.training.tts.corpus import make_corpus

    if args.heldout_voice + args.heldout_text >= args.num:
        raise SystemExit("make-tts-corpus: --num must exceed the held-out sizes")
    summary = make_corpus(args.output, args.num, seed=args.seed,
                          num_heldout_voice=args.heldout_voice,
                          num_heldout_text=args.heldout_text, workers=args.workers,
                          domain_share=args.domain_share, augment_share=args.augment_share)
    print(json.dumps({k: v for k, v in summary.items() if k != "failed"}, indent=1))
    if summary["num_failed"]:
        print(f"make-tts-corpus: {summary['num_failed']} renders failed, e.g. "
              f"{summary['failed'][0]['error']}")
    return 0 if summary["num_rows"] else 1
