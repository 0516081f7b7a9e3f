"""Decoder kinds: one package each (``pipeline/kinds/<kind>/``), one registry entry each.

A kind's ``__init__`` registers it (``pipeline.kinds.registry``) with its options
dataclass and imports no torch; its stages live beside it. Importing this package
registers the built-in kinds; a kind of your own registers the same way from your code.
"""
from __future__ import annotations

from .registry import DECODER_KINDS, DecoderKind, decoder_kind, register_decoder_kind
from . import ar, audit, ctc_beam, ctc_greedy, ssd, transducer_beam, transducer_greedy  # noqa: F401,E402

# The kind a config that names none decodes with (decoder.kind), and that config's name:
# full greedy AR, the baseline.
DEFAULT_KIND = ar.KIND.name

__all__ = ["DECODER_KINDS", "DEFAULT_KIND", "DecoderKind", "decoder_kind", "register_decoder_kind"]
