"""Decoder kinds: one module each, one registry entry each.

An entry says what a kind is made of and what it needs, so config validation, the actors,
the Ray plan and the in-process runner never name a kind:
- ``first_stage(adapter, cfg)``: builds the segment decoder the model actor runs;
- ``second_stage(cfg, first_stage)``: optional; builds the finisher of the pending
  results, run by a second actor pool. ``first_stage`` is the first stage's decoder when
  both share a process (so its model and in-process state can be reused), else None; a
  second stage that needs a model and gets None loads its own;
- ``needs``: capabilities the model must have (pipeline.models.base), and
  ``config_needs(cfg)`` those that options of the kind add (SSD's packed gate packs);
- ``packs_windows``: whether ``decoder.pack_windows`` may be set (it reads encoder
  states alone, so clips may share encoder windows);
- ``config_section``: the JobConfig section of its options, if it has one.

Factories are "module:attribute" strings (imported when used, so validating a config does
not import torch) or callables. A DecoderKind travels to Ray actors with the plan, so a
kind registered by a user's own code works in every worker without touching this package.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from pipeline.models.base import ATTENTION_DECODER, BEAM_VOCABULARY, CTC, PACKABLE, TRANSDUCER


def _resolve(ref):
    if callable(ref):
        return ref
    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class DecoderKind:
    name: str
    first_stage: str | Callable
    second_stage: str | Callable | None = None
    needs: frozenset = field(default_factory=frozenset)
    packs_windows: bool = False
    config_section: str | None = None
    config_needs: Callable | None = None   # cfg -> extra capabilities the kind's options need

    @property
    def two_stage(self) -> bool:
        return self.second_stage is not None

    def needs_for(self, cfg) -> frozenset:
        """Capabilities the model must have for this kind under ``cfg``."""
        return self.needs | (frozenset(self.config_needs(cfg)) if self.config_needs else frozenset())

    def build_first_stage(self, adapter, cfg):
        return _resolve(self.first_stage)(adapter, cfg)

    def build_second_stage(self, cfg, first_stage=None):
        return _resolve(self.second_stage)(cfg, first_stage)


DECODER_KINDS: dict[str, DecoderKind] = {}


def register_decoder_kind(kind: DecoderKind) -> DecoderKind:
    DECODER_KINDS[kind.name] = kind
    return kind


def decoder_kind(name: str) -> DecoderKind:
    try:
        return DECODER_KINDS[name]
    except KeyError:
        raise KeyError(f"no decoder kind {name!r} (known: {', '.join(sorted(DECODER_KINDS))})") from None


register_decoder_kind(DecoderKind(
    "ar", "pipeline.decoders.ar:build", needs=frozenset({ATTENTION_DECODER})))
register_decoder_kind(DecoderKind(
    "ctc_greedy", "pipeline.decoders.ctc_greedy:build", needs=frozenset({CTC}), packs_windows=True))
def _ssd_config_needs(cfg) -> frozenset:
    return frozenset({PACKABLE}) if cfg.ssd.packs_gate() else frozenset()


register_decoder_kind(DecoderKind(
    "ssd", "pipeline.decoders.ssd:build_first_pass", "pipeline.decoders.ssd:build_fallback",
    needs=frozenset({CTC, ATTENTION_DECODER}), config_section="ssd", config_needs=_ssd_config_needs))
register_decoder_kind(DecoderKind(
    "ctc_beam", "pipeline.decoders.ctc_beam:build_log_probs", "pipeline.decoders.ctc_beam:build_search",
    needs=frozenset({CTC, BEAM_VOCABULARY}), packs_windows=True, config_section="beam"))
register_decoder_kind(DecoderKind("audit", "pipeline.decoders.audit:build"))
register_decoder_kind(DecoderKind(
    "transducer_greedy", "pipeline.decoders.transducer_greedy:build", needs=frozenset({TRANSDUCER})))
register_decoder_kind(DecoderKind(
    "transducer_beam", "pipeline.decoders.transducer_beam:build_frames", "pipeline.decoders.transducer_beam:build_search",
    needs=frozenset({TRANSDUCER}), config_section="transducer"))
