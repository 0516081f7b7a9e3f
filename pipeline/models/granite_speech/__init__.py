"""The granite-speech family: GraniteSpeechForConditionalGeneration through transformers
(the model of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts").

Its conformer encoder's ``out`` linear is the CTC head; the checkpoint does not name that
head's outputs, so ``model.ctc_vocab`` (a JSON list, blank first) does; without it the
family offers the LLM decoder only.
"""
from __future__ import annotations

from ..base import ATTENTION_DECODER, BEAM_VOCABULARY, CTC, PACKABLE
from ..registry import ModelFamily, register_family
from dataclasses import dataclass

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
    from .adapter import load_granite_adapter

    vocab = read_ctc_vocab(model_config.ctc_vocab) if model_config.ctc_vocab else None
    return load_granite_adapter(model_config.source, vocab, device=device, dtype=dtype)


def check_components(model_config) -> None:
    """The checkpoint's tokenizer and features load (preflight; ModelError if not)."""
    from .adapter import load_processing

    load_processing(model_config.source)


_BEAM_VOCAB_HINT = "ctc_beam has no vocabulary for this family's CTC outputs yet; use ctc_greedy"


@dataclass
class GraniteOptions:
    """The granite_speech family's own keys."""
    OWNERS = "granite_speech models"
    FILE_KEYS = ("ctc_vocab",)        # hashed by content
    ctc_vocab: str | None = None      # JSON list naming the encoder's CTC outputs, blank first


FAMILY = register_family(ModelFamily(
    "granite_speech", "shardscribe.pipeline.models.granite_speech",
    capabilities=lambda m: frozenset({ATTENTION_DECODER} | ({CTC} if m.ctc_vocab else set())),
    max_segment_s=60.0, max_segment_cost=3000,
    hint=lambda cap: ("set model.ctc_vocab (a JSON list naming the encoder's CTC outputs, blank first)"
                      if cap == CTC else _BEAM_VOCAB_HINT if cap == BEAM_VOCABULARY
                      else "it cannot pack encoder windows: --set ssd.pack_gate=false" if cap == PACKABLE else ""),
    architectures=("GraniteSpeechForConditionalGeneration",), model_types=("granite_speech",),
    components="shardscribe.pipeline.models.granite_speech:check_components", options=GraniteOptions))
