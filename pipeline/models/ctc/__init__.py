"""The ctc family: any transformers CTC checkpoint (``AutoModelForCTC``: Wav2Vec2ForCTC,
HubertForCTC, ParakeetForCTC, ...), the models "FlexCTC: GPU-powered CTC Beam Decoding"
searches over. It offers the CTC output (``ctc_greedy``) and its vocabulary for the beam
search (``ctc_beam``: :func:`ctc_vocabulary`); see adapter.py for how features, frames,
blank and text come from the checkpoint itself.

``model.source: embedded`` is the family's one model with real weights: the embedded
Whisper tiny.en encoder with its character CTC head (``model.ctc_head``, default the
shipped one), the same adapter the whisper family loads, offered here for its CTC output
only; unlike the checkpoints it can pack short clips into shared encoder windows.
"""
from __future__ import annotations

from ..base import BEAM_VOCABULARY, CTC, PACKABLE
from ..registry import ModelFamily, register_family
from ..whisper.options import WhisperModelOptions


EMBEDDED = "embedded"


def embedded_whisper_config(model_config):
    """The whisper-family config of the embedded encoder + CTC head."""
    return model_config.with_values(family="whisper", source=EMBEDDED, ctc_head=model_config.ctc_head or EMBEDDED)


def load(model_config, device: str, dtype):
    from .adapter import load_ctc_adapter

    if model_config.source == EMBEDDED:
        from ..whisper import load as load_whisper

        return load_whisper(embedded_whisper_config(model_config), device=device, dtype=dtype)
    return load_ctc_adapter(model_config.source, device=device, dtype=dtype)


def check_components(model_config) -> None:
    """The checkpoint's feature extractor and tokenizer load (preflight; ModelError if not)."""
    if model_config.source == EMBEDDED:
        return
    from .adapter import load_processing

    load_processing(model_config.source)


def ctc_vocabulary(model_config):
    """The checkpoint's CTC vocabulary from its config and tokenizer alone (no weights):
    what the beam pool, which loads no model, needs."""
    from ...text.ctc_vocabulary import TokenizerVocabulary, embedded_vocabulary

    if model_config.source == EMBEDDED:
        return embedded_vocabulary(model_config)
    return TokenizerVocabulary.from_pretrained(model_config.source)


def _options(source: str):
    """The embedded model is Whisper's encoder and CTC head: it takes the whisper family's
    keys; a checkpoint has no keys of its own."""
    return WhisperModelOptions if source == EMBEDDED else None


# Any transformers CTC checkpoint. Frame rates differ per model (wav2vec2: 320 samples,
# Parakeet: 1280), but the window rule must be known before a model is loaded: the segment
# cost is priced at the finest common stride, wav2vec2's 20 ms, so 30 s cost 1500 frames
# and no model of the family can exceed the budget that admits one segment. Its embedded
# model (Whisper's encoder + CTC head) packs windows like the whisper family.
FAMILY = register_family(ModelFamily(
    "ctc", "shardscribe.pipeline.models.ctc",
    capabilities=lambda m: frozenset({CTC, BEAM_VOCABULARY} | ({PACKABLE} if m.source == "embedded" else set())),
    max_segment_s=30.0, max_segment_cost=1500,
    hint=lambda cap: ("use --config ctc_model_greedy or ctc_model_beam, or --set decoder.pack_windows=false"
                      if cap == PACKABLE else ""),
    vocabulary="shardscribe.pipeline.models.ctc:ctc_vocabulary",
    # AutoModelForCTC loads the model types of this mapping
    architectures=("*ForCTC",), model_types="transformers.models.auto.modeling_auto:MODEL_FOR_CTC_MAPPING_NAMES",
    has_embedded=True, components="shardscribe.pipeline.models.ctc:check_components", options=_options,
    preflight="shardscribe.pipeline.models.whisper.preflight:check"))
