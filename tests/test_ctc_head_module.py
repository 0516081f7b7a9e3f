"""The CTC head module, its files, training determinism and the calibration table
(no Whisper needed: random encoder states)."""
from __future__ import annotations

import math

import pytest
import torch

from shardscribe.pipeline.models.whisper.ctc_head import CTCHead, CTCHeadConfig, load_ctc_head, save_ctc_head
from shardscribe.pipeline.training.ctc_head_train import calibration_table, length_batches, train_head

torch.set_num_threads(1)


def small_head(seed=0, d=32, frame_stack=1):
    torch.manual_seed(seed)
    return CTCHead(CTCHeadConfig(d_model=d, dropout=0.0, frame_stack=frame_stack)).eval()


def test_reverse_index_matches_brute_force():
    lengths = torch.tensor([5, 1, 3])
    idx = CTCHead.reverse_index(lengths, 5)
    for row, n in zip(idx.tolist(), lengths.tolist()):
        assert row == list(range(n - 1, -1, -1)) + list(range(n, 5))


@pytest.mark.parametrize("frame_stack", [1, 2, 3])
def test_padded_batch_equals_single_rows(frame_stack):
    head = small_head(frame_stack=frame_stack)
    lengths = torch.tensor([40, 17, 1, 33])
    states = torch.randn(4, 40, 32)
    with torch.no_grad():
        batch = head(states, lengths)
        for i, n in enumerate(lengths.tolist()):
            alone = head(states[i:i + 1, :n], lengths[i:i + 1])[0]
            torch.testing.assert_close(batch[i, :n], alone, atol=1e-5, rtol=1e-5)
            # Garbage in the padding must not leak into valid frames.
            noisy = states.clone()
            noisy[i, n:] = 1e3
            torch.testing.assert_close(head(noisy, lengths)[i, :n], alone, atol=1e-5, rtol=1e-5)
        assert batch.shape == (4, 40, 96)


def test_bidirectional_context_is_used():
    head = small_head()
    states = torch.randn(1, 20, 32)
    with torch.no_grad():
        base = head(states, torch.tensor([20]))
        changed = states.clone()
        changed[0, 15] += torch.randn(32)  # (a constant shift would vanish in LayerNorm)
        out = head(changed, torch.tensor([20]))
    assert (out[0, 5] - base[0, 5]).abs().max() > 1e-4   # a later frame moves an earlier one
    assert (out[0, 19] - base[0, 19]).abs().max() > 1e-4


def test_save_load_round_trip(tmp_path):
    head = small_head()
    save_ctc_head(head, tmp_path, extra={"seed": 3})
    back = load_ctc_head(tmp_path)
    for (k, a), (_, b) in zip(head.state_dict().items(), back.state_dict().items()):
        torch.testing.assert_close(a.half().float(), b, msg=k)
    assert back.config.d_model == 32


def _toy_rows(n=24, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    words = ["pump", "valve", "Check 4.", "OK"]
    rows = []
    for i in range(n):
        text = words[i % len(words)]
        rows.append({"id": str(i), "text": text, "split": "heldout_voice",
                     "states": torch.randn(3 * len(text) + 4, d, generator=g).half()})
    return rows


def test_training_is_deterministic_given_a_seed():
    rows = _toy_rows()
    heads = []
    for _ in range(2):
        torch.manual_seed(7)
        head = CTCHead(CTCHeadConfig(d_model=32, dropout=0.1))
        curve = train_head(head, rows, rows[:4], epochs=3, lr=3e-3, seed=7, frame_budget=200,
                           log=lambda m: None)
        heads.append((head.state_dict(), curve))
    (a, ca), (b, cb) = heads
    assert [p["train_loss"] for p in ca] == [p["train_loss"] for p in cb]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert ca[-1]["train_loss"] < ca[0]["train_loss"]


def test_stopping_early_reproduces_the_first_epochs_of_the_full_run():
    rows = _toy_rows()
    curves = []
    for stop in (None, 2):
        torch.manual_seed(3)
        head = CTCHead(CTCHeadConfig(d_model=32, dropout=0.1))
        curves.append(train_head(head, rows, rows[:4], epochs=4, lr=3e-3, seed=3,
                                 frame_budget=200, stop_after_epoch=stop, log=lambda m: None))
    full, short = curves
    assert len(full) == 4 and len(short) == 2
    for a, b in zip(full, short):
        assert (a["train_loss"], a["eval_cer"]) == (b["train_loss"], b["eval_cer"])


def test_length_batches_cover_every_row_once_under_budget():
    import random

    lengths = [random.Random(i).randint(5, 300) for i in range(200)]
    batches = length_batches(lengths, 1000, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 1000 for b in batches)


def test_calibration_table_counts_and_exactness():
    rows = [{"text": t} for t in ["Check pump 4.", "Hello there.", "Open valve 7.", "A b."]]
    drafts = ["check pump 4", "Hello, there!", "Open valve 1.", ""]
    entropy = [0.05, 0.3, 0.3, 5.0]
    table = calibration_table(rows, drafts, entropy)
    assert sum(r["utterances"] for r in table) == 4
    first = table[0]
    assert first["utterances"] == 1 and first["exact"] == 1.0   # normalised match
    mid = next(r for r in table if r["max_entropy"] == "[0.25, 0.5)")
    assert mid["utterances"] == 2 and mid["exact"] == 0.5
    assert table[-1]["accepted_if_tau_is_upper_edge"] == 1.0
    assert math.isclose(table[-1]["exact_among_accepted"], 0.5)
