"""Frozen-encoder feature cache: valid frames only, packing keeps each utterance's frame
count, finished shards are reused, held-out rows carry Whisper's AR text; the packed
training windows are inference's packing (WhisperAdapter.plan_packing + pack_signals)
but for their random gaps."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import soundfile as sf

from conftest import SAMPLES, espeak

from shardscribe.pipeline.models.whisper.adapter import PACK_GAP_S, SAMPLES_PER_STATE, WINDOW_SAMPLES, WhisperAdapter
from shardscribe.pipeline.training.ctc_features import (TRAIN_GAP_S, cache_features, encode_packed_shard, load_cached,
                                                  plan_training_windows)

TEXTS = ["Open valve 7.", "The pump is running.", "Check the filter before Monday."]


def test_cache_valid_frames_packing_and_reuse(tmp_path, model_cache, monkeypatch):
    import torch

    torch.set_num_threads(1)
    monkeypatch.setenv("SHARDSCRIBE_CACHE", str(model_cache))
    rows, lengths = [], {}
    for i, text in enumerate(TEXTS):
        wav = espeak(text, tmp_path / f"u{i}.wav")
        lengths[f"u{i}"] = sf.info(str(wav)).frames
        rows.append({"id": f"u{i}", "audio": wav.name, "text": text, "split": "heldout_text"})
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    logs = []
    single = load_cached(cache_features(manifest, tmp_path / "cache", log=logs.append))
    packed = load_cached(cache_features(manifest, tmp_path / "cache", pack=True, log=logs.append))
    assert len(logs) == 2
    again = cache_features(manifest, tmp_path / "cache", log=logs.append)
    assert len(logs) == 2 and len(again) == 1   # nothing re-encoded
    for s, p in zip(single, packed):
        n = math.ceil(lengths[s["id"]] * 16000 / sf.info(str(tmp_path / (s["id"] + ".wav"))).samplerate / 320)
        assert abs(s["states"].shape[0] - n) <= 1
        assert s["states"].shape == p["states"].shape and s["states"].shape[1] == 384
        assert s["states"].dtype == torch.float16 and torch.isfinite(s["states"].float()).all()
        assert s["ar_text"] and p["ar_text"] is None


@pytest.mark.parametrize("seed", range(3))
def test_training_windows_are_the_inference_plan_but_for_random_gaps(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(8000, 160000, size=60).tolist()
    order, plan = plan_training_windows(lengths, f"key{seed}")
    assert sorted(order) == list(range(60)) and order != list(range(60))
    assert (order, plan) == plan_training_windows(lengths, f"key{seed}")  # deterministic per key
    lo, hi = (-(-int(g * 16000) // SAMPLES_PER_STATE) * SAMPLES_PER_STATE for g in TRAIN_GAP_S)
    for a, b in zip(plan, plan[1:]):
        assert b.start % SAMPLES_PER_STATE == 0 and b.start + b.length <= WINDOW_SAMPLES
        if b.window == a.window:
            gap = b.start - (-(-(a.start + a.length) // SAMPLES_PER_STATE) * SAMPLES_PER_STATE)
            assert lo <= gap <= hi
    # With inference's fixed gap the training plan is WhisperAdapter.plan_packing's.
    order, plan = plan_training_windows(lengths, f"key{seed}", (PACK_GAP_S, PACK_GAP_S))
    assert plan == WhisperAdapter.plan_packing([lengths[i] for i in order])


def test_packed_training_states_are_the_adapters_packed_states(whisper_adapter, sample_manifest, sample_audio):
    """The same clips, order and gap: encode_packed_shard's frames are exactly what
    WhisperAdapter.encode_packed cuts out of shared windows for each clip (the layout the
    head was trained on; inference packs isolated clips instead, docs/ctc_greedy.md)."""
    import torch

    torch.set_num_threads(1)
    rows = [{"id": m["id"], "audio": str(SAMPLES / m["audio"])} for m in sample_manifest]
    gap = (PACK_GAP_S, PACK_GAP_S)
    feats, timing = encode_packed_shard(whisper_adapter.model, whisper_adapter.processor, rows, "k", gap_s=gap)
    order, plan = plan_training_windows([len(sample_audio[r["id"]]) for r in rows], "k", gap)
    assert 1 < timing["windows"] < len(rows)
    enc = whisper_adapter.encode_packed([sample_audio[rows[i]["id"]] for i in order], keep_windows=True)
    for j, i in enumerate(order):
        n = int(enc.valid_frames[j])
        assert torch.equal(feats[rows[i]["id"]], enc.states[j, :n].to(torch.float16))
