"""Speech a model cannot transcribe, and translation that does not loop, on real models and
espeak-ng speech (the Spanish and French clips of tests/test_whisper_base.py):

- tiny.en (the default job, `ssd`) marks its Spanish and French rows ``language_mismatch``
  (language ``und``: Whisper's failed-decode rule, pipeline.models.whisper.language_check)
  and its English rows, a real recording among them, neither; the job ends with one
  warning line counting them;
- Whisper base with ``model.task=translate`` gives English text without a repetition loop
  through the temperature fallback (pipeline.kinds.ar.fallback), and loops without it;
  its samples are the same on every run and in any batch.
"""
from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from conftest import SAMPLES, espeak
from test_whisper_base import CLIPS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The English sentences the Spanish and French clips say.
ENGLISH = {
    "es": "Good morning. Today we are going to talk about the weather in Madrid. Tomorrow it will rain in the "
          "afternoon and it will be cold at night.",
    "fr": "Hello everyone. Today we are going to talk about the weather in Paris. Tomorrow it will rain in the "
          "afternoon and it will be cold in the evening.",
}


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """The Spanish and French clips, rendered once: {voice: path}."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    root = tmp_path_factory.mktemp("mismatch-audio")
    return {voice: espeak(text, root / f"{voice}.wav", voice=voice, speed=150) for voice, (text, _) in CLIPS.items()}


def test_tiny_en_marks_other_languages_and_warns_once(clips, tmp_path, model_cache, capsys):
    """The default job (tiny.en, ssd) on es, fr and two English clips: a real recording and
    espeak-ng's en-us voice."""
    from shardscribe.jobs.cli import main

    audio = tmp_path / "audio"
    audio.mkdir()
    for voice, path in clips.items():
        shutil.copy(path, audio / f"{voice}.wav")
    for name in ("beckett_human.flac", "coffee_espeak_en_us.flac"):
        shutil.copy(SAMPLES / name, audio / name)
    out = tmp_path / "out"
    assert main(["transcribe", "--input", str(audio), "--output", str(out), "--runner", "local",
                 "--set", f"model.cache_dir={model_cache}"]) == 0
    err = capsys.readouterr().err
    rows = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    for voice in clips:
        row = rows[f"{voice}.wav"]
        assert "language_mismatch" in row["filter_reasons"] and row["language"] == "und", (voice, row["text"])
    for name in ("beckett_human.flac", "coffee_espeak_en_us.flac"):
        row = rows[name]
        assert "language_mismatch" not in row["filter_reasons"] and row["language"] == "en", (name, row["text"])
    warnings = [line for line in err.splitlines() if "language_mismatch" in line]
    assert len(warnings) == 1 and warnings[0].startswith("shardscribe: warning: 2 rows "), err


def test_the_check_is_a_filter_key():
    """filters.english_only_logprob: on by default for English-only models, null turns it
    off, a positive value is refused naming the key; ``und`` segments carry the reason."""
    from shardscribe.pipeline.config import ConfigError, load_config
    from shardscribe.pipeline.filters import mark_rows
    from shardscribe.pipeline.models.whisper.language_check import EnglishOnlyCheck

    cfg = load_config(None)
    assert cfg.filters.english_only_logprob == -1.0
    with pytest.raises(ConfigError, match="filters.english_only_logprob"):
        load_config(None, ["filters.english_only_logprob=0.5"])

    class EnglishOnly:
        options = object()      # decoding options set: Whisper's multitask prompt

        class special:
            multilingual = False

    assert EnglishOnlyCheck.of(EnglishOnly, cfg.filters) == EnglishOnlyCheck(-1.0, 2.4)
    assert EnglishOnlyCheck.of(EnglishOnly, load_config(None, ["filters.english_only_logprob=null"]).filters) is None
    EnglishOnly.special.multilingual = True
    assert EnglishOnlyCheck.of(EnglishOnly, cfg.filters) is None
    seg = {"start": 0.0, "end": 3.0, "text": "I'm not sure if I can.", "language": "und"}
    row = mark_rows([{"id": "a", "text": seg["text"], "language": "und", "segments": [seg]}], cfg.filters)[0]
    assert row["filter_reasons"] == ["language_mismatch"] and seg["filter_reasons"] == ["language_mismatch"]
    seg["language"] = "en"
    assert mark_rows([{"id": "a", "text": seg["text"], "language": "en", "segments": [seg]}],
                     cfg.filters)[0]["filter_reasons"] == []


@pytest.fixture(scope="module")
def translator(model_cache):
    """Whisper base translating with a detected language, and its clips' audio."""
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter
    from shardscribe.pipeline.models.whisper.loader import EMBEDDED_BASE
    from shardscribe.pipeline.models.whisper.prompting import WhisperOptions

    return load_whisper_adapter(EMBEDDED_BASE, cache_dir=model_cache,
                                options=WhisperOptions(language="auto", task="translate"))


def _decode(adapter, audios, mode: str):
    from shardscribe.pipeline.config_sections import DecoderConfig
    from shardscribe.pipeline.kinds.ar.fallback import FallbackRule
    from shardscribe.pipeline.kinds.ar.stage import ARSegmentDecoder

    rule = FallbackRule.of(DecoderConfig(temperature_fallback=mode), adapter.options.task)
    # 96 tokens: a loop shows well before 224, and the test stays short
    return ARSegmentDecoder(adapter, max_new_tokens=96, fallback=rule, use_cuda_graphs=False).decode(audios)


@pytest.mark.slow   # Whisper base translating with the temperature fallback: about 25 s
def test_translate_gives_english_without_loops(clips, translator):
    import jiwer

    from shardscribe.pipeline.audio import decode_audio
    from shardscribe.pipeline.filters import compression_ratio
    from shardscribe.pipeline.metrics import normalize

    voices = sorted(clips)
    audios = [decode_audio(clips[v].read_bytes())[0] for v in voices]
    greedy = _decode(translator, audios, "off")
    # Without the fallback base loops on these clips (what the fallback is for).
    assert max(compression_ratio(r.text) for r in greedy) > 2.4, [r.text for r in greedy]
    fallback = _decode(translator, audios, "translate")
    for voice, res in zip(voices, fallback):
        assert res.language == voice
        assert compression_ratio(res.text) <= 2.4, (voice, res.text)
        assert jiwer.wer(normalize(ENGLISH[voice]), normalize(res.text)) < 0.8, (voice, res.text)


def test_sampling_is_seeded_per_row_not_per_batch():
    """A row's draw depends on the seed, the temperature and its own history: the same
    in a batch of one as in a batch of three, again on a rerun; another seed draws
    otherwise; the logits keep the drawn token alone."""
    import torch

    from shardscribe.pipeline.kinds.ar.fallback import GumbelSampling

    logits = torch.randn(3, 500, generator=torch.Generator().manual_seed(1))
    histories = [[1, 2], [3], []]

    def draw(seed, rows):
        edited = logits[rows].clone()
        GumbelSampling(1.0, seed)(edited, [histories[r] for r in rows])
        assert torch.isfinite(edited).sum(-1).tolist() == [1] * len(rows)
        return edited.argmax(-1).tolist()

    batch = draw(0, [0, 1, 2])
    assert [draw(0, [r])[0] for r in range(3)] == batch == draw(0, [0, 1, 2])
    assert any(draw(s, [0, 1, 2]) != batch for s in (1, 2, 3))
