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

import dataclasses

EMBEDDED = "embedded"


def embedded_whisper_config(model_config):
    """The whisper-family config of the embedded encoder + CTC head."""
    return dataclasses.replace(model_config, family="whisper", source=EMBEDDED,
                               ctc_head=model_config.ctc_head or EMBEDDED)


def load(model_config, device: str, dtype):
    from pipeline.models.ctc.adapter import load_ctc_adapter

    if model_config.source == EMBEDDED:
        from pipeline.models import whisper

        return whisper.load(embedded_whisper_config(model_config), device=device, dtype=dtype)
    return load_ctc_adapter(model_config.source, device=device, dtype=dtype)


def check_components(model_config) -> None:
    """The checkpoint's feature extractor and tokenizer load (preflight; ModelError if not)."""
    if model_config.source == EMBEDDED:
        return
    from pipeline.models.ctc.adapter import load_processing

    load_processing(model_config.source)


def ctc_vocabulary(model_config):
    """The checkpoint's CTC vocabulary from its config and tokenizer alone (no weights):
    what the beam pool, which loads no model, needs."""
    from pipeline.text.ctc_vocabulary import TokenizerVocabulary, embedded_vocabulary

    if model_config.source == EMBEDDED:
        return embedded_vocabulary(model_config)
    return TokenizerVocabulary.from_pretrained(model_config.source)
