"""Whisper's log-mel features computed on the model's device (pipeline.models.whisper.log_mel)
against transformers' WhisperFeatureExtractor on real audio: the bundled samples and the
held-out clips of the golden set, in one batch of mixed lengths (each clip's floor at 8
below its own peak must stay per clip), at 80 and 128 mel bins, with and without a clip
that fills the 30-s window.

Tolerances (the features live in about [-1.5, 2.5]): against the extractor's float32 torch
path, max abs error <= 1e-4 and relative error (L2 of the difference over L2 of the
reference) <= 1e-6; against its float64 numpy path, an independent computation
(transformers' own STFT and power spectrum), max abs <= 2e-3 and relative <= 1e-4. The
adapter's greedy tokens are the same with either.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from shardscribe.pipeline.audio import SAMPLE_RATE, decode_audio
from shardscribe.pipeline.models.whisper.log_mel import DeviceLogMel

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"


def _clips(samples_dir, sample_manifest) -> list[np.ndarray]:
    held = [json.loads(x) for x in (GOLDEN / "heldout.jsonl").read_text().splitlines()][::5]
    paths = [samples_dir / m["audio"] for m in sample_manifest] + [GOLDEN / h["audio"] for h in held]
    return [decode_audio(p.read_bytes())[0] for p in paths]


def _errors(ours: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    diff = ours.astype(np.float64) - ref.astype(np.float64)
    return float(np.abs(diff).max()), float(np.linalg.norm(diff) / np.linalg.norm(ref))


@pytest.mark.parametrize("bins,longest_s", [(80, 0), (128, 0), (80, 29.99), (80, 31.0)])
def test_device_features_equal_the_feature_extractor(samples_dir, sample_manifest, bins, longest_s):
    """``longest_s``: a clip of that length joins the batch (0: none), so the transform
    spans the whole window (and past it: the extractor cuts at 30 s) instead of the
    short clips' part of it."""
    clips = _clips(samples_dir, sample_manifest)
    if longest_s:
        joined = np.concatenate(clips * 20)[:int(longest_s * SAMPLE_RATE)]
        assert len(joined) == int(longest_s * SAMPLE_RATE)
        clips.append(joined)
    lengths = sorted(len(c) for c in clips)
    assert lengths[0] < lengths[-1] / 2, "the batch must mix lengths (a per-batch floor would show)"
    fe = WhisperFeatureExtractor(feature_size=bins)
    assert DeviceLogMel.supports(fe)
    ours = DeviceLogMel(fe, "cpu")(clips).numpy()
    ref = fe(clips, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
    assert ours.shape == ref.shape == (len(clips), bins, 3000)
    max_abs, rel = _errors(ours, ref)
    assert max_abs <= 1e-4 and rel <= 1e-6, (max_abs, rel)
    # The float64 numpy path, clip by clip (padded to the window as the extractor pads);
    # slow, so on the shortest and the longest clip.
    ends = [int(np.argmin([len(c) for c in clips])), int(np.argmax([len(c) for c in clips]))]
    padded = np.stack([np.pad(clips[i][:fe.n_samples], (0, max(0, fe.n_samples - len(clips[i])))) for i in ends])
    numpy_ref = fe._np_extract_fbank_features(padded.astype(np.float64), "cpu")
    max_abs, rel = _errors(ours[ends], numpy_ref)
    assert max_abs <= 2e-3 and rel <= 1e-4, (max_abs, rel)


def test_each_clip_keeps_its_own_floor(samples_dir, sample_manifest):
    """A quiet clip batched with a loud one: its features are those it has alone."""
    fe = WhisperFeatureExtractor(feature_size=80)
    loud, quiet = _clips(samples_dir, sample_manifest)[:2]
    quiet = quiet * 1e-3
    mel = DeviceLogMel(fe, "cpu")
    together = mel([loud, quiet]).numpy()
    alone = mel([quiet]).numpy()
    assert np.abs(together[1] - alone[0]).max() <= 1e-5
    assert np.abs(together[1] - together[0]).max() > 0.1


def test_unsupported_settings_fall_back_to_the_extractor():
    assert not DeviceLogMel.supports(WhisperFeatureExtractor(feature_size=80, dither=1.0))
    assert not DeviceLogMel.supports(WhisperFeatureExtractor(feature_size=80, do_normalize=True))


@pytest.mark.slow
def test_adapter_tokens_unchanged(whisper_adapter, sample_audio):
    """The adapter's greedy tokens from the device features equal those from the
    extractor's features on the bundled samples."""
    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode

    audios = list(sample_audio.values())[:4]
    fe = whisper_adapter.processor.feature_extractor
    ref = fe(audios, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features.to(whisper_adapter.encoder_dtype)
    with torch.inference_mode():
        feats = whisper_adapter.features(audios)
        assert torch.equal(feats.isfinite(), torch.ones_like(feats, dtype=torch.bool))
        ours = greedy_decode(whisper_adapter, whisper_adapter.run_encoder(feats))
        theirs = greedy_decode(whisper_adapter, whisper_adapter.run_encoder(ref))
    assert ours == theirs
