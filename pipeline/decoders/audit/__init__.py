"""The ``audit`` kind: reads, decodes and segments every recording as a job would, with
no model (``shardscribe validate``)."""
from __future__ import annotations

from pipeline.decoders.registry import DecoderKind, register_decoder_kind

KIND = register_decoder_kind(DecoderKind("audit", "pipeline.decoders.audit.stage:build"))
