"""The ctc model family ("FlexCTC: GPU-powered CTC Beam Decoding" searches over real CTC
checkpoints) on tiny random checkpoints built here and saved to temp directories: a
Wav2Vec2ForCTC with a character vocabulary and a `|` word delimiter (layer norm, which
takes an attention mask; and group norm, which does not), and a ParakeetForCTC with a
SentencePiece-style subword vocabulary. The references are transformers alone: the
processor on one clip, the model's forward, ``processor.batch_decode`` of its argmax.
The CTC heads' weights are scaled up so that random models still change their argmax
from frame to frame (a non-trivial greedy text).
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import manifest_with_random_bytes, transcribe_cli
from shardscribe.pipeline.audio import decode_audio
from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.models.ctc.adapter import load_ctc_adapter

CHARS = ["<pad>", "<unk>", "|"] + list("abcdefghijklmnopqrstuvwxyz'")
PIECES = ["<unk>", "▁", "▁the", "▁a", "th", "er", "in"] + list("abcdefghijklmnopqrstuvwxyz'") + ["<pad>"]
HEAD_SCALE = 20.0


def _wav2vec2(root, norm: str):
    from transformers import (Wav2Vec2Config, Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2ForCTC,
                              Wav2Vec2Processor)

    (root / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(CHARS)}))
    tok = Wav2Vec2CTCTokenizer(str(root / "vocab.json"), unk_token="<unk>", pad_token="<pad>",
                               word_delimiter_token="|", bos_token=None, eos_token=None)
    layer = norm == "layer"   # layer-norm models take an attention mask, group-norm ones must not
    fe = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=layer,
                                  return_attention_mask=layer)
    cfg = Wav2Vec2Config(vocab_size=len(CHARS), pad_token_id=0, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=37, conv_dim=(16,) * 7, feat_extract_norm=norm,
                         do_stable_layer_norm=layer, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)
    torch.manual_seed(0)
    model = Wav2Vec2ForCTC(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    return model, Wav2Vec2Processor(feature_extractor=fe, tokenizer=tok)


def _parakeet(root, norm=None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (ParakeetCTCConfig, ParakeetFeatureExtractor, ParakeetForCTC, ParakeetProcessor,
                              ParakeetTokenizer)

    spm = Tokenizer(models.Unigram([(p, -1.0 - 0.1 * i) for i, p in enumerate(PIECES)], unk_id=0))
    spm.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    spm.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok = ParakeetTokenizer(tokenizer_object=spm, unk_token="<unk>", pad_token="<pad>")
    cfg = ParakeetCTCConfig(vocab_size=len(PIECES), pad_token_id=len(PIECES) - 1, encoder_config=dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, num_mel_bins=16,
        subsampling_conv_channels=8, conv_kernel_size=5))
    torch.manual_seed(0)
    model = ParakeetForCTC(cfg).eval()
    with torch.no_grad():
        model.ctc_head.weight.mul_(HEAD_SCALE)
    return model, ParakeetProcessor(ParakeetFeatureExtractor(feature_size=16), tok, decoder_type="ctc")


BUILDERS = {"wav2vec2": (_wav2vec2, "layer"), "wav2vec2_group_norm": (_wav2vec2, "group"),
            "parakeet": (_parakeet, None)}


def saved_checkpoint(name: str, root):
    """Build checkpoint ``name`` of BUILDERS, save it to ``root`` and load it back through
    the family's adapter: (model, processor, adapter)."""
    build, norm = BUILDERS[name]
    model, processor = build(root, norm)
    model.save_pretrained(root)
    processor.save_pretrained(root)
    return model, processor, load_ctc_adapter(str(root))


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def checkpoint(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return (request.param, root, *saved_checkpoint(request.param, root))


def _reference(model, processor, audio):
    """transformers alone on one clip: log-probs [T, V] over the frames the model counts as
    audio, and the greedy text ``processor.batch_decode`` makes of their argmax. Parakeet's
    encoder returns its output mask (its last STFT frame is padding even for a clip alone,
    and its ``generate`` masks that frame); wav2vec2 alone has no padded frame."""
    inputs = processor(audio, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
        n = logits.shape[1]
        if hasattr(model, "encoder") and "attention_mask" in inputs:
            n = int(model.encoder(**inputs).attention_mask.sum())
            torch.testing.assert_close(model.generate(**inputs)[:, :n], logits.argmax(-1)[:, :n])
    logits = logits[:, :n]
    return logits[0].float().log_softmax(-1), processor.batch_decode(logits.argmax(-1))[0]


def test_greedy_and_log_probs_equal_the_models_own_on_each_clip(checkpoint, sample_audio):
    name, _, model, processor, adapter = checkpoint
    assert adapter.capabilities == frozenset({"ctc", "beam_vocabulary"})
    assert adapter.blank == model.config.pad_token_id
    texts = []
    for clip, audio in sample_audio.items():
        ref_lp, ref_text = _reference(model, processor, audio)
        enc = adapter.encode([audio])
        draft = adapter.ctc_draft(enc)
        n = int(draft.lengths[0])
        assert n == ref_lp.shape[0] == adapter.segment_cost(len(audio)), clip   # the model's own frame count
        torch.testing.assert_close(draft.log_probs[0, :n], ref_lp, atol=1e-5, rtol=0)
        assert draft.texts[0] == ref_text, clip
        texts.append(ref_text.strip())
    assert sum(bool(t) for t in texts) >= len(texts) - 1, texts   # the random model says something


def test_a_padded_batch_equals_each_clip_alone(checkpoint, sample_audio):
    _, _, _, _, adapter = checkpoint
    audios = list(sample_audio.values())
    assert len({len(a) for a in audios}) > 1                        # real padding
    batch = adapter.ctc_draft(adapter.encode(audios))
    for i, audio in enumerate(audios):
        alone = adapter.ctc_draft(adapter.encode([audio]))
        n = int(alone.lengths[0])
        assert int(batch.lengths[i]) == n
        torch.testing.assert_close(batch.log_probs[i, :n], alone.log_probs[0, :n], atol=1e-4, rtol=0)
        assert batch.texts[i] == alone.texts[0]
        assert float(batch.max_entropy[i]) == pytest.approx(float(alone.max_entropy[0]), abs=1e-4)
        assert not batch.entropy[i, n:].any()


def test_stride_and_batching_mode_come_from_the_model(checkpoint):
    name, _, _, _, adapter = checkpoint
    stride = 1280 if name == "parakeet" else 320          # 80 ms subsampled mels vs the 20-ms conv stack
    assert adapter.segment_cost(30 * 16000) == pytest.approx(30 * 16000 / stride, abs=2)
    assert adapter.batched == (name != "wav2vec2_group_norm")


def test_a_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path / "nope")):
        load_ctc_adapter(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=str(tmp_path / "empty")):
        load_ctc_adapter(str(tmp_path / "empty"))


