"""Decoder kind ``ctc_beam``: "FlexCTC: GPU-powered CTC Beam Decoding" (Algorithm 1, eq. 1)
with "FLToP CTC: Frame-Level Token Pruning via Relative Threshold", as two stages. The
model pool emits CTC log-probs over valid frames as CPU arrays (``BeamPending``); a
separate pool runs the batched beam search (pipeline.decoding.ctc_beam) with the n-gram
LM (NGPU-LM, from build-lm) and per-recording phrase boosting, over the model's own CTC
vocabulary (pipeline.text.ctc_vocabulary: its blank, LM token ids and text rule), which the
model family builds from the config alone (``ModelFamily.ctc_vocabulary``), since the
search pool loads no model.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...decoding.ctc_beam import CTCBeamSearch
from ...decoding.ctc_beam.frames import pad_rows
from ...decoding.ctc_words import words_from_path
from ..base import PENDING, PendingState, SegmentResult, encode_then
from ..ctc_greedy.stage import CTCGreedySegmentDecoder

if TYPE_CHECKING:
    from ...models.base import CTCModel

BEAM = "beam"


@dataclass
class BeamPending(PendingState):
    log_probs: np.ndarray             # [T_valid, C] float32
    frame_stride_s: float | None = None   # seconds per frame, for word timings


class CTCLogProbsDecoder(CTCGreedySegmentDecoder):
    """First pool of the beam plan: the ctc_greedy encoder pass, but every segment leaves
    pending with its log-probs [T_valid, C] (the greedy draft's entropy is kept as
    evidence)."""

    name = "ctc_beam"

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        draft, t_enc, t_dec = encode_then(self.adapter, audios, self.adapter.ctc_draft, packed=self.pack)
        lp = draft.log_probs.cpu().numpy()
        return [SegmentResult("", PENDING, 0, t_enc, t_dec, max_entropy=float(h),
                              pending=BeamPending(lp[i, :int(L)].copy(), self.stride_s))
                for i, (h, L) in enumerate(zip(draft.max_entropy.tolist(), draft.lengths.tolist()))]


def load_lm(path: str, device):
    from ...lm import lm_tensors_path
    from ...lm.ngpu_lm import NGramLM

    return NGramLM.load(str(lm_tensors_path(path)), device=device)


class CTCBeamFinisher:
    """Second pool: batched beam search over pending log-probs (pads, lengths, boosting)."""

    name = "ctc_beam"
    pending_type = BeamPending

    def __init__(self, beam_cfg, vocabulary, device="cpu", confidence: bool = False):
        from ...lm.boosting import KeyPhrases

        self.confidence = confidence
        self.cfg = beam_cfg
        self.vocab = vocabulary
        self.device = torch.device(device)
        lm = load_lm(beam_cfg.lm_path, self.device) if beam_cfg.lm_path else None
        self.phrases = KeyPhrases(beam_cfg, vocabulary)
        self.search = CTCBeamSearch(
            beam_cfg.size, blank=vocabulary.blank, beta=beam_cfg.beta, lm=lm,
            alpha_lm=beam_cfg.alpha_lm if lm is not None else 0.0,
            alpha_boost=beam_cfg.alpha_boost, prune_threshold=beam_cfg.prune_threshold,
            flop_top_n=beam_cfg.flop_top_n, flop_ratio=beam_cfg.flop_ratio,
            use_cuda_graphs=beam_cfg.use_cuda_graphs, native=beam_cfg.native)

    def cost(self, result: SegmentResult) -> int:
        return int(result.pending.log_probs.shape[0]) * self.cfg.size

    def _boost(self, results):
        return self.phrases.tree([r.key_phrases for r in results], self.device)

    def finish(self, results: list[SegmentResult]) -> float:
        t0 = time.perf_counter()
        heard = [r for r in results if r.pending.log_probs.shape[0]]
        for r in results:
            if not r.pending.log_probs.shape[0]:
                self._finish_frameless(r)
        if heard:
            self._search(heard)
        return time.perf_counter() - t0

    def _finish_frameless(self, r: SegmentResult) -> None:
        """A segment too short for one model frame: the empty path, as the search gives it
        beside longer rows, without searching (a batch of only such rows has no frame)."""
        r.text, r.stage, r.tokens = "", BEAM, 0
        r.words = None if r.pending.frame_stride_s is None and not self.confidence else []
        if self.confidence:
            r.word_features = []
        r.pending = None

    def _search(self, results: list[SegmentResult]) -> None:
        arrays = [r.pending.log_probs for r in results]
        lengths = torch.tensor([a.shape[0] for a in arrays])
        C = arrays[0].shape[1]
        if C != self.vocab.size:
            raise ValueError(f"log-probs over {C} CTC outputs, but the vocabulary has {self.vocab.size}")
        rows = [torch.tensor(a) for a in arrays]  # arrow buffers are read-only
        # on a CPU the native FLToP scan reads each row in place (no padded copy); a GPU
        # gets one padded batch in one transfer
        lp = rows if torch.device(self.device).type == "cpu" else pad_rows(rows).to(self.device)
        out = self.search(lp, lengths.to(self.device), boost=self._boost(results))
        paths = out.alignments[:, 0].tolist()    # the best hypothesis's surviving alignment
        for b, (r, toks, path, n) in enumerate(zip(results, out.tokens, paths, lengths.tolist())):
            r.text, r.stage, r.tokens = self.vocab.decode(toks).strip(), BEAM, len(toks)
            stride = r.pending.frame_stride_s
            r.words = None if stride is None else words_from_path(path[:n], self.vocab.blank, self.vocab, stride)
            if self.confidence:
                r.words, r.word_features = self._confidence(lp[b][:n], path[:n], out, b, stride)
            r.pending = None


    def _confidence(self, lp: torch.Tensor, path: list[int], out, b: int, stride):
        """Words and confidence features of hypothesis 0 of row ``b``: its frames, its
        agreement with the greedy path's text and the N-best posterior of each word."""
        from ...confidence.features import ctc_words
        from ...models.ctc_greedy import ctc_greedy

        greedy = ctc_greedy(lp.unsqueeze(0), blank=self.vocab.blank).tokens[0]
        scores = out.nbest_scores[b].tolist()
        texts = [self.vocab.decode(t).strip() for t in out.nbest_tokens[b]]
        return ctc_words(lp, path, self.vocab.blank, self.vocab, stride, greedy_text=self.vocab.decode(greedy),
                         nbest=(texts, scores))


def build_log_probs(adapter: CTCModel, cfg) -> CTCLogProbsDecoder:
    return CTCLogProbsDecoder(adapter, pack=cfg.decoder.pack_windows)   # the beam pool times words


def build_search(cfg, first_stage=None) -> CTCBeamFinisher:
    """The beam pool needs no model, only the LM tensors and the model's vocabulary (built
    by its family from the config), so it never shares one."""
    from ...device import resolve_device
    from ...models import model_family

    vocabulary = model_family(cfg.model.family).ctc_vocabulary(cfg.model)
    return CTCBeamFinisher(cfg.beam, vocabulary, device=resolve_device(cfg.model.device),
                           confidence=cfg.confidence.enabled)
