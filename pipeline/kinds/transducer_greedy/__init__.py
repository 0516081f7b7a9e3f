"""The ``transducer_greedy`` kind: greedy RNN-T/TDT decoding of a transducer model."""
from __future__ import annotations

from ..registry import DecoderKind, register_decoder_kind
from ...models.base import TRANSDUCER

KIND = register_decoder_kind(DecoderKind(
    "transducer_greedy", "shardscribe.pipeline.kinds.transducer_greedy.stage:build", needs=frozenset({TRANSDUCER})))
