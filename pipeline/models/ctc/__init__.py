"""The ctc family: any transformers CTC checkpoint (``AutoModelForCTC``: Wav2Vec2ForCTC,
HubertForCTC, ParakeetForCTC, ...), the models "FlexCTC: GPU-powered CTC Beam Decoding"
searches over. It offers the CTC output only (``ctc_greedy``); see adapter.py for how
features, frames, blank and text come from the checkpoint itself.
"""
from __future__ import annotations


def load(model_config, device: str, dtype):
    from pipeline.models.ctc.adapter import load_ctc_adapter

    if model_config.source == "embedded":   # the ModelConfig default names a Whisper, not a CTC model
        raise ValueError("model.source: the ctc family has no embedded model; set it to a CTC checkpoint "
                         "directory or a Hugging Face id in the local cache")
    return load_ctc_adapter(model_config.source, device=device, dtype=dtype)