def test_config_refuses_what_the_ctc_family_cannot_run(tmp_path):
    cfg = load_config("ctc_model_greedy", [f"model.source={tmp_path}"])
    assert (cfg.model.family, cfg.decoder.kind, cfg.decoder.pack_windows) == ("ctc", "ctc_greedy", False)
    with pytest.raises(ConfigError, match="ctc_model_greedy"):
        load_config("ctc_greedy", ["model.family=ctc", f"model.source={tmp_path}", "decoder.pack_windows=true"])
    # ctc_beam searches the model's own vocabulary (tests/test_ctc_beam_models.py), with
    # whole clips per encoder call like ctc_greedy
    for conf, sets in (("ctc_model_beam", []), ("ctc_model_greedy", ["decoder.kind=ctc_beam"]),
                       ("ctc_beam", ["model.family=ctc", "decoder.pack_windows=false"])):
        assert load_config(conf, [f"model.source={tmp_path}", *sets]).decoder.kind == "ctc_beam"
    with pytest.raises(ConfigError) as exc:
        load_config("ctc_beam", ["model.family=ctc", f"model.source={tmp_path}", "decoder.pack_windows=true"])
    assert str(exc.value).startswith("decoder.pack_windows: model.family=ctc cannot pack") and "ctc_model_beam" in str(exc.value)
    assert len(str(exc.value).splitlines()) == 1


