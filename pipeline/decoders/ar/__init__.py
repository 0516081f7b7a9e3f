"""The ``ar`` kind: full greedy autoregressive decoding of an attention decoder (the
baseline), optionally drafting with a token map ("Model-free Speculative Decoding for
Transformer-based ASR with Token Map Drafting")."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.config_values import at_least
from pipeline.decoders.registry import AR_LOOP, DecoderKind, register_decoder_kind
from pipeline.models.base import ATTENTION_DECODER

@dataclass
class TokenMapOptions:
    """Token-map drafting ("Model-free Speculative Decoding for Transformer-based ASR with
    Token Map Drafting"), used where decoder.token_map is set; docs/token_map.md has the
    measurements behind the defaults."""
    candidates: int = 1               # K: continuations verified per row and pass
    max_draft: int = 4                # tokens per continuation
    adaptive: bool = True             # draft only while the running acceptance pays (pipeline.decoding.token_map_policy)
    lookahead_first: bool = False     # SSD fallback with ssd.lookahead: the CTC draft ranks before the map

    def validate(self, key: str) -> None:
        at_least(f"{key}.candidates", self.candidates, 1)
        at_least(f"{key}.max_draft", self.max_draft, 1)


KIND = register_decoder_kind(DecoderKind(
    "ar", "pipeline.decoders.ar.stage:build", needs=frozenset({ATTENTION_DECODER}),
    # token-map drafting is greedy AR's: SSD's fallback reads this section too
    config_section="token_map", options=TokenMapOptions, traits=frozenset({AR_LOOP})))
