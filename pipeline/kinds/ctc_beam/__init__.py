"""The ``ctc_beam`` kind: "FlexCTC: GPU-powered CTC Beam Decoding" with FLToP frame-level
token pruning, n-gram LM fusion and phrase boosting."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...config_values import ConfigError, at_least, check_text_file
from ..registry import DecoderKind, register_decoder_kind
from ...models.base import BEAM_VOCABULARY, CTC

@dataclass
class BeamOptions:
    """FlexCTC beam search (FlexCTC: GPU-powered CTC Beam Decoding, eq. 1) with FLToP frame-level
    token pruning and shallow fusion."""
    EXECUTION_KEYS = ("use_cuda_graphs", "native")   # not in config_hash
    FILE_KEYS = ("lm_path", "key_phrases_file")       # hashed by content
    size: int = 8
    beta: float = 0.0                 # insertion bonus per new token
    prune_threshold: float | None = None   # theta, relative to the best hypothesis
    flop_top_n: int | None = None     # FLToP N (null: exact search)
    flop_ratio: float | None = None   # FLToP R
    lm_path: str | None = None        # build-lm output dir or its lm.ngpu.safetensors
    alpha_lm: float = 0.5
    key_phrases: list = field(default_factory=list)
    key_phrases_file: str | None = None
    alpha_boost: float = 0.2         # character phrase trees over-boost at 1.0 (docs/ctc_beam.md)
    context_score: float = 1.0
    depth_scaling: float = 2.0
    boost_case_variants: bool = True  # also boost each phrase with its first letter's case flipped
    use_cuda_graphs: bool = True
    native: bool = True               # CPU: the frame loop in one native call (ctc_beam.loop_native)

    def validate(self, key: str) -> None:
        at_least(f"{key}.size", self.size, 1)
        if self.flop_ratio is not None and self.flop_top_n is None:
            raise ConfigError(f"{key}.flop_ratio: needs {key}.flop_top_n")
        if self.flop_top_n is not None:
            at_least(f"{key}.flop_top_n", self.flop_top_n, 1)
        if self.flop_ratio is not None and not 0.0 < self.flop_ratio <= 1.0:
            raise ConfigError(f"{key}.flop_ratio: must be in (0, 1], got {self.flop_ratio}")
        if self.prune_threshold is not None and self.prune_threshold <= 0:
            raise ConfigError(f"{key}.prune_threshold: must be > 0, got {self.prune_threshold}")
        if not isinstance(self.key_phrases, list) or not all(isinstance(p, str) for p in self.key_phrases):
            raise ConfigError(f"{key}.key_phrases: expected a list of strings")
        for name in ("lm_path", "key_phrases_file"):
            path = getattr(self, name)
            if path and not Path(path).exists():
                raise ConfigError(f"{key}.{name}: {path} does not exist")
        if self.lm_path:
            check_lm_path(f"{key}.lm_path", self.lm_path)
        if self.key_phrases_file:
            check_text_file(f"{key}.key_phrases_file", self.key_phrases_file)


def check_lm_path(key: str, path: str) -> None:
    """The LM tensors a beam decoder loads are there: a build-lm output directory without
    them (an --arpa-only build, a wrong folder) would fail in every beam worker."""
    from ...lm import TENSORS_NAME, lm_tensors_path

    tensors = lm_tensors_path(path)
    if not tensors.is_file():
        raise ConfigError(f"{key}: {path} has no {TENSORS_NAME} (a shardscribe build-lm output directory, "
                          "or that file, is expected)")


KIND = register_decoder_kind(DecoderKind(
    "ctc_beam", "shardscribe.pipeline.kinds.ctc_beam.stages:build_log_probs", "shardscribe.pipeline.kinds.ctc_beam.stages:build_search",
    needs=frozenset({CTC, BEAM_VOCABULARY}), packs_windows=True, config_section="beam", options=BeamOptions))
