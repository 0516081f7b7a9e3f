"""The ``audit`` kind: reads, decodes and segments every recording as a job would, with
no model (``shardscribe validate``)."""
from __future__ import annotations

from ..registry import DecoderKind, register_decoder_kind

# The stage of every segment it reports: rows with no transcript, which the summary does not score.
STAGE = "audit"

KIND = register_decoder_kind(DecoderKind("audit", "shardscribe.pipeline.kinds.audit.stage:build", verb="validating",
                                         untranscribed_stages=frozenset({STAGE})))
