"""Whether an English-only Whisper model (tiny.en) could transcribe a segment at all: the
model has no language token to detect with, so its own decode is the evidence.

The rule is Whisper's failed-decode rule ("Robust Speech Recognition via Large-Scale Weak
Supervision", §4.5: the thresholds of its temperature fallback): the segment's greedy text
has a mean token log-probability below ``min_mean_logprob`` (-1.0: the decoder did not
believe its text) or a compression ratio above ``max_compression_ratio`` (2.4: a
repetition loop). On Spanish and French speech tiny.en writes English-sounding words it
gives low probability, or loops; on English it does neither (docs/languages.md has the
measurement: no English segment of the held-out set, real recordings included, fails,
and 31 of 32 Spanish and French ones do).

A segment that fails is written with language ``und`` (ISO 639-2 "undetermined": the
model cannot say what it is, only that it is not what it transcribes), one that passes
with ``en``; pipeline.filters turns ``und`` into the ``language_mismatch`` reason.

The log-probabilities come from one teacher-forced decoder pass over the greedy tokens
(the pass confidence features take): greedy decoding picks its tokens through a screened
argmax without computing them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...filters import UNDETERMINED, compression_ratio


@dataclass(frozen=True)
class EnglishOnlyCheck:
    min_mean_logprob: float
    max_compression_ratio: float | None

    @classmethod
    def of(cls, adapter, filters_cfg) -> "EnglishOnlyCheck | None":
        """The check for ``adapter`` (an ARDecoderModel) under ``filters_cfg`` (FiltersConfig):
        None unless the adapter is an English-only Whisper model (decoding options set, its
        special tokens not multilingual) and filters.english_only_logprob is set."""
        if adapter.options is None or adapter.special.multilingual or filters_cfg.english_only_logprob is None:
            return None
        return cls(filters_cfg.english_only_logprob, filters_cfg.max_compression_ratio)

    def passes(self, text: str, mean_logprob: float) -> bool:
        if not text.strip():
            return True             # nothing decoded: the empty and no-speech checks judge it
        if self.max_compression_ratio is not None and compression_ratio(text) > self.max_compression_ratio:
            return False
        return mean_logprob >= self.min_mean_logprob

    def languages(self, adapter, encoder_states, tokens: list[list[int]],
                  prompts: list[list[int]] | None = None, cross_kv: list | None = None) -> list[str]:
        """Per row of ``tokens`` (decoded over ``encoder_states`` after ``prompts``): ``en``
        where the model's decode passes the rule, else ``und``."""
        lps = mean_logprobs(adapter, encoder_states, tokens, prompts, cross_kv)
        return ["en" if self.passes(adapter.text(t), lp) else UNDETERMINED for t, lp in zip(tokens, lps)]


@torch.inference_mode()
def mean_logprobs(adapter, encoder_states: torch.Tensor, tokens: list[list[int]],
                  prompts: list[list[int]] | None = None, cross_kv: list | None = None) -> list[float]:
    """Per row, the mean log-probability of its tokens under the decoder, with greedy's
    token masks (pipeline.models.teacher_forcing: one teacher-forced
    pass; ``cross_kv``: the rows' cross-attention K/V from their greedy decoding, reused).
    0 for a row without tokens."""
    from ..teacher_forcing import teacher_forced_logprobs

    out = []
    for row in teacher_forced_logprobs(adapter, encoder_states, tokens, prompts, cross_kv):
        if row is None:
            out.append(0.0)
            continue
        lp, ids = row
        # a suppressed token (-inf) counts as p = 1e-30
        out.append(float(lp.gather(-1, ids.unsqueeze(-1)).clamp(min=-69.0).mean()))
    return out
