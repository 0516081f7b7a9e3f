"""The ``transducer_greedy`` kind: greedy RNN-T/TDT decoding of a transducer model."""
from __future__ import annotations

from pipeline.decoders.registry import DecoderKind, register_decoder_kind
from pipeline.models.base import TRANSDUCER

KIND = register_decoder_kind(DecoderKind(
    "transducer_greedy", "pipeline.decoders.transducer_greedy.stage:build", needs=frozenset({TRANSDUCER})))
