"""The ``ctc_greedy`` kind: the model's CTC output decoded greedily (best path, repeats
and blanks collapsed); no decoder pass."""
from __future__ import annotations

from ..registry import DecoderKind, register_decoder_kind
from ...models.base import CTC

KIND = register_decoder_kind(DecoderKind(
    "ctc_greedy", "shardscribe.pipeline.kinds.ctc_greedy.stage:build", needs=frozenset({CTC}), packs_windows=True))
