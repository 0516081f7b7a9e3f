"""Whisper base's language detection with `model.language=auto` (docs/languages.md,
"Language detection"): once per recording over its first 30 s of speech
(`model.language_detection=recording`, the default) or per segment; restricted to
`model.language_candidates`; the keys validated, listed and hashed only with auto.

The clips are sentences of the measurement set (tests/language_set.py) rendered with
espeak-ng: on their own, "Le café est froid." is detected as Chinese and "Ma voisine adore
les chats." as Thai by Whisper base, and decoded in that language."""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from language_set import render

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")]

SHORT_ZH = "fr_00.wav"      # "Le café est froid."
SHORT_TH = "fr_04.wav"      # "Ma voisine adore les chats."
LONG = "fr_18.wav"          # "Nous avons mangé une excellente soupe de poisson ..." (detected fr)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """The clips above as 16-kHz float32 arrays, by file id."""
    from shardscribe.pipeline.audio import decode_audio

    folder = tmp_path_factory.mktemp("language-clips")
    render(folder, [SHORT_ZH, SHORT_TH, LONG])
    return {p.name: decode_audio(p.read_bytes())[0] for p in folder.iterdir()}


@pytest.fixture(scope="module")
def auto_adapter(model_cache):
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter
    from shardscribe.pipeline.models.whisper.loader import EMBEDDED_BASE
    from shardscribe.pipeline.models.whisper.prompting import WhisperOptions

    return load_whisper_adapter(EMBEDDED_BASE, device="cpu", cache_dir=model_cache,
                                options=WhisperOptions(language="auto"))


@pytest.fixture
def with_options(auto_adapter):
    """Sets the adapter's options for one test (``with_options(**changes)``), then restores them."""
    original = auto_adapter.options

    def change(**changes):
        auto_adapter.options = dataclasses.replace(original, **changes)
        return auto_adapter

    yield change
    auto_adapter.options = original


@pytest.mark.slow
def test_candidates_restrict_the_detection(auto_adapter, with_options, clips):
    states = auto_adapter.encode([clips[SHORT_ZH]]).states
    _, languages, probs = auto_adapter.language_prompts(states)
    assert languages == ["zh"], (languages, probs)       # the model alone, on one short sentence
    adapter = with_options(language_candidates=("es", "fr"))
    prompts, languages, probs = adapter.language_prompts(states)
    assert languages == ["fr"] and probs[0] > 0.9, (languages, probs)
    assert prompts[0][1] == adapter.special.lang_to_id["fr"]
    # the probability written is the one among the candidates
    adapter = with_options(language_candidates=("fr",))
    assert adapter.language_prompts(states)[1:] == (["fr"], [pytest.approx(1.0)])


@pytest.mark.slow
def test_recording_detected_once_over_its_joined_segments(auto_adapter, with_options, clips):
    states = auto_adapter.encode([clips[SHORT_TH]]).states
    assert auto_adapter.language_prompts(states)[1] == ["th"]
    found = auto_adapter.detect_recordings([[clips[LONG], clips[SHORT_TH]], [clips[SHORT_TH]], []])
    assert found[0][0] == "fr" and found[0][1] > 0.5, found
    # one segment: its own window is the same audio, detected while it is decoded
    assert found[1:] == [None, None]
    prompts, languages, probs = auto_adapter.language_prompts(states, [found[0]])
    assert (languages, probs) == (["fr"], [found[0][1]])
    assert prompts[0][1] == auto_adapter.special.lang_to_id["fr"]
    assert with_options(language_detection="segment").detect_recordings([[clips[LONG], clips[SHORT_TH]]]) == [None]


@pytest.mark.slow
def test_every_segment_decoded_in_the_recordings_language(auto_adapter, with_options, clips):
    """A recording of two segments (as VAD cuts one longer than 30 s): the short second
    one, detected alone, is Thai and decoded as Thai; detected with the recording, it is
    decoded in French."""
    from shardscribe.pipeline.kinds.ar.stage import ARSegmentDecoder
    from shardscribe.pipeline.segment_runner import transcribe_prepared

    segs = [clips[LONG], clips[SHORT_TH]]
    row = {"id": "r", "audio": "r.wav", "seg_start": [0.0, 30.0], "seg_end": [8.0, 32.0],
           "seg_audio": [np.asarray(s, dtype=np.float32) for s in segs], "error": None}

    def run(adapter):
        out = transcribe_prepared([dict(row)], ARSegmentDecoder(adapter), max_tokens=24000)[0]
        return out, [(s["language"], s["text"]) for s in out["segments"]]

    def thai(text: str) -> bool:
        return any("\u0e00" <= ch <= "\u0e7f" for ch in text)

    out, segments = run(auto_adapter)
    assert [lang for lang, _ in segments] == ["fr", "fr"], segments
    # French words (base's French of this espeak-ng voice is not always the sentence's)
    assert segments[1][1].strip() and not thai(segments[1][1]), segments
    assert "soupe de poisson" in segments[0][1]
    assert out["language"] == "fr" and out["language_prob"] > 0.5
    _, per_segment = run(with_options(language_detection="segment"))
    assert [lang for lang, _ in per_segment] == ["fr", "th"], per_segment
    assert thai(per_segment[1][1]), per_segment


