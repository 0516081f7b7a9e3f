"""The embedded transducer's training loop (pipeline.training.transducer_train)
learns, as a TDT and as an RNN-T: on frames that spell their text (each character as two frames of its own random
vector), a small TDT trained for a few seconds decodes held-out words it never saw whole,
and a saved-then-loaded model decodes the same."""
from __future__ import annotations

import random

import pytest
import torch

from shardscribe.pipeline.metrics import corpus_cer
from shardscribe.pipeline.models.transducer.embedded import (EmbeddedTransducer, EmbeddedTransducerConfig,
                                                 load_embedded_transducer, save_embedded_transducer)
from shardscribe.pipeline.training.transducer_train import greedy_texts, train
from shardscribe.pipeline.text import charset

LETTERS = "abcdefgh "


def _rows(n: int, seed: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(charset.NUM_CLASSES, 384, generator=gen)
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        text = "".join(rng.choice(LETTERS) for _ in range(rng.randint(4, 9))).strip() or "a"
        ids = charset.encode(text)
        hidden = table[torch.tensor(ids)].repeat_interleave(2, 0) + 0.1 * torch.randn(2 * len(ids), 384)
        rows.append({"text": text, "hidden": hidden.to(torch.float16), "split": "x"})
    return rows


@pytest.mark.parametrize("durations", [[0, 1, 2], []], ids=["tdt", "rnnt"])
def test_training_learns_to_spell_and_the_saved_model_decodes_the_same(durations, tmp_path):
    torch.manual_seed(0)
    model = EmbeddedTransducer(EmbeddedTransducerConfig(d_model=64, d_joint=64, dropout=0.0, durations=durations))
    held = _rows(24, seed=1)
    before = corpus_cer([r["text"] for r in held], greedy_texts(model, held))
    curve = train(model, _rows(160, seed=0), held, epochs=16, lr=5e-3, seed=0, cell_budget=2_000, log=lambda m: None)
    texts = greedy_texts(model, held)
    after = corpus_cer([r["text"] for r in held], texts)
    assert before > 0.5 and after < 0.1, (before, after, curve)
    assert curve[-1]["train_loss"] < curve[0]["train_loss"]
    loaded = load_embedded_transducer(save_embedded_transducer(model, tmp_path / "m"))
    # fp16 storage: the same text, not bit-equal logits
    assert greedy_texts(loaded, held) == texts
