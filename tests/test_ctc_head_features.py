"""Frozen-encoder feature cache: valid frames only, packing keeps each utterance's frame
count, finished shards are reused, held-out rows carry Whisper's AR text."""
from __future__ import annotations

import json
import math

import soundfile as sf

from conftest import espeak

from pipeline.models.whisper.ctc_features import cache_features, load_cached

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