def test_keys_validated_listed_and_hashed_only_with_auto():
    from shardscribe.pipeline.config import config_hash, hashed_config, load_config
    from shardscribe.pipeline.config_keys import config_keys
    from shardscribe.pipeline.config_values import ConfigError
    from shardscribe.pipeline.models.errors import ModelError
    from shardscribe.pipeline.models.preflight import check_model

    cfg = load_config(None, ["model.language=auto", "model.language_candidates=[es, fr]"], model="base")
    assert cfg.model.language_candidates == ["es", "fr"] and cfg.model.language_detection == "recording"
    for overrides, message in (
            (["model.language=fr", "model.language_candidates=[es]"], "model.language_candidates: restricts"),
            (["model.language=auto", "model.language_candidates=es,fr"], "model.language_candidates: expected"),
            (["model.language=auto", "model.language_candidates=[]"], "model.language_candidates: expected"),
            (["model.language=auto", "model.language_detection=row"], "model.language_detection: expected one of")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides, model="base")
    with pytest.raises(ModelError, match="model.language_candidates: xx is not one of the model's 99 languages"):
        check_model(load_config(None, ["model.language=auto", "model.language_candidates=[es, xx]"],
                                model="base").model)
    keys = {k.key: k for k in config_keys()}
    assert keys["model.language_detection"].default == "recording"
    assert "model.language_candidates" in keys
    # without auto the keys decide nothing: configs hash as before they existed
    for model, overrides in (("tiny.en", []), ("base", ["model.language=es"])):
        assert "language_detection" not in hashed_config(load_config(None, overrides, model=model))["model"]
    auto = load_config(None, ["model.language=auto"], model="base")
    assert hashed_config(auto)["model"]["language_detection"] == "recording"
    assert config_hash(auto) != config_hash(load_config(None, ["model.language=auto",
                                                               "model.language_detection=segment"], model="base"))


def test_a_recordings_detection_window_is_its_first_30_s_of_speech_only():
    """The segments joined without their gaps, cut at the window; no copy of the rest (a
    recording of hours has hours of segments)."""
    import numpy as np

    from shardscribe.pipeline.models.whisper.adapter import _first_samples

    segments = [np.arange(n, dtype=np.float64) + 1000 * k for k, n in enumerate((5, 7, 400, 9))]
    got = _first_samples(segments, 20)
    assert got.dtype == np.float32 and got.tolist() == np.concatenate(segments)[:20].tolist()
    assert _first_samples(segments, 1000).tolist() == np.concatenate(segments).tolist()
    assert _first_samples([], 10).size == 0


def test_the_recordings_detection_counts_in_its_encode_seconds():
    """The per-recording detection runs its own encoder pass: its seconds go to the rows it
    detected (shared among them), in ``t_encode_s``; a row it left to its segments pays
    nothing extra."""
    import time

    from shardscribe.pipeline.kinds.base import SegmentResult
    from shardscribe.pipeline.segment_runner import transcribe_prepared

    class Decoder:
        name = "stub"

        def segment_cost(self, audio):
            return 1500

        def detect_recordings(self, recordings):
            time.sleep(0.3)
            return [("fr", 0.9) if len(segs) > 1 else None for segs in recordings]

        def decode(self, audios, languages=None):
            return [SegmentResult("texte", "ar", 1, t_encode_s=0.01, language=(lang or ("en", 1.0))[0])
                    for lang in (languages or [None] * len(audios))]

    def row(name, n):
        return {"id": name, "audio": f"{name}.wav", "seg_start": [30.0 * i for i in range(n)],
                "seg_end": [30.0 * i + 2 for i in range(n)], "error": None,
                "seg_audio": [np.zeros(32000, dtype=np.float32)] * n}

    two, one, also_two = transcribe_prepared([row("a", 2), row("b", 1), row("c", 2)], Decoder(), max_tokens=24000)
    assert [s["language"] for s in two["segments"]] == ["fr", "fr"]
    assert one["t_encode_s"] == pytest.approx(0.01)
    for detected in (two, also_two):
        # the batch's 0.01 per segment, plus half of the 0.3-s detection
        assert 0.15 + 0.02 <= detected["t_encode_s"] < 0.3, detected["t_encode_s"]
