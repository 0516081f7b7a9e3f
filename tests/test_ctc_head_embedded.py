"""The shipped CTC draft head on the frozen Whisper tiny.en encoder: offline load, greedy
text on bundled audio, entropies over valid frames only, padded batch == single rows."""
from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import ROOT

from shardscribe.pipeline.models.whisper.ctc_head import embedded_head_dir, load_embedded_ctc_head
from shardscribe.pipeline.text import charset

HEAD_DIR = ROOT / "pipeline" / "assets" / "ctc_head"
# A held-out-text clip (training voice) bundled with the head, and what the head says.
CLIP = HEAD_DIR / "check_clip.flac"


def test_head_loads_offline_and_is_small(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    head = load_embedded_ctc_head()
    assert embedded_head_dir() == HEAD_DIR
    assert head.config.num_classes == charset.NUM_CLASSES == 96
    assert head.config.d_model == 384
    assert (HEAD_DIR / "head.safetensors").stat().st_size < 5 * 2 ** 20
    assert (HEAD_DIR / "MODEL_CARD.md").exists()
    with torch.no_grad():
        out = head(torch.zeros(1, 10, 384), torch.tensor([10]))
    assert out.shape == (1, 10, 96) and torch.isfinite(out).all()


@pytest.fixture(scope="module")
def head_adapter(model_cache):
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    torch.set_num_threads(1)
    return load_whisper_adapter("embedded", cache_dir=model_cache, ctc_head="embedded")


@pytest.fixture(scope="module")
def clip_audio():
    from shardscribe.pipeline.audio import decode_audio

    meta = json.loads((HEAD_DIR / "check_clip.json").read_text())
    return decode_audio(CLIP.read_bytes())[0], meta


def test_greedy_ctc_on_bundled_audio_gives_expected_text(head_adapter, clip_audio):
    audio, meta = clip_audio
    draft = head_adapter.ctc_draft(head_adapter.encode([audio]))
    assert draft.texts[0] == meta["ctc_text"]
    assert draft.texts[0] == meta["text"]


def test_entropies_are_finite_and_over_valid_frames_only(head_adapter, clip_audio, sample_audio):
    short = next(iter(sample_audio.values()))
    audio, _ = clip_audio
    audios = [audio, short[: len(short) // 2]]
    enc = head_adapter.encode(audios)
    draft = head_adapter.ctc_draft(enc)
    for i, a in enumerate(audios):
        n = math.ceil(len(a) / 320)
        assert int(draft.lengths[i]) == n
        ent = draft.entropy[i]
        assert torch.isfinite(ent).all()
        assert (ent[:n] > 0).all() and (ent[n:] == 0).all()
        # Brute force from the log-probs over the valid frames only.
        lp = draft.log_probs[i, :n].double()
        ref = -(lp.exp() * lp).sum(-1)
        torch.testing.assert_close(ent[:n].double(), ref, atol=1e-5, rtol=1e-5)
        assert math.isclose(float(draft.max_entropy[i]), float(ref.max()), rel_tol=1e-5)
        assert float(ref.max()) <= math.log(96) + 1e-6


def test_padded_batch_equals_single_utterances(head_adapter, sample_audio, clip_audio):
    audios = [clip_audio[0]] + list(sample_audio.values())
    enc = head_adapter.encode(audios)
    batch = head_adapter.ctc_draft(enc)
    for i, a in enumerate(audios):
        alone = head_adapter.ctc_draft(head_adapter.encode([a]))
        assert alone.texts[0] == batch.texts[i]
        n = int(alone.lengths[0])
        torch.testing.assert_close(batch.log_probs[i, :n], alone.log_probs[0, :n],
                                   atol=2e-4, rtol=1e-4)
        assert math.isclose(float(batch.max_entropy[i]), float(alone.max_entropy[0]),
                            rel_tol=1e-3, abs_tol=1e-4)
