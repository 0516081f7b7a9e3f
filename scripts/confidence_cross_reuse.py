"""A/B of the ``ar`` confidence pass with and without greedy decoding's cross-attention K/V
(docs/confidence.md): the pass alone, projecting the encoder states itself against reusing
the K/V greedy decoding left (``greedy_decode(cross_out=...)``), and ``ar`` decoding of the
bundled clips with confidence on against off; best of N, 2 threads.

    PYTHONPATH=. .venv/bin/python scripts/confidence_cross_reuse.py
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from pipeline.audio import decode_audio
from pipeline.confidence.scores import decoder_token_scores
from pipeline.decoders.ar import ARSegmentDecoder
from pipeline.decoding.ar_greedy import greedy_decode
from pipeline.models.whisper.adapter import load_whisper_adapter

SAMPLES = Path(__file__).resolve().parents[1] / "pipeline" / "assets" / "samples"


def best(fn, n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in (SAMPLES / "samples.jsonl").read_text().splitlines() if line.strip()]
    audios = [decode_audio((SAMPLES / r["audio"]).read_bytes())[0] for r in rows]
    adapter = load_whisper_adapter("embedded")
    states = adapter.encode(audios).states
    cross: list = []
    tokens = greedy_decode(adapter, states, cross_out=cross)
    projecting = best(lambda: decoder_token_scores(adapter, states, tokens), 5)
    reusing = best(lambda: decoder_token_scores(adapter, states, tokens, cross_kv=cross), 5)
    print(f"confidence pass: projecting {projecting:.3f} s, reusing {reusing:.3f} s ({projecting / reusing:.2f}x)")
    on, off = ARSegmentDecoder(adapter, confidence=True), ARSegmentDecoder(adapter, confidence=False)
    t_on, t_off = best(lambda: on.decode(audios), 3), best(lambda: off.decode(audios), 3)
    print(f"ar, {len(audios)} clips: confidence on {t_on:.3f} s, off {t_off:.3f} s ({t_on / t_off:.3f}x)")


if __name__ == "__main__":
    main()
