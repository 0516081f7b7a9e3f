"""`shardscribe bench engines --quick` end to end on a bundled clip, and the speed levers
it measures (model.quantize, model.encoder_dtype): each validates in one line naming its
key, and int8 keeps the bundled clips' transcripts within a bound of the float32
reference's WER against the clips' own texts. No timing is asserted."""
from __future__ import annotations

import json

import pytest
import torch

from pipeline.config import ConfigError, load_config


def test_quick_engines_bench_prints_every_engine_with_its_stage_breakdown(tmp_path, capsys, model_cache,
                                                                        samples_dir, sample_manifest):
    from jobs.cli import main

    manifest = tmp_path / "one.jsonl"
    manifest.write_text(json.dumps({**sample_manifest[1], "audio": str(samples_dir / sample_manifest[1]["audio"])}))
    out = tmp_path / "engines.json"
    assert main(["bench", "engines", "--quick", "--manifest", str(manifest), "--out", str(out),
                 "--configs", "ar,default", "--compute-types", "int8",
                 "--set", f"model.cache_dir={model_cache}"]) == 0
    printed = capsys.readouterr().out
    rows = {r["engine"]: r for r in json.loads(out.read_text())["rows"]}
    names = [n for n in rows if n.startswith(("faster-whisper", "ctranslate2"))]
    assert len(names) == 1 and set(rows) == {names[0], "ours ar", "ours default"}
    for name in rows:
        assert name in printed
    # A clean clip: faster-whisper and our AR agree with its text.
    for name in names + ["ours ar", "ours default"]:
        assert rows[name]["wer"] <= 0.15, (name, rows[name]["wer"])
    for name in ("ours ar", "ours default"):
        r = rows[name]
        parts = [r[k] for k in ("prepare_s", "features_s", "encoder_s", "decoder_s", "fallback_s")]
        assert all(p >= 0 for p in parts) and r["encoder_s"] > 0
        # The stages are measured inside the run: they cannot exceed its wall time by more
        # than the separately timed feature pass.
        assert sum(parts) <= r["wall_s"] + r["features_s"]
    assert rows["ours ar"]["decoder_s"] > 0 and rows["ours ar"]["fallback_s"] == 0
    assert out.with_suffix(".png").stat().st_size > 10_000


@pytest.mark.parametrize("overrides, key", [
    (["model.quantize=int4"], "model.quantize"),
    (["model.encoder_dtype=int8"], "model.encoder_dtype"),
    (["model.quantize=int8", "model.device=cuda"], "model.quantize"),
])
def test_bad_lever_values_fail_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("ar", overrides)


def test_levers_are_whisper_only_and_int8_is_off_by_default(tmp_path):
    cfg = load_config(None)
    assert (cfg.model.quantize, cfg.model.encoder_dtype) == ("none", "auto")
    checkpoint = tmp_path / "w2v"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"architectures": ["Wav2Vec2ForCTC"]}))
    with pytest.raises(ConfigError, match="model.quantize: only Whisper"):
        load_config("ctc_model_greedy", [f"model.source={checkpoint}", "model.family=ctc", "model.quantize=int8"])
    # The embedded CTC model is Whisper's encoder: the levers apply.
    assert load_config("ctc_model_greedy", ["model.quantize=int8"]).model.quantize == "int8"


def test_bfloat16_on_a_cpu_without_native_support_fails_before_any_worker(monkeypatch):
    from pipeline import device
    from pipeline.models.preflight import ModelError, check_model

    monkeypatch.setattr(device, "cpu_bf16_native", lambda: False)
    for key in ("model.dtype", "model.encoder_dtype"):
        with pytest.raises(ModelError, match=f"{key}=bfloat16: this CPU has neither AMX nor AVX512-BF16"):
            check_model(load_config("ar", [f"{key}=bfloat16", "model.device=cpu"]).model)
    check_model(load_config("ar", ["model.device=cpu"]).model)


def test_auto_encoder_dtype_is_bfloat16_only_on_a_native_cpu_under_float32(monkeypatch):
    from pipeline import device

    for native, on_cpu in ((True, "bfloat16"), (False, None)):
        monkeypatch.setattr(device, "cpu_bf16_native", lambda native=native: native)
        assert device.encoder_dtype_name("auto", "cpu", "float32") == on_cpu
        assert device.encoder_dtype_name("auto", "cpu", "bfloat16") is None      # the model's own
        assert device.encoder_dtype_name("float32", "cpu", "float32") == "float32"
    assert device.encoder_dtype_name("auto", "cuda", "float32") is None


