"""The ctc family: any transformers CTC checkpoint (``AutoModelForCTC``: Wav2Vec2ForCTC,
HubertForCTC, ParakeetForCTC, ...), the models "FlexCTC: GPU-powered CTC Beam Decoding"
searches over. It offers the CTC output (``ctc_greedy``) and its vocabulary for the beam
search (``ctc_beam``: :func:`ctc_vocabulary`); see adapter.py for how features, frames,
blank and text come from the checkpoint itself.
"""
from __future__ import annotations


def load(model_config, device: str, dtype):
    from pipeline.models.ctc.adapter import load_ctc_adapter

    if model_config.source == "embedded":   # the ModelConfig default names a Whisper, not a CTC model
        raise ValueError("model.source: the ctc family has no embedded model; set it to a CTC checkpoint "
                         "directory or a Hugging Face id in the local cache")
    return load_ctc_adapter(model_config.source, device=device, dtype=dtype)


def ctc_vocabulary(model_config):
    """The checkpoint's CTC vocabulary from its config and tokenizer alone (no weights):
    what the beam pool, which loads no model, needs."""
    from pipeline.text.ctc_vocabulary import TokenizerVocabulary

    if model_config.source == "embedded":
        raise ValueError("model.source: the ctc family has no embedded model; set it to a CTC checkpoint "
                         "directory or a Hugging Face id in the local cache")
    return TokenizerVocabulary.from_pretrained(model_config.source)
