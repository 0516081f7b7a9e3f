"""`shardscribe bench engines --quick` end to end on a bundled clip, and the speed levers
it measures (model.quantize, model.encoder_dtype): each validates in one line naming its
key, and int8 keeps the bundled clips' transcripts within a bound of the float32
reference's WER against the clips' own texts. No timing is asserted."""
from __future__ import annotations

import json

import pytest
import torch

from shardscribe.pipeline.config import ConfigError, load_config


def test_quick_engines_bench_prints_every_engine_with_its_stage_breakdown(tmp_path, capsys, model_cache,
                                                                        samples_dir, sample_manifest):
    from shardscribe.jobs.cli import main

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


def test_levers_are_whisper_only_and_auto_by_default(tmp_path):
    cfg = load_config(None)
    assert (cfg.model.quantize, cfg.model.encoder_dtype) == ("auto", "auto")
    assert load_config("ar", ["model.quantize=auto", "model.device=cuda"]).model.quantize == "auto"
    checkpoint = tmp_path / "w2v"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"architectures": ["Wav2Vec2ForCTC"]}))
    with pytest.raises(ConfigError, match="model.quantize: only Whisper"):
        load_config("ctc_model_greedy", [f"model.source={checkpoint}", "model.family=ctc", "model.quantize=int8"])
    # The embedded CTC model is Whisper's encoder: the levers apply.
    assert load_config("ctc_model_greedy", ["model.quantize=int8"]).model.quantize == "int8"


def test_bfloat16_on_a_cpu_without_native_support_fails_before_any_worker(monkeypatch):
    from shardscribe.pipeline import device
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    monkeypatch.setattr(device, "cpu_bf16_native", lambda: False)
    for key in ("model.dtype", "model.encoder_dtype"):
        with pytest.raises(ModelError, match=f"{key}=bfloat16: this CPU has neither AMX nor AVX512-BF16"):
            check_model(load_config("ar", [f"{key}=bfloat16", "model.device=cpu"]).model)
    check_model(load_config("ar", ["model.device=cpu"]).model)


def test_auto_encoder_dtype_is_bfloat16_only_on_a_native_cpu_under_float32(monkeypatch):
    from shardscribe.pipeline import device

    for native, on_cpu in ((True, "bfloat16"), (False, None)):
        monkeypatch.setattr(device, "cpu_bf16_native", lambda native=native: native)
        assert device.encoder_dtype_name("auto", "cpu", "float32") == on_cpu
        assert device.encoder_dtype_name("auto", "cpu", "bfloat16") is None      # the model's own
        assert device.encoder_dtype_name("float32", "cpu", "float32") == "float32"
    assert device.encoder_dtype_name("auto", "cuda", "float32") is None


def test_the_default_config_loads_the_encoder_in_the_resolved_dtype(monkeypatch, model_cache):
    from shardscribe.pipeline import device
    from shardscribe.pipeline.models import load_model

    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(device, "cpu_bf16_native", lambda native=native: native)
        adapter = load_model(load_config(None, ["model.device=cpu", f"model.cache_dir={model_cache}"]).model)
        assert (adapter.encoder_dtype, adapter.dtype) == (expected, torch.float32)
    # A CPU without native bfloat16 still loads the default: auto never refuses.
    from shardscribe.pipeline.models.preflight import check_model
    check_model(load_config(None, ["model.device=cpu"]).model)


@pytest.mark.slow      # two models over the 7 clips, greedy and SSD: over 20 s on 2 loaded cores
def test_int8_keeps_the_bundled_clips_transcripts_within_bounds(model_cache, ssd_adapter, sample_audio,
                                                                sample_manifest):
    """All 7 bundled clips (66 words) against their own texts: int8 makes no more word
    errors than float32 (measured: the same 1 in 66; it moves two punctuation marks and a
    capital, which the normalised WER ignores), greedily and through SSD's CTC draft (the
    head reads int8 encoder states), gate, verification and fallback at the default
    preset's thresholds; and the CPU's static-cache loop gives the int8 model's eager
    tokens."""
    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
    from shardscribe.pipeline.decoding.ar.graphs import StaticDecoding
    from shardscribe.pipeline.decoding.ssd.decoder import SelfSpeculativeDecoder
    from shardscribe.pipeline.metrics import corpus_wer
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

    int8 = load_whisper_adapter("embedded", cache_dir=model_cache, quantize="int8", ctc_head="embedded")
    audios = [sample_audio[m["id"]] for m in sample_manifest]
    refs = [m["text"] for m in sample_manifest]
    texts = {}
    for name, adapter in (("float32", ssd_adapter), ("int8", int8)):
        enc = adapter.encode(audios)
        tokens = greedy_decode(adapter, enc.states)
        draft = adapter.ctc_draft(enc)
        rows = SelfSpeculativeDecoder(adapter, tau_ctc=0.6, tau_slm=0.1).decode(enc.states, draft.texts,
                                                                                draft.max_entropy)
        texts[name] = {"ar": [adapter.text(t) for t in tokens], "ssd": [adapter.text(r.tokens) for r in rows]}
        if name == "int8":
            assert greedy_decode(adapter, enc.states, static=StaticDecoding(cpu_static=True)) == tokens
    assert texts["int8"]["ar"] != texts["float32"]["ar"]          # int8 did change something
    for path in ("ar", "ssd"):
        assert corpus_wer(refs, texts["int8"][path]) <= corpus_wer(refs, texts["float32"][path]) + 1e-9, \
            (path, texts["float32"][path], texts["int8"][path])


