"""The granite-speech family: GraniteSpeechForConditionalGeneration through transformers
(the model of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts").

Its conformer encoder's ``out`` linear is the CTC head; the checkpoint does not name that
head's outputs, so ``model.ctc_vocab`` (a JSON list, blank first) does; without it the
family offers the LLM decoder only.
"""
from __future__ import annotations

import json
from pathlib import Path


def read_ctc_vocab(path: str) -> list[str]:
    try:
        vocab = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.ctc_vocab: cannot read {path}: {exc}") from None
    if not isinstance(vocab, list) or not all(isinstance(t, str) for t in vocab):
        raise ValueError(f"model.ctc_vocab: {path} must hold a JSON list of strings")
    return vocab


def load(model_config, device: str, dtype):
    from pipeline.models.granite_speech.adapter import load_granite_adapter

    vocab = read_ctc_vocab(model_config.ctc_vocab) if model_config.ctc_vocab else None
    return load_granite_adapter(model_config.source, vocab, device=device, dtype=dtype)


def check_components(model_config) -> None:
    """The checkpoint's tokenizer and features load (preflight; ModelError if not)."""
    from pipeline.models.granite_speech.adapter import load_processing

    load_processing(model_config.source)
