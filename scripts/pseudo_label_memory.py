"""Peak memory and wall time of `shardscribe pseudo-label`'s export step over a synthetic
output folder: `python scripts/pseudo_label_memory.py DIR N` (run in the repository root)
writes N rows (20 words each, references present) under DIR once, then runs
jobs.pseudo_label.export with --keep-fraction 0.8 and prints the figures
(docs/pseudo_label.md, "At scale")."""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from jobs.pseudo_label import export
from pipeline.records import OUTPUT_SCHEMA, table

PART_ROWS = 10000


def write_output(root: Path, n: int) -> None:
    dst = root / "out"
    dst.mkdir(parents=True)
    words = [{"word": f"w{j}", "start": 0.1 * j, "end": 0.1 * j + 0.08, "confidence": 0.9} for j in range(20)]
    text = " ".join(w["word"] for w in words)
    with open(root / "m.jsonl", "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"r{i}", "audio": f"/a/{i}.wav"}) + "\n")
    for p in range(0, n, PART_ROWS):
        rows = [{"id": f"r{i}", "audio": f"/a/{i}.wav", "offset_s": 0.0, "duration_s": 2.5, "text": text,
                 "reference": text, "confidence": 0.9, "error": None, "filter_reasons": [],
                 "segments": [{"start": 0.0, "end": 2.0, "text": text, "error": None, "filter_reasons": [],
                               "words": words}]}
                for i in range(p, min(n, p + PART_ROWS))]
        pq.write_table(table(rows, OUTPUT_SCHEMA), dst / f"part-{p // PART_ROWS:05d}.parquet")


def main() -> None:
    root, n = Path(sys.argv[1]), int(sys.argv[2])
    if not (root / "out").exists():
        write_output(root, n)
    args = argparse.Namespace(input=str(root / "m.jsonl"), output=str(root / "out"), audio_column=None,
                              text_column=None, config="default", overrides=[], model=None,
                              min_confidence=None, keep_fraction=0.8)
    start = time.perf_counter()
    export(args)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"rows {n}: export {time.perf_counter() - start:.1f} s, peak RSS {peak:.0f} MB", file=sys.stderr)


if __name__ == "__main__":
    main()