def test_encoder_dtype_runs_the_encoder_alone_in_that_dtype(model_cache, whisper_adapter, sample_audio,
                                                             sample_manifest):
    from shardscribe.pipeline.device import cpu_bf16_native
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

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
    from shardscribe.pipeline import device
    from shardscribe.pipeline.models import load_model

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
        from shardscribe.pipeline.config import config_hash
        assert (config_hash(load_config(None, ["model.device=cpu"])) !=
                config_hash(load_config(None, ["model.device=cpu", "model.cross_kv_dtype=float32"]))) == native


def test_the_decoder_reads_cross_attention_projected_in_cross_kv_dtype(model_cache, whisper_adapter, sample_audio,
                                                                        sample_manifest):
    """The bfloat16 projection's K/V are the ones the decoder attends to (the model does not
    project the states again), within bfloat16's error of the float32 ones, and decoding
    with them keeps the bundled clips' transcripts."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    from shardscribe.pipeline.decoding.ar.greedy import greedy_decode
    from shardscribe.pipeline.models.whisper.adapter import load_whisper_adapter

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

    from shardscribe.jobs.bench.data import load_recordings, write_long_form
    from shardscribe.pipeline.sources import read_source

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


AVX512_BF16 = frozenset({"avx2", "avx512f", "avx512_bf16"})


@pytest.mark.parametrize("flags, capability, env, native", [
    (AVX512_BF16, "AVX512", {}, True),
    (frozenset({"avx2", "avx512f", "amx_bf16"}), "AVX512", {}, True),
    (frozenset({"avx2", "avx512f", "avx512_vnni"}), "AVX512", {}, False),        # AVX512 without bfloat16
    (frozenset({"avx2", "fma"}), "AVX2", {}, False),
    (AVX512_BF16, "AVX2", {}, False),                                            # ATEN_CPU_CAPABILITY=avx2
    (AVX512_BF16, "AVX512", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, False),
    (AVX512_BF16, "AVX512", {"DNNL_MAX_CPU_ISA": "avx512_core_vnni"}, False),
    (AVX512_BF16, "AVX512", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, True),
    (AVX512_BF16, "AVX512", {"ONEDNN_MAX_CPU_ISA": "ALL"}, True),
    (frozenset(), "AVX512", {}, False),                                          # no /proc/cpuinfo: torch's level
])
def test_native_bfloat16_needs_the_flags_and_no_isa_cap_below_them(flags, capability, env, native):
    from shardscribe.pipeline.device import cpu_bf16_native

    assert cpu_bf16_native(flags, capability, env) is native


def test_capping_torchs_isa_takes_the_non_bfloat16_path_in_a_fresh_process():
    """ATEN_CPU_CAPABILITY=avx2 (read by torch at start-up) is how a CPU with AVX512-BF16
    measures the path of one without it: bfloat16 off, int8 on, whatever this CPU has."""
    import os
    import subprocess
    import sys

    code = ("from shardscribe.pipeline.device import cpu_bf16_native, quantize_name; "
            "print(cpu_bf16_native(), quantize_name('auto', 'cpu'))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "int8"]


def test_auto_quantize_is_int8_on_a_cpu_without_native_bfloat16_only(monkeypatch, model_cache):
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from shardscribe.pipeline import device
    from shardscribe.pipeline.models import load_model

    assert device.quantize_name("none", "cpu") == "none" and device.quantize_name("int8", "cpu") == "int8"
    for native, expected in ((True, "none"), (False, "int8")):
        monkeypatch.setattr(device, "cpu_bf16_native", lambda native=native: native)
        assert device.quantize_name("auto", "cpu") == expected
        assert device.quantize_name("auto", "cuda") == "none"
        adapter = load_model(load_config(None, ["model.device=cpu", f"model.cache_dir={model_cache}"]).model)
        for part, kept in ((adapter.model.model.encoder, {"fc2"}), (adapter.model.model.decoder, set())):
            kinds = {(name.rsplit(".", 1)[-1] in kept, type(m)) for name, m in part.named_modules()
                     if isinstance(m, (torch.nn.Linear, DynamicLinear))}
            if expected == "none":
                assert {k for _, k in kinds} == {torch.nn.Linear}, (native, kinds)
            else:   # the encoder's fc2 stays float32 (INT8_KEPT_FLOAT)
                assert {k for is_kept, k in kinds if not is_kept} == {DynamicLinear}, kinds
                assert {k for is_kept, k in kinds if is_kept} <= {torch.nn.Linear}, kinds
        assert type(adapter.model.proj_out) is torch.nn.Linear
        # the CTC draft head reads the encoder's states in float32 either way
        assert {type(m) for m in adapter.ctc_head.modules() if isinstance(m, (torch.nn.Linear, DynamicLinear))} \
            <= {torch.nn.Linear}


# config_hash of the default config before model.quantize had auto (bfloat16-native CPU,
# then a CPU without it): folders written then must resume under the auto default.
HASH_BEFORE_AUTO = {True: "5c7853ee849d", False: "f53e34460afc"}


def test_quantize_is_an_execution_key_the_config_hash_leaves_out(monkeypatch):
    from shardscribe.pipeline import device
    from shardscribe.pipeline.config import config_hash, hashed_config

    for native in (True, False):
        monkeypatch.setattr(device, "cpu_bf16_native", lambda native=native: native)
        hashes = {q: config_hash(load_config(None, ["model.device=cpu", f"model.quantize={q}"]))
                  for q in ("auto", "none", "int8")}
        assert set(hashes.values()) == {HASH_BEFORE_AUTO[native]}, (native, hashes)
        # the record beside the rows names the old default, whatever ran
        assert hashed_config(load_config(None, ["model.quantize=int8"]))["model"]["quantize"] == "none"
