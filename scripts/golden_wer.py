"""Corpus WER of a golden transcripts file (default tests/golden/transcripts.json), per
config, against the references of the manifests the golden test reads.

    PYTHONPATH=. .venv/bin/python scripts/golden_wer.py [TRANSCRIPTS_JSON]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.metrics import corpus_wer
from pipeline.sources import read_source

ROOT = Path(__file__).resolve().parent.parent


def main(path: Path) -> None:
    refs = {}
    for manifest in (ROOT / "pipeline/assets/samples/samples.jsonl", ROOT / "tests/golden/heldout.jsonl"):
        refs.update({r["id"]: r["reference"] for r in read_source(str(manifest)) if r["reference"]})
    golden = json.loads(path.read_text())
    for name, texts in sorted(golden.items()):
        ids = [i for i in texts if i in refs]
        wer = corpus_wer([refs[i] for i in ids], [texts[i] or "" for i in ids])
        print(f"{name:20s} {100 * wer:6.2f}% over {len(ids)} clips")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/golden/transcripts.json")
