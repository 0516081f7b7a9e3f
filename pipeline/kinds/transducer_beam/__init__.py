"""The ``transducer_beam`` kind: "Pushing the Limits of Beam Search Decoding for
Transducer-based ASR models" (ALSD++ and AES++)."""
from __future__ import annotations

from dataclasses import dataclass

from ...config_values import ConfigError, at_least, choice
from ..registry import DecoderKind, register_decoder_kind
from ...models.base import TRANSDUCER

@dataclass
class TransducerOptions:
    """ALSD++ / AES++ ("Pushing the Limits of Beam Search Decoding for Transducer-based ASR
    models"); beam width, LM and key phrases come from the ``beam`` section. The greedy kind
    reads ``max_symbols`` and ``use_cuda_graphs`` too."""
    EXECUTION_KEYS = ("use_cuda_graphs",)   # not in config_hash: the same tokens either way
    algorithm: str = "alsd"           # alsd (RNN-T, TDT) | aes (RNN-T)
    blank_scoring: str = "lm"         # lm: eq. 3 (blank scored with the LM weight) | asr: eq. 2
    pruning: str = "late"             # late: LM before the per-hypothesis top-k | early: after
    max_symbols: int | None = None    # tokens per frame (null: the model's max_symbols_per_step)
    expansion_gamma: float | None = None  # aes: expand only tokens within gamma of a hypothesis's best (mAES)
    use_cuda_graphs: bool = True      # CUDA: greedy label-looping and ALSD++/AES++ steps replayed as CUDA graphs

    def validate(self, key: str) -> None:
        choice(f"{key}.algorithm", self.algorithm, ("alsd", "aes"))
        if self.expansion_gamma is not None:
            if self.algorithm != "aes":
                raise ConfigError(f"{key}.expansion_gamma: AES++'s expansion beam; set {key}.algorithm=aes or "
                                  "leave it null")
            if not isinstance(self.expansion_gamma, (int, float)) or self.expansion_gamma < 0:
                raise ConfigError(f"{key}.expansion_gamma: must be a number >= 0, got {self.expansion_gamma!r}")
        choice(f"{key}.blank_scoring", self.blank_scoring, ("lm", "asr"))
        choice(f"{key}.pruning", self.pruning, ("late", "early"))
        if self.max_symbols is not None:
            at_least(f"{key}.max_symbols", self.max_symbols, 1)
        if not isinstance(self.use_cuda_graphs, bool):
            raise ConfigError(f"{key}.use_cuda_graphs: must be true or false, got {self.use_cuda_graphs!r}")


KIND = register_decoder_kind(DecoderKind(
    "transducer_beam", "shardscribe.pipeline.kinds.transducer_beam.stages:build_frames",
    "shardscribe.pipeline.kinds.transducer_beam.stages:build_search",
    needs=frozenset({TRANSDUCER}), config_section="transducer", options=TransducerOptions,
    preflight="shardscribe.pipeline.kinds.transducer_beam.preflight:check_search"))
