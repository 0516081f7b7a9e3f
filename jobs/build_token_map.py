"""Build a token map for token-map drafting ("Model-free Speculative Decoding for
Transformer-based ASR with Token Map Drafting", Algorithm 1, with its ranking and pruning).

    shardscribe build-token-map --text FILE [FILE ...] --tokenizer MODEL_DIR|embedded
                                [--order N] [--max-len L] [--min-count C] [--min-share S] [--keep M]
                                --output FILE

Each non-empty line of the text files is one transcript, tokenised as the decoder writes it
(pipeline.models.transcript_tokens). Keys are its n-grams of 1..N tokens (default 3, the
paper's best); each keeps the M (default 4) best-ranked continuations of up to L tokens,
pruned below C occurrences and below a share S of the key's (pipeline.decoding.drafting.token_map). FILE is a safetensors file; point
``decoder.token_map`` at it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

COMMAND = "build-token-map"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..pipeline.decoding.drafting.token_map import (DEFAULT_KEEP, DEFAULT_MAX_LEN, DEFAULT_MIN_COUNT, DEFAULT_MIN_SHARE,
                                                        DEFAULT_ORDER)

    parser.add_argument("--text", nargs="+", required=True, help="transcript files, one per line")
    parser.add_argument("--tokenizer", default="embedded", help="'embedded' or the decoder model's directory")
    parser.add_argument("--order", type=int, default=DEFAULT_ORDER, help=f"N, the longest key (default {DEFAULT_ORDER})")
    parser.add_argument("--max-len", type=int, default=DEFAULT_MAX_LEN, help="tokens per continuation")
    parser.add_argument("--min-count", type=int, default=DEFAULT_MIN_COUNT,
                        help="prune keys and continuation tokens seen fewer times")
    parser.add_argument("--min-share", type=float, default=DEFAULT_MIN_SHARE,
                        help=f"prune continuation tokens following their key in less than this share of its "
                             f"occurrences (default {DEFAULT_MIN_SHARE})")
    parser.add_argument("--keep", type=int, default=DEFAULT_KEEP, help="continuations kept per key")
    parser.add_argument("--output", required=True, help="output .safetensors file")


def run(args: argparse.Namespace) -> int:
    from ..pipeline.decoding.drafting.token_map import build_token_map
    from ..pipeline.models.transcript_tokens import load_transcript_tokenizer

    try:
        tok = load_transcript_tokenizer(args.tokenizer)
        lines = []
        for path in args.text:
            with open(path, encoding="utf-8") as fh:
                lines += [line.strip() for line in fh if line.strip()]
        t0 = time.perf_counter()
        token_map = build_token_map((tok.encode(s) for s in lines), order=args.order, max_len=args.max_len,
                                    min_count=args.min_count, keep=args.keep, min_share=args.min_share,
                                    meta={"tokenizer": tok.name, "vocab_size": tok.vocab_size, "sentences": len(lines)})
        token_map.save(args.output)
    except (OSError, ValueError) as exc:
        print(f"build-token-map: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"output": args.output, "sentences": len(lines), "keys": len(token_map.table),
                      "candidates": sum(len(c) for c in token_map.table.values()),
                      "seconds": round(time.perf_counter() - t0, 3), **token_map.meta}, indent=2))
    return 0
