"""Window packing for the CTC path on the golden set (47 clips): one clip per window,
shared 30-s windows (full attention: a clip's states depend on its neighbours), and
isolated packing (block-diagonal attention: they do not). Prints corpus WER of the greedy
CTC draft, encoder seconds, and how many clips keep their text when batched in another
order and batch size. Not run in CI.

    PYTHONPATH=. .venv/bin/python scripts/pack_isolation.py [--cache DIR]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from pipeline.audio import decode_audio
from pipeline.metrics import corpus_wer
from pipeline.models.whisper.adapter import load_whisper_adapter
from pipeline.sources import read_bytes, read_source

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    adapter = load_whisper_adapter("embedded", cache_dir=args.cache, ctc_head="embedded")
    rows = (read_source(str(ROOT / "pipeline/assets/samples/samples.jsonl"))
            + read_source(str(ROOT / "tests/golden/heldout.jsonl")))
    audios = [decode_audio(read_bytes(r))[0] for r in rows]
    refs = [r["reference"] for r in rows]
    modes = {"one clip per window": adapter.encode,
             "shared windows": lambda a: adapter.encode_packed(a, keep_windows=True),
             "isolated packing": adapter.encode_packed}

    def run(encode, order, batch):
        texts, seconds = {}, 0.0
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            start = time.perf_counter()
            enc = encode([audios[i] for i in idx])
            seconds += time.perf_counter() - start
            texts.update(zip(idx, (t.strip() for t in adapter.ctc_draft(enc).texts)))
        return [texts[i] for i in range(len(audios))], seconds

    order = list(range(len(audios)))
    for name, encode in modes.items():
        texts, seconds = run(encode, order, 8)
        other, _ = run(encode, order[::-1], 5)
        same = sum(a == b for a, b in zip(texts, other))
        print(f"{name:20s} WER {100 * corpus_wer(refs, texts):6.2f}%  encoder {seconds:6.1f} s  "
              f"same text in other batches {same}/{len(texts)}", flush=True)


if __name__ == "__main__":
    main()