def test_the_model_flag_reads_the_family_from_the_checkpoint(checkpoint, tmp_path):
    name, root, *_ = checkpoint
    for conf in ("ctc_beam", "ctc_greedy", "ctc_model_beam"):
        cfg = load_config(conf, model=str(root))
        assert (cfg.model.family, cfg.model.source, cfg.model.ctc_head, cfg.decoder.pack_windows) == \
            ("ctc", str(root), None, False)
    with pytest.raises(ConfigError, match="needs a model with attention_decoder"):
        load_config("ar", model=str(root))
    (tmp_path / "empty").mkdir()
    for bad in (tmp_path / "empty", tmp_path / "nope"):
        with pytest.raises(ConfigError, match=str(bad)) as exc:
            load_config("ctc_beam", model=str(bad))
        assert len(str(exc.value).splitlines()) == 1
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"]}))
    with pytest.raises(ConfigError, match="no model family loads"):
        load_config("ctc_beam", model=str(tmp_path / "other"))
    # A config that names no architecture: the family comes from its model_type.
    shutil.copytree(root, tmp_path / "unnamed")
    config = json.loads((root / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "unnamed" / "config.json").write_text(json.dumps(config))
    assert load_config("ctc_beam", model=str(tmp_path / "unnamed")).model.family == "ctc"
    # The checkpoint's config without its weights, or a config.json that is not an object:
    # one line before any worker starts, not an error from every worker.
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    shutil.copytree(root, tmp_path / "noweights", ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    with pytest.raises(ModelError, match="no weights") as exc:
        check_model(load_config("ctc_beam", model=str(tmp_path / "noweights")).model)
    assert len(str(exc.value).splitlines()) == 1
    check_model(load_config("ctc_beam", model=str(root)).model)
    (tmp_path / "other" / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        load_config("ctc_beam", model=str(tmp_path / "other"))


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, samples_dir, sample_manifest):
    return manifest_with_random_bytes(tmp_path_factory.mktemp("ctc-in"), samples_dir, sample_manifest, at=2)


@pytest.mark.slow      # a CLI job in a subprocess per checkpoint
def test_cli_transcribes_with_a_ctc_checkpoint(checkpoint, manifest, tmp_path):
    name, root, model, processor, _ = checkpoint
    path, lines = manifest
    dst = tmp_path / "out"
    summary, rows = transcribe_cli(dst, "--runner", "local", "--input", str(path), "--config", "ctc_model_greedy",
                                   "--set", f"model.source={root}", "--set", "batching.recordings_per_batch=3")
    assert summary["rows_in"] == summary["rows_out"] == len(lines) == len(rows)
    assert summary["errors"] == 1 and rows["random"]["error"] and rows["random"]["text"] is None
    for line in lines:
        if line["id"] == "random":
            continue
        row = rows[line["id"]]
        assert row["error"] is None and row["decoder"] == "ctc_greedy", row
        audio = decode_audio(open(row["audio"], "rb").read())[0]
        refs = []
        for seg in row["segments"]:
            part = audio[int(round(seg["start"] * 16000)):int(round(seg["end"] * 16000))]
            refs.append(_reference(model, processor, part)[1].strip())
        assert row["text"] == " ".join(t for t in refs if t), line["id"]


def _config_only(path, arch: str, model_type: str):
    """A checkpoint folder whose config names ``arch`` (a weights file beside it, never read:
    the family check comes before anything is loaded)."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": model_type}))
    (path / "model.safetensors").write_bytes(b"")
    return path


@pytest.mark.parametrize("conf, arch, model_type, family", [
    ("ctc_model_greedy", "WhisperForConditionalGeneration", "whisper", "whisper"),
    ("transducer_greedy", "Wav2Vec2ForCTC", "wav2vec2", "ctc"),
    ("ctc_model_greedy", "ParakeetForTDT", "parakeet_tdt", "transducer"),
])
def test_preflight_refuses_a_checkpoint_of_another_family(tmp_path, conf, arch, model_type, family):
    """model.family set by hand to a family that cannot load the checkpoint: one line naming
    both before any worker starts, not transformers' error (or a wrong model) in every worker."""
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    root = _config_only(tmp_path / "ck", arch, model_type)
    cfg = load_config(conf, [f"model.source={root}"])
    with pytest.raises(ModelError) as exc:
        check_model(cfg.model)
    text = str(exc.value)
    assert f"model.source={root} holds a {arch} checkpoint (model_type {model_type})" in text, text
    assert f"model.family={cfg.model.family} loads" in text and f"set model.family={family}" in text, text
    assert len(text.splitlines()) == 1


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    """name of BUILDERS, or "whisper" -> the folder of that checkpoint, built on first use."""
    from whisper_tiny import build_tiny_whisper

    dirs = {}

    def get(name):
        if name not in dirs:
            root = tmp_path_factory.mktemp(f"saved-{name}")
            build_tiny_whisper(root) if name == "whisper" else saved_checkpoint(name, root)
            dirs[name] = root
        return dirs[name]
    return get


def _rewritten(src, dst, **changes):
    """A copy of checkpoint ``src`` whose config.json has ``changes`` (None: key removed)."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text()) | changes
    (dst / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return dst


@pytest.mark.parametrize("name, conf, family, model_type, loader", [
    ("wav2vec2", "transducer_greedy", "transducer", "wav2vec2", "ctc"),
    ("wav2vec2", "ar", "granite_speech", "wav2vec2", "ctc"),
    ("wav2vec2", "ar", "whisper", "wav2vec2", "ctc"),
    ("parakeet", "transducer_greedy", "transducer", "parakeet_ctc", "ctc"),
    ("whisper", "ctc_model_greedy", "ctc", "whisper", "whisper"),
    ("whisper", "transducer_greedy", "transducer", "whisper", "whisper"),
    ("wav2vec2", "ctc_model_greedy", "ctc", "bert", None),
    ("wav2vec2", "ctc_model_greedy", "ctc", None, None),
])
def test_preflight_judges_a_config_without_architectures_by_its_model_type(saved_dir, tmp_path, name, conf, family,
                                                                           model_type, loader):
    """A whole checkpoint whose config.json names no architecture is judged by its model_type
    against what model.family loads: one line naming the source and the family before any
    worker starts, not the loader's error (or a wrong model) in every worker."""
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    root = _rewritten(saved_dir(name), tmp_path / "ck", architectures=None, model_type=model_type)
    cfg = load_config(conf, [f"model.family={family}", f"model.source={root}"])
    with pytest.raises(ModelError) as exc:
        check_model(cfg.model)
    text = str(exc.value)
    assert text.startswith(f"model.source={root}: its config.json names no architecture"), text
    assert f"model.family={family} loads" in text and len(text.splitlines()) == 1, text
    assert (f"set model.family={loader}" in text) if loader else "set model.family" not in text, text


@pytest.mark.parametrize("name, conf", [("wav2vec2", "ctc_model_greedy"), ("parakeet", "ctc_model_greedy"),
                                        ("whisper", "ar")])
def test_a_config_without_architectures_of_the_familys_model_type_passes(saved_dir, tmp_path, name, conf):
    from shardscribe.pipeline.models.preflight import check_model

    root = _rewritten(saved_dir(name), tmp_path / "ck", architectures=None)
    check_model(load_config(conf, [f"model.source={root}"]).model)


def test_a_whisper_config_that_names_neither_architecture_nor_model_type_passes(saved_dir, tmp_path):
    """Whisper's loader reads such a config (it builds WhisperConfig itself), so the
    preflight has nothing to refuse; the CTC family's AutoModelForCTC needs the model_type
    (the last case of the refusal test above)."""
    from shardscribe.pipeline.models.preflight import check_model
    from shardscribe.pipeline.models.whisper.loader import load_whisper

    root = _rewritten(saved_dir("whisper"), tmp_path / "ck", architectures=None, model_type=None)
    check_model(load_config("ar", [f"model.source={root}"]).model)
    assert type(load_whisper(str(root))[0]).__name__ == "WhisperForConditionalGeneration"


def test_the_cli_refuses_a_config_without_architectures_of_another_family(saved_dir, tmp_path, samples_dir, capsys):
    from shardscribe.jobs.cli import main

    root = _rewritten(saved_dir("wav2vec2"), tmp_path / "ck", architectures=None)
    code = main(["transcribe", "--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "o"),
                 "--runner", "local", "--config", "transducer_greedy", "--set", f"model.source={root}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "set model.family=ctc" in err, err
    assert not (tmp_path / "o").exists()


def test_the_loader_names_the_path_of_a_checkpoint_it_cannot_load(tmp_path):
    """transformers raises ValueError for a model type without a CTC class: the loader turns
    it into ModelError naming the checkpoint."""
    from shardscribe.pipeline.models.preflight import ModelError

    root = _config_only(tmp_path / "whisper", "WhisperForConditionalGeneration", "whisper")
    with pytest.raises(ModelError, match=f"cannot load a CTC model from {root}"):
        load_ctc_adapter(str(root))


@pytest.mark.parametrize("checkpoint, removed, says", [
    ("wav2vec2", ["vocab.json"], "has no tokenizer files"),
    ("wav2vec2", ["vocab.json", "tokenizer_config.json"], "has no tokenizer files"),
    ("wav2vec2", ["processor_config.json"], "has no feature extractor files"),
    ("parakeet", ["tokenizer.json", "tokenizer_config.json"], "has no tokenizer files"),
], indirect=["checkpoint"])
def test_preflight_names_a_missing_tokenizer_or_feature_extractor(checkpoint, tmp_path, removed, says):
    """The checkpoint without part of its processor: one line from the driver's preflight,
    and ModelError (not a TypeError about a None path) from the loader."""
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    bad = tmp_path / "bad"
    shutil.copytree(checkpoint[1], bad, ignore=shutil.ignore_patterns(*removed))
    with pytest.raises(ModelError, match=f"model.source={bad}: the checkpoint {says}") as exc:
        check_model(load_config("ctc_model_greedy", [f"model.source={bad}"]).model)
    assert len(str(exc.value).splitlines()) == 1
    with pytest.raises(ModelError, match=str(bad)):
        load_ctc_adapter(str(bad))


@pytest.mark.parametrize("kind", ["ctc_greedy", "ctc_beam"])
def test_a_clip_shorter_than_one_frame_is_empty_text_in_any_batch(checkpoint, sample_audio, kind):
    """100 samples are less than the model's shortest input (wav2vec2's conv stack needs
    400 for one frame): alone, beside a longer clip, or beside another such clip, the clip
    gets empty text and no error, and the longer clip the text it gets alone."""
    import numpy as np

    from shardscribe.pipeline.kinds import decoder_kind
    from shardscribe.pipeline.segment_runner import complete_pending, transcribe_prepared

    _, root, _, _, adapter = checkpoint
    short = (np.random.default_rng(0).standard_normal(100) * 0.1).astype(np.float32)
    assert adapter.segment_cost(len(short)) == 0
    cfg = load_config("ctc_model_beam" if kind == "ctc_beam" else "ctc_model_greedy", [f"model.source={root}"])
    spec = decoder_kind(kind)
    first = spec.build_first_stage(adapter, cfg)
    second = spec.build_second_stage(cfg, first) if spec.two_stage else None

    def texts(*audios):
        rows = [{"id": str(i), "audio": str(i), "seg_start": [0.0], "seg_end": [len(a) / 16000], "seg_audio": [a],
                 "error": None} for i, a in enumerate(audios)]
        rows = transcribe_prepared(rows, first, 10 ** 6, pending_as_bytes=False)
        if second is not None:
            rows = complete_pending(rows, second, 10 ** 6)
        return [(r["text"], r["error"]) for r in rows]

    long = sample_audio["fox_flite_slt"]
    alone = texts(long)[0]
    assert texts(short) == [("", None)]
    assert texts(short, short) == [("", None)] * 2
    assert texts(short, long) == [("", None), alone]
