"""Build a token-level n-gram LM (KenLM lmplz) and its NGPU-LM tensors for shallow fusion
(NGPU-LM as "FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities"
describes it, §II-D; the LM is built as in its §IV-A).

    shardscribe build-lm --text FILE [FILE ...] --order N --tokenizer chars|PATH|MODEL --output DIR
    shardscribe build-lm --arpa LM.arpa --tokenizer chars|PATH|MODEL --output DIR

Text lines are tokenised with the decoder's tokenizer ("chars": the CTC head's characters,
LM token = CTC id - 1; a transformers CTC checkpoint directory: its non-blank CTC tokens in
order, as the beam search feeds them; otherwise a tokenizer.json or local transformers model), written
as chr(id + 100) tokens and counted by lmplz (-S, --discount_fallback). DIR receives
lm.arpa, lm.ngpu.safetensors (loaded by decoders) and lm.json. --arpa compiles an existing
token-level ARPA instead; a word-level ARPA is refused with an explanation.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

COMMAND = "build-lm"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text", nargs="+", help="training text files, one sentence per line")
    parser.add_argument("--arpa", help="compile this existing token-level ARPA instead of building one")
    parser.add_argument("--order", type=int, default=6, help="n-gram order (default 6)")
    parser.add_argument("--tokenizer", default="chars",
                        help="'chars', a tokenizer.json (or its directory), or a local model id")
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--memory", default="1G", help="lmplz -S memory budget (default 1G)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="LM vocabulary size when the decoder's is larger than the tokenizer's")
    parser.add_argument("--prune", type=int, nargs="+", default=None,
                        help="lmplz --prune count thresholds per order, e.g. 0 0 1")


def run(args: argparse.Namespace) -> int:
    from ..pipeline.lm.build import build_lm, compile_arpa, load_tokenizer

    if bool(args.text) == bool(args.arpa):
        print("build-lm: give either --text FILE... or --arpa FILE", file=sys.stderr)
        return 2
    problem = _argument_problem(args)
    if problem:
        print(f"build-lm: {problem}", file=sys.stderr)
        return 2
    if args.text and _lmplz() is None:
        print("build-lm: KenLM's lmplz is not installed: install it with `bash scripts/setup.sh --dev` "
              "(the KenLM toolchain, then scripts/build_kenlm.sh)", file=sys.stderr)
        return 2
    created = not Path(args.output).exists()
    try:
        if args.arpa:
            tok = load_tokenizer(args.tokenizer)
            info = compile_arpa(args.arpa, args.output, args.vocab_size or tok.vocab_size, tokenizer=tok.name)
        else:
            info = build_lm(args.text, args.order, args.tokenizer, args.output, memory=args.memory,
                            prune=args.prune, vocab_size=args.vocab_size)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        if created:     # no half-built LM left where a later job would look for one
            shutil.rmtree(args.output, ignore_errors=True)
        print(f"build-lm: {str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__}",
              file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2))
    return 0


def _lmplz() -> Path | None:
    """KenLM's lmplz (build_kenlm.sh's cache, else PATH), compiled here once where the KenLM
    toolchain is installed (cmake: `scripts/setup.sh --dev`); None where it is missing."""
    import subprocess

    from ..pipeline.lm.build import find_lmplz

    try:
        return find_lmplz(build=shutil.which("cmake") is not None)
    except (FileNotFoundError, subprocess.CalledProcessError):
        return None


def _argument_problem(args) -> str | None:
    """What is wrong with the arguments, before anything is read or written."""
    if args.order < 1:
        return "--order must be at least 1"
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        return f"--output {args.output}: exists and is not a directory"
    missing = [f for f in (args.text or []) + ([args.arpa] if args.arpa else []) if not Path(f).is_file()]
    if missing:
        return f"{missing[0]}: no such file"
    if args.prune is not None:
        p = list(args.prune)
        if p[0] != 0 or p != sorted(p) or len(p) > args.order:
            return (f"--prune {' '.join(map(str, p))}: lmplz takes at most one count threshold per order, "
                    "starting at 0 (it does not prune unigrams), none smaller than the one before")
    if not re.fullmatch(r"\d+(\.\d+)?[%bKMGTPEZY]?", args.memory or ""):
        return f"--memory {args.memory!r}: expected a size such as 1G, 500M or 80%"
    return None
