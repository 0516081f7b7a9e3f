"""What ``auto`` means where the model loads (issue 56, items 2 and 6): model.dtype is
bfloat16 on a CUDA device with native bfloat16 and float32 elsewhere, TF32 is on for a
CUDA model, and batching.max_tokens left null is the CPU's 24000 but sized from free
memory on CUDA, while a number the config sets wins. No GPU is needed: torch.cuda's
queries are monkeypatched, and nothing loads a model."""
from __future__ import annotations

import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import ROOT
from shardscribe.pipeline import batching, device
from shardscribe.pipeline.batching import (CPU_MAX_TOKENS, ModelShape, budget_from_memory, bytes_per_token, max_tokens_set,
                               model_shape, resolve_max_tokens)
from shardscribe.pipeline.config import config_from_dict, config_hash, hashed_config, load_config
from shardscribe.pipeline.config_sections import ModelConfig

TURBO_DIR = "/models/whisper-large-v3-turbo"   # never read: a checkpoint's source, not the shipped model


@pytest.fixture
def cuda(monkeypatch):
    """A CUDA build's queries on a machine without one: available, bf16 as ``set(bf16)``
    says (native unless told otherwise; emulation never counts)."""
    state = {"native": True}

    def is_bf16_supported(including_emulation: bool = True):
        return state["native"] or including_emulation

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    return SimpleNamespace(set_bf16=lambda native: state.update(native=native))


