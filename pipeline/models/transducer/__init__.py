"""The transducer family: transformers' ``ParakeetForRNNT`` and ``ParakeetForTDT``, the
models "Pushing the Limits of Beam Search Decoding for Transducer-based ASR models"
searches over (ALSD++, AES++: pipeline.decoding.transducer). The adapter (adapter.py)
exposes the projected encoder frames, a predictor step that carries its state and the
joint (token and, for TDT, duration log-probs); transformers' own ``generate`` is greedy
only.
"""
from __future__ import annotations


def load(model_config, device: str, dtype):
    from pipeline.models.transducer.adapter import load_transducer_adapter

    if model_config.source == "embedded":   # the ModelConfig default names a Whisper, not a transducer
        raise ValueError("model.source: the transducer family has no embedded model yet; set it to a "
                         "ParakeetForRNNT/ParakeetForTDT directory or a Hugging Face id in the local cache")
    return load_transducer_adapter(model_config.source, device=device, dtype=dtype)
