"""Thin wrappers around the CPU CTC beam decoders we compare FlexCTC (FlexCTC: GPU-powered CTC Beam Decoding, §IV-D) with:
flashlight-text's LexiconFreeDecoder (token-level KenLM, the same ARPA as NGPU-LM) and
pyctcdecode (word-level KenLM, hotwords). Both decode one utterance at a time on the CPU;
both take the same log-probs [T, V+1] as our decoder. Imports are lazy: these are test
and benchmark dependencies (``pip install flashlight-text``; ``pyctcdecode --no-deps``).
"""
from __future__ import annotations

import math

import numpy as np

from ...lm.arpa import token_word


def lm_token_of(ctc_id: int, blank: int) -> int:
    """LM index of a CTC id: the rank among the non-blank tokens."""
    return ctc_id if ctc_id < blank else ctc_id - 1


class FlashlightCTC:
    """flashlight-text LexiconFreeDecoder: max-merge (``log_add=False``) like our default,
    ``beam_size_token`` = all tokens unless given (its static top-N per frame).

    ``lm_weight`` is in our units (natural-log LM scores); flashlight's KenLM returns log10
    scores, so its weight is ``lm_weight * ln 10`` and its scores equal eq. 1's."""

    def __init__(self, num_classes: int, blank: int, beam_size: int, space: int,
                 arpa_path: str | None = None, lm_weight: float = 0.0,
                 beam_threshold: float = 1e9, beam_size_token: int | None = None,
                 log_add: bool = False):
        from flashlight.lib.text.decoder import (CriterionType, LexiconFreeDecoder,
                                                 LexiconFreeDecoderOptions, ZeroLM)
        from flashlight.lib.text.dictionary import Dictionary

        self.num_classes, self.blank = num_classes, blank
        options = LexiconFreeDecoderOptions(
            beam_size=beam_size, beam_size_token=beam_size_token or num_classes,
            beam_threshold=beam_threshold, lm_weight=lm_weight * math.log(10.0), sil_score=0.0,
            log_add=log_add, criterion_type=CriterionType.CTC)
        if arpa_path is None:
            lm = ZeroLM()
        else:
            from flashlight.lib.text.decoder.kenlm import KenLM

            tokens = Dictionary()
            for c in range(num_classes):
                # the ARPA spells LM token i as chr(i + 100) (pipeline.lm.arpa)
                tokens.add_entry("<blank>" if c == blank else token_word(lm_token_of(c, blank)))
            lm = KenLM(arpa_path, tokens)
        self._lm = lm  # the decoder keeps a reference only on the C++ side
        self.decoder = LexiconFreeDecoder(options, lm, space, blank, [])

    def decode(self, log_probs: np.ndarray) -> tuple[list[int], float]:
        """Collapsed token ids and score of the best hypothesis."""
        emissions = np.ascontiguousarray(log_probs, dtype=np.float32)
        t, v = emissions.shape
        best = self.decoder.decode(emissions.ctypes.data, t, v)[0]
        out, prev = [], self.blank
        for tok in list(best.tokens)[1:-1]:  # first/last entries are its start/end states
            if tok >= 0 and tok != self.blank and tok != prev:
                out.append(int(tok))
            prev = tok
        return out, float(best.score)


class PyCTCDecode:
    """pyctcdecode's BeamSearchDecoderCTC over ``labels`` (blank = ""), optionally with a
    word-level KenLM model and hotwords. Pruning knobs are opened wide by default so its
    search is as close to exhaustive within the beam as it allows."""

    def __init__(self, labels: list[str], kenlm_path: str | None = None, alpha: float = 0.5,
                 beta: float = 0.0):
        import logging

        from pyctcdecode import build_ctcdecoder

        logging.getLogger("pyctcdecode").setLevel(logging.ERROR)  # unigram-list warnings
        self.decoder = build_ctcdecoder(labels, kenlm_model_path=kenlm_path, alpha=alpha, beta=beta)

    def decode(self, log_probs: np.ndarray, beam_size: int, hotwords: list[str] | None = None,
               hotword_weight: float = 10.0, beam_prune_logp: float = -1e9,
               token_min_logp: float = -1e9) -> str:
        return self.decoder.decode(np.asarray(log_probs, dtype=np.float32), beam_width=beam_size,
                                   beam_prune_logp=beam_prune_logp, token_min_logp=token_min_logp,
                                   hotwords=hotwords, hotword_weight=hotword_weight)