@pytest.fixture
def tf32_flags():
    """The backend flags, off for the test and put back as found afterwards (process-wide)."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# --- model.dtype ------------------------------------------------------------------------


def test_auto_dtype_is_float32_on_the_cpu():
    assert ModelConfig().dtype == "auto"
    assert device.resolve_dtype_name("auto", "cpu") == "float32"
    for name in ("float32", "float16", "bfloat16"):
        assert device.resolve_dtype_name(name, "cpu") == name      # a dtype set is kept
    assert device.load_target(load_config("ar", ["model.device=cpu"]).model) == ("cpu", torch.float32)


def test_auto_dtype_is_float32_where_this_machine_has_no_cuda(monkeypatch, tf32_flags):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device.load_target(ModelConfig(source=TURBO_DIR)) == ("cpu", torch.float32)
    assert tf32_flags() == (False, False)


def test_auto_dtype_is_bfloat16_on_a_cuda_device_with_native_bfloat16(cuda):
    assert device.resolve_dtype_name("auto", "auto") == "bfloat16"
    assert device.resolve_dtype_name("auto", "cuda") == "bfloat16"
    assert device.resolve_dtype_name("auto", "cpu") == "float32"             # model.device=cpu on a GPU machine
    assert device.resolve_dtype_name("auto", "cuda", bf16_ok=False) == "float32"
    assert device.resolve_dtype_name("float32", "cuda") == "float32"
    assert device.load_target(ModelConfig(source=TURBO_DIR))[1] == torch.bfloat16
    assert device.load_target(ModelConfig(source=TURBO_DIR, device="cpu")) == ("cpu", torch.float32)


def test_without_native_bfloat16_auto_is_float32_not_float16(cuda):
    """Volta/Turing: torch emulates bfloat16 there (slower than float32), and float16's range
    overflows in checkpoints trained in bfloat16 or float32; model.dtype=float16 asks for it."""
    cuda.set_bf16(False)
    assert device.resolve_dtype_name("auto", "cuda") == "float32"
    assert device.load_target(ModelConfig(source=TURBO_DIR))[1] == torch.float32
    assert device.load_target(ModelConfig(source=TURBO_DIR, dtype="float16"))[1] == torch.float16


def test_the_shipped_whisper_models_stay_float32_on_cuda(cuda):
    """tiny.en's decoder flips words in bfloat16 (docs/engines.md); the ctc family's embedded
    model (its encoder and CTC head alone) and any other checkpoint run in bfloat16."""
    assert device.load_target(load_config("ar").model)[1] == torch.float32
    assert device.load_target(load_config("ar", ["model.source=embedded-base"]).model)[1] == torch.float32
    assert device.load_target(ModelConfig(family="ctc"))[1] == torch.bfloat16               # embedded
    assert device.load_target(ModelConfig(family="ctc", source=TURBO_DIR))[1] == torch.bfloat16
    assert device.load_target(ModelConfig(family="transducer"))[1] == torch.bfloat16


def test_auto_dtype_hashes_as_the_old_float32_default():
    """Output folders written under the float32 default resume under auto."""
    auto = load_config("ar")
    assert hashed_config(auto)["model"]["dtype"] == "float32"
    assert config_hash(auto) == config_hash(load_config("ar", ["model.dtype=float32"]))
    assert config_hash(auto) == config_hash(load_config("ar", ["model.dtype=auto"]))
    assert config_hash(auto) != config_hash(load_config("ar", ["model.dtype=bfloat16", "model.device=cuda"]))


def test_an_unknown_dtype_is_refused_naming_the_key():
    from shardscribe.pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="model.dtype: expected one of auto, float32"):
        load_config("ar", ["model.dtype=half"])


# --- TF32 -------------------------------------------------------------------------------


def test_tf32_is_switched_on_for_a_cuda_model_only(cuda, tf32_flags):
    assert device.enable_tf32("cpu") is False
    assert tf32_flags() == (False, False)
    device.load_target(ModelConfig(source=TURBO_DIR, device="cpu"))
    assert tf32_flags() == (False, False)
    device.load_target(ModelConfig(source=TURBO_DIR))      # auto: the (patched) GPU
    assert tf32_flags() == (True, True)


def test_tf32_is_on_for_an_explicit_cuda_index_and_a_float32_model(cuda, tf32_flags):
    assert device.enable_tf32("cuda:1") is True
    assert tf32_flags() == (True, True)


# --- batching.max_tokens --------------------------------------------------------------


def test_null_max_tokens_is_todays_cpu_number_and_survives_the_trip_to_a_worker():
    cfg = load_config("ar")
    value = cfg.batching.max_tokens
    assert value == CPU_MAX_TOKENS == 24000 and not max_tokens_set(value)
    shipped = config_from_dict(pickle.loads(pickle.dumps(cfg.to_dict())))     # what a Ray actor receives
    assert not max_tokens_set(shipped.batching.max_tokens) and shipped.batching.max_tokens == 24000
    assert not max_tokens_set(load_config("ar", ["batching.max_tokens=null"]).batching.max_tokens)
    explicit = load_config("ar", ["batching.max_tokens=24000"]).batching.max_tokens
    assert max_tokens_set(explicit) and explicit == 24000
    assert config_hash(cfg) == config_hash(load_config("ar", ["batching.max_tokens=30000"]))


def test_budget_from_memory_is_monotone_in_free_memory_and_never_below_its_floor():
    per_token, model, floor = 50_000.0, 2 << 30, 1500
    frees = [0, 1 << 20, 1 << 30, 3 << 30, 8 << 30, 40 << 30, 80 << 30, 140 << 30]
    budgets = [budget_from_memory(f, model, per_token, 0.2, floor=floor) for f in frees]
    assert budgets == sorted(budgets)
    assert min(budgets) == floor == budgets[0]            # a full GPU still runs one segment a batch
    assert budgets[-1] > budgets[-2] > floor
    # what it reserves: the fraction of free memory, then one model's size
    assert budget_from_memory(100_000, 0, 1.0, 0.2) == 80_000
    assert budget_from_memory(100_000, 30_000, 1.0, 0.2) == 50_000
    assert budget_from_memory(100_000, 30_000, 1.0, 0.0) == 70_000
    with pytest.raises(ValueError):
        budget_from_memory(100_000, 0, 0.0)
    with pytest.raises(ValueError):
        budget_from_memory(100_000, 0, 1.0, 1.0)


def test_bytes_per_token_reads_every_familys_config():
    from transformers import GraniteSpeechConfig, ParakeetCTCConfig, Wav2Vec2Config, WhisperConfig

    turbo = WhisperConfig(d_model=1280, encoder_ffn_dim=5120, decoder_layers=4, encoder_attention_heads=20,
                          vocab_size=51866)
    turbo._attn_implementation = "sdpa"
    shape = model_shape(turbo)
    assert shape == ModelShape(hidden=1280, ffn=5120, decoder_layers=4, decoder_kv=1280, vocab=51866)
    per = bytes_per_token(shape, 2, 1500, 224)
    assert 40_000 < per < 80_000                   # ~55 KB a frame: ~80 MB a 30-s segment in bf16
    assert bytes_per_token(shape, 4, 1500, 224) > per
    assert bytes_per_token(shape, 2, 1500, 448) > per                      # a longer KV cache
    eager = WhisperConfig(d_model=1280, encoder_ffn_dim=5120, decoder_layers=4, encoder_attention_heads=20)
    eager._attn_implementation = "eager"
    assert model_shape(eager).score_heads == 20                            # scores materialised
    ctc = model_shape(Wav2Vec2Config())
    assert (ctc.hidden, ctc.ffn, ctc.decoder_layers, ctc.vocab) == (768, 3072, 0, 32)
    parakeet = model_shape(ParakeetCTCConfig())
    assert (parakeet.hidden, parakeet.ffn, parakeet.vocab) == (1024, 4096, 1025)
    granite = GraniteSpeechConfig()
    shape = model_shape(granite)
    text = granite.text_config
    heads = text.num_attention_heads
    assert shape.decoder_layers == text.num_hidden_layers and shape.hidden == granite.encoder_config.hidden_dim
    assert shape.decoder_kv == text.num_key_value_heads * (text.hidden_size // heads)
    assert shape.frames_per_decoder_token == granite.downsample_rate
    assert (shape.score_heads, shape.score_span) == (granite.encoder_config.num_heads,
                                                     granite.encoder_config.context_size)
    assert model_shape(None).hidden == 1024                                # no config: a default width


def _adapter(where: str, dtype=torch.bfloat16):
    config = SimpleNamespace(d_model=1280, encoder_ffn_dim=5120, decoder_layers=4, vocab_size=51866,
                             _attn_implementation="sdpa")
    return SimpleNamespace(device=torch.device(where), dtype=dtype, model=SimpleNamespace(config=config),
                           segment_cost=lambda num_samples: 1500)


def test_max_tokens_on_cuda_comes_from_free_memory_unless_set(monkeypatch):
    memory = {"free": 60 << 30}
    monkeypatch.setattr(device, "cuda_memory", lambda where: (memory["free"], 2 << 30))
    cfg = load_config("ar")
    gpu = resolve_max_tokens(cfg, _adapter("cuda"))
    assert gpu > CPU_MAX_TOKENS and max_tokens_set(gpu)
    memory["free"] = 100 << 30
    assert resolve_max_tokens(cfg, _adapter("cuda:0")) > gpu
    memory["free"] = 1 << 20
    assert resolve_max_tokens(cfg, _adapter("cuda")) == 1500                # one segment at least
    assert resolve_max_tokens(load_config("ar", ["batching.max_tokens=12000"]), _adapter("cuda")) == 12000
    assert resolve_max_tokens(load_config("ar", ["batching.max_tokens=24000"]), _adapter("cuda")) == 24000


def test_max_tokens_on_the_cpu_is_exactly_todays(monkeypatch):
    def no_gpu(where):
        raise AssertionError("the CPU path asked CUDA for its memory")

    monkeypatch.setattr(device, "cuda_memory", no_gpu)
    cfg = load_config("ar")
    value = resolve_max_tokens(cfg, _adapter("cpu", torch.float32))
    assert value == 24000 and not max_tokens_set(value)
    assert resolve_max_tokens(load_config("ar", ["batching.max_tokens=3000"]), _adapter("cpu")) == 3000


def test_the_batching_module_stays_pure_where_it_is_imported_from():
    """The config imports pipeline.batching; it must not pull torch in at import time."""
    code = "import sys, pipeline.config_sections; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
    assert batching.RESERVE_FRACTION < 1


# --- shardscribe keys -----------------------------------------------------------------


def _keys(section: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "keys", section], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_keys_lists_batching_with_rows_per_call_apart_from_the_gpu_batch():
    text = _keys("batching")
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("  batching.")]
    assert listed == [f"batching.{k}" for k in load_config("default").to_dict()["batching"]]
    assert "batching.max_tokens (int | null) = None" in text
    rows, budget = text.split("batching.max_tokens")[0], text.split("batching.max_tokens")[1]
    assert "not the GPU batch" in rows and "The GPU batch" in budget and "free memory" in budget


def test_keys_lists_the_model_keys_with_auto_dtype():
    text = _keys("model")
    assert "model.dtype (str) = auto" in text and "model.device (str) = auto" in text
    assert "bfloat16 on a CUDA device" in text and "TF32" in text
