"""The ``ar`` kind: full greedy autoregressive decoding of an attention decoder (the
baseline), optionally drafting with a token map ("Model-free Speculative Decoding for
Transformer-based ASR with Token Map Drafting")."""
from __future__ import annotations

from dataclasses import dataclass

from ...config_values import ConfigError, at_least
from ..registry import AR_LOOP, DecoderKind, register_decoder_kind
from ...decoding.drafting.token_map_online import DEFAULT_MAX_KEYS
from ...models.base import ATTENTION_DECODER


@dataclass
class TokenMapOptions:
    """Token-map drafting ("Model-free Speculative Decoding for Transformer-based ASR with
    Token Map Drafting"), used where decoder.token_map is set or ``online`` is on;
    docs/token_map.md has the measurements behind the defaults."""
    candidates: int = 1               # K: continuations verified per row and pass
    max_draft: int = 4                # tokens per continuation
    adaptive: bool = True             # draft only while the running acceptance pays (pipeline.decoding.drafting.token_map_policy)
    lookahead_first: bool = False     # SSD fallback with ssd.lookahead: the CTC draft ranks before the map
    # Grow a map from the job's own transcripts as its batches finish, in each model
    # process, on top of decoder.token_map where one is set (pipeline.decoding.drafting.token_map_online).
    online: bool = False
    online_max_keys: int = DEFAULT_MAX_KEYS   # the online map's keys, least recently seen dropped first (its memory bound)
    # not in config_hash: drafts are verified greedily, so the transcripts are AR's either way
    EXECUTION_KEYS = ("online", "online_max_keys")

    def validate(self, key: str) -> None:
        at_least(f"{key}.candidates", self.candidates, 1)
        at_least(f"{key}.max_draft", self.max_draft, 1)
        at_least(f"{key}.online_max_keys", self.online_max_keys, 1)


def map_drafting_key(cfg) -> str | None:
    """The key that turns token-map drafting on (for a refusal to name), or None where it is off."""
    if cfg.decoder.token_map is not None:
        return "decoder.token_map"
    return "token_map.online" if cfg.token_map.online else None


def _check_shared(cfg, kind: DecoderKind) -> None:
    """Token-map drafting, whichever kind the job runs: it drafts for an attention
    decoder's greedy decoding (this kind's, SSD's fallback), so a kind without one refuses it."""
    drafting = map_drafting_key(cfg)
    if drafting is not None and ATTENTION_DECODER not in kind.needs_for(cfg):
        raise ConfigError(f"{drafting}: drafts for an attention decoder's greedy decoding; "
                          f"decoder.kind={kind.name} has none")
    # a family option (Whisper's) whose per-step logit rules the drafting pass does not apply
    if drafting is not None and getattr(cfg.model.options, "timestamps", False):
        off = "null" if drafting == "decoder.token_map" else "false"
        raise ConfigError(f"{drafting}: token-map drafting does not apply Whisper's timestamp rules; "
                          f"set {drafting}={off} with model.timestamps")


KIND = register_decoder_kind(DecoderKind(
    "ar", "shardscribe.pipeline.kinds.ar.stage:build", needs=frozenset({ATTENTION_DECODER}),
    # token-map drafting is greedy AR's: SSD's fallback reads this section too
    config_section="token_map", options=TokenMapOptions, traits=frozenset({AR_LOOP}),
    check_shared=_check_shared, summary_entries="shardscribe.pipeline.kinds.ar.job:summary_entries"))
