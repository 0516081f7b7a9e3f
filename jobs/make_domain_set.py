"""Render an in-domain speech set on which adapted drafts are measured: station
announcements (pipeline.training.tts.announcements), a text domain no shipped head, map or
threshold saw, for the CTC drafts of "Self-Speculative Decoding for LLM-based ASR with CTC
Encoder Drafts" adapted on the model's own transcripts.

    shardscribe make-domain-set --output DIR [--train 500] [--heldout 100] [--seed S] [--workers W]

Writes DIR/audio/*.flac, DIR/train.jsonl (training voices, train-side sentences: the
unlabelled clips a head adapts on; their `text` is for reference only) and
DIR/heldout.jsonl (held-out voices and held-out sentences), DIR/summary.json.
"""
from __future__ import annotations

import argparse
import json

COMMAND = "make-domain-set"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, help="output directory")
    parser.add_argument("--train", type=int, default=500, help="clips to adapt on")
    parser.add_argument("--heldout", type=int, default=100, help="clips to measure on")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="rendering processes")


def run(args: argparse.Namespace) -> int:
    import random
    from concurrent.futures import ProcessPoolExecutor
    from pathlib import Path

    from ..pipeline.training.tts.announcements import announcements
    from ..pipeline.training.tts.corpus import Job, render, sample_voice

    out = Path(args.output)
    (out / "audio").mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    jobs = []
    for split, n, heldout in (("train", args.train, False), ("heldout", args.heldout, True)):
        for i, s in enumerate(announcements(n, args.seed, heldout=heldout)):
            jobs.append(Job(id=f"{split}_{i:05d}", split=split, domain="announcements", text=s["text"],
                            spoken=s["spoken"], voice=sample_voice(rng, heldout=heldout), augment=False,
                            seed=rng.randrange(2 ** 31)))
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        rows = list(pool.map(render, jobs, [str(out)] * len(jobs), chunksize=8))
    ok = [r for r in rows if "error" not in r]
    for split in ("train", "heldout"):
        with open(out / f"{split}.jsonl", "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in ok if r["split"] == split)
    summary = {"per_split": {s: sum(r["split"] == s for r in ok) for s in ("train", "heldout")},
               "failed": len(rows) - len(ok), "hours": round(sum(r["duration"] for r in ok) / 3600, 3),
               "seed": args.seed}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0 if ok else 1