def test_the_default_config_loads_the_encoder_in_the_resolved_dtype(monkeypatch, model_cache):
    from pipeline import device
    from pipeline.models import load_model

    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(device, "cpu_bf16_native", lambda native=native: native)
        adapter = load_model(load_config(None, ["model.device=cpu", f"model.cache_dir={model_cache}"]).model)
        assert (adapter.encoder_dtype, adapter.dtype) == (expected, torch.float32)
    # A CPU without native bfloat16 still loads the default: auto never refuses.
    from pipeline.models.preflight import check_model
    check_model(load_config(None, ["model.device=cpu"]).model)


def _greedy_texts(adapter, audios):
    from pipeline.decoding.ar_greedy import greedy_decode

    return [adapter.text(t) for t in greedy_decode(adapter, adapter.encode(audios).states)]


def test_int8_keeps_the_bundled_clips_transcripts_within_bounds(model_cache, whisper_adapter, sample_audio,
                                                                sample_manifest):
    """Measured on all 7 bundled clips: int8 changes 3 texts ("jumps" -> "jump", two
    punctuation marks), 1 normalised word in 66. Here the three clips int8 or bfloat16 moved
    (fox, weather, coffee; 30 words): at most one more wrong word than float32."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from pipeline.metrics import corpus_wer
    from pipeline.models.whisper.adapter import load_whisper_adapter

    int8 = load_whisper_adapter("embedded", cache_dir=model_cache, quantize="int8")
    linears = [m for m in int8.model.modules() if isinstance(m, (torch.nn.Linear, DynamicLinear))]
    assert linears and all(isinstance(m, DynamicLinear) for m in linears)
    clips = [m for m in sample_manifest if m["id"].split("_")[0] in ("fox", "weather", "coffee")]
    assert len(clips) == 3
    audios = [sample_audio[m["id"]] for m in clips]
    refs = [m["text"] for m in clips]
    ref_texts, int8_texts = _greedy_texts(whisper_adapter, audios), _greedy_texts(int8, audios)
    words = sum(len(r.split()) for r in refs)
    assert corpus_wer(refs, int8_texts) <= corpus_wer(refs, ref_texts) + 1.5 / words, (ref_texts, int8_texts)
    assert corpus_wer(ref_texts, int8_texts) <= 1.5 / words


def test_encoder_dtype_runs_the_encoder_alone_in_that_dtype(model_cache, whisper_adapter, sample_audio,
                                                             sample_manifest):
    from pipeline.device import cpu_bf16_native
    from pipeline.models.whisper.adapter import load_whisper_adapter

    if not cpu_bf16_native():
        pytest.skip("this CPU has no native bfloat16 (AMX / AVX512-BF16)")
    bf16 = load_whisper_adapter("embedded", cache_dir=model_cache, encoder_dtype=torch.bfloat16)
    assert bf16.model.model.encoder.conv1.weight.dtype == torch.bfloat16
    assert bf16.model.model.decoder.embed_tokens.weight.dtype == torch.float32
    audio = [sample_audio[sample_manifest[0]["id"]]]
    enc, ref = bf16.encode(audio), whisper_adapter.encode(audio)
    assert enc.states.dtype == torch.float32
    err = (enc.states - ref.states).abs().max().item()
    assert 0 < err < 0.1 * ref.states.abs().max().item()


def test_cross_kv_dtype_follows_the_encoder_unless_set(monkeypatch, model_cache):
    from pipeline import device
    from pipeline.models import load_model

    assert device.cross_kv_dtype_name("auto", "bfloat16", "float32") == "bfloat16"
    assert device.cross_kv_dtype_name("auto", None, "float32") is None
    assert device.cross_kv_dtype_name("float32", "bfloat16", "float32") is None   # the model's own
    assert device.cross_kv_dtype_name("bfloat16", None, "float32") == "bfloat16"
    with pytest.raises(ConfigError, match="model.cross_kv_dtype"):
        load_config("ar", ["model.cross_kv_dtype=int8"])
    # int8 Linear layers project K/V themselves: auto leaves them be, an explicit dtype is refused
    assert device.cross_kv_dtype_name("auto", "bfloat16", "float32", "int8") is None
    with pytest.raises(ConfigError, match="model.cross_kv_dtype: the cross-attention projections are int8"):
        load_config("ar", ["model.quantize=int8", "model.cross_kv_dtype=bfloat16"])
    for native in (True, False):
        monkeypatch.setattr(device, "cpu_bf16_native", lambda native=native: native)
        adapter = load_model(load_config(None, ["model.device=cpu", f"model.cache_dir={model_cache}"]).model)
        assert (adapter.cross_projection is not None) == native
        assert adapter.cross_projection is None or adapter.cross_projection.dtype == torch.bfloat16
        pinned = load_model(load_config(None, ["model.device=cpu", f"model.cache_dir={model_cache}",
                                               "model.cross_kv_dtype=float32"]).model)
        assert pinned.cross_projection is None
        int8 = load_model(load_config("ar", ["model.device=cpu", f"model.cache_dir={model_cache}",
                                             "model.quantize=int8"]).model)
        assert int8.cross_projection is None
        from pipeline.config import config_hash
        assert (config_hash(load_config(None, ["model.device=cpu"])) !=
                config_hash(load_config(None, ["model.device=cpu", "model.cross_kv_dtype=float32"]))) == native


def test_the_decoder_reads_cross_attention_projected_in_cross_kv_dtype(model_cache, whisper_adapter, sample_audio,
                                                                        sample_manifest):
    """The bfloat16 projection's K/V are the ones the decoder attends to (the model does not
    project the states again), within bfloat16's error of the float32 ones, and decoding
    with them keeps the bundled clips' transcripts."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    from pipeline.decoding.ar_greedy import greedy_decode
    from pipeline.models.whisper.adapter import load_whisper_adapter

    bf16 = load_whisper_adapter("embedded", cache_dir=model_cache, cross_kv_dtype=torch.bfloat16)
    audios = [sample_audio[m["id"]] for m in sample_manifest]
    states = whisper_adapter.encode(audios[:2]).states
    ids = torch.tensor([whisper_adapter.prompt_ids] * 2)
    ref_h, ref_cache = whisper_adapter.decoder_hidden(ids, states, None)
    for cache in (None, EncoderDecoderCache(DynamicCache(), DynamicCache())):
        h, got = bf16.decoder_hidden(ids, states, cache)
        assert got.cross_attention_cache.layers[0].keys.dtype == torch.float32
        for ref_layer, layer in zip(ref_cache.cross_attention_cache.layers, got.cross_attention_cache.layers):
            for ref_t, t in ((ref_layer.keys, layer.keys), (ref_layer.values, layer.values)):
                err = (t - ref_t).abs().max().item()
                assert 0 < err < 2 ** -6 * ref_t.abs().max().item()
        assert (h - ref_h).abs().max().item() < 0.05 * ref_h.abs().max().item()
    # Projected once: a later step reads the cached K/V (the same tensors), not new ones.
    keys = got.cross_attention_cache.layers[0].keys
    bf16.decoder_hidden(ids[:, -1:], states, got, None, torch.full((2, 1), ids.shape[1]))
    assert got.cross_attention_cache.layers[0].keys is keys
    full = bf16.encode(audios).states
    assert ([bf16.text(t) for t in greedy_decode(bf16, full)] ==
            [whisper_adapter.text(t) for t in greedy_decode(whisper_adapter, full)])


def test_long_form_inputs_are_files_joining_the_clips_in_order(tmp_path, samples_dir, sample_manifest):
    """`bench engines --long-form S` hands every engine files of up to S seconds: the
    clips' speech in manifest order with 0.4-s silences between, their texts joined."""
    import soundfile as sf

    from jobs.bench.data import load_recordings, write_long_form
    from pipeline.sources import read_source

    manifest = tmp_path / "clips.jsonl"
    manifest.write_text("".join(json.dumps({**m, "audio": str(samples_dir / m["audio"])}) + "\n"
                                for m in sample_manifest[:4]))
    recordings, refs = load_recordings(str(manifest))
    out = write_long_form(str(manifest), 9.0, str(tmp_path / "long"))
    rows = read_source(out)
    lengths = [len(sf.read(r["audio"], dtype="float32")[0]) for r in rows]
    assert 1 < len(rows) < len(recordings) and max(lengths) <= 9.0 * 16000
    gap = int(0.4 * 16000)
    speech = sum(len(s) for segs in recordings for s in segs)
    n_segs = sum(len(segs) for segs in recordings)
    assert sum(lengths) == speech + gap * (n_segs - len(rows))
    assert " ".join(r["reference"] for r in rows) == " ".join(refs)
