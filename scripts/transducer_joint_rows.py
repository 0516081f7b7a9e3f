"""A/B of the transducer beam searches' joint on every hypothesis against only the
hypotheses that expand (``TransducerBeamSearch._joint``, CPU), in one process, on
parakeet-rnnt's predictor and joint (``ParakeetRNNTConfig``'s defaults, random weights,
blank logit raised until greedy emits ~5 tokens per utterance) over random 640-d frames,
32 utterances of 40-63 frames. Checks that the tokens are identical and prints the best
of 3 runs per setting. Not run in CI.

    PYTHONPATH=. .venv/bin/python scripts/transducer_joint_rows.py
"""
from __future__ import annotations

import time

import torch
from transformers import ParakeetFeatureExtractor, ParakeetForRNNT, ParakeetRNNTConfig

from pipeline.decoding.transducer.greedy import transducer_greedy
from pipeline.decoding.transducer.search import TransducerBeamSearch
from pipeline.models.transducer.adapter import TransducerAdapter


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ParakeetRNNTConfig(encoder_config={"num_hidden_layers": 1})
    rnnt = TransducerAdapter(ParakeetForRNNT(cfg).eval(), ParakeetFeatureExtractor(), None)
    frames = torch.randn(32, 63, 640)
    lengths = torch.randint(40, 64, (32,))
    bias = rnnt.model.joint.head.bias
    with torch.no_grad():
        for _ in range(60):
            per_utt = sum(map(len, transducer_greedy(rnnt, frames[:4], lengths[:4]).tokens)) / 4
            if per_utt <= 12:
                break
            bias[rnnt.blank] += 0.5
    print(f"greedy tokens per utterance: {per_utt}")
    for algorithm in ("alsd", "aes"):
        for beam in (4, 8):
            search = TransducerBeamSearch(rnnt, beam, algorithm=algorithm)
            joints = {"all rows": lambda f, p, frozen: search.model.joint(f, p),
                      "live rows": TransducerBeamSearch._joint.__get__(search)}
            best, tokens = {}, {}
            for _ in range(3):
                for name, joint in joints.items():
                    search._joint = joint
                    start = time.perf_counter()
                    tokens[name] = search(frames, lengths).tokens
                    best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
            assert tokens["all rows"] == tokens["live rows"]
            print(f"{algorithm}++ beam {beam}: all rows {best['all rows']:.3f} s, live rows "
                  f"{best['live rows']:.3f} s, {best['all rows'] / best['live rows']:.2f}x")


if __name__ == "__main__":
    main()
