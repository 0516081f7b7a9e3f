"""CTC beam-search stages (seed 002 Algorithm 1 with seed 003 FLToP): the model pool emits
CTC log-probs over valid frames as CPU arrays; a separate pool runs the batched beam
search with the n-gram LM (NGPU-LM from build-lm) and per-utterance phrase boosting.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from pipeline.decoding.ctc_beam import CTCBeamSearch
from pipeline.text import charset
from pipeline.transcribe import ENCODER_FRAMES, PENDING, SegmentResult, encode_then, packed_frames

BEAM = "beam"


class CTCLogProbsDecoder:
    """First pool of the beam plan: encoder + CTC head; every segment leaves pending with
    its log-probs [T_valid, C] (the greedy draft's entropy is kept as evidence)."""

    name = "ctc_beam"

    def __init__(self, adapter, pack: bool = False):
        self.adapter = adapter
        self.pack = pack

    def segment_cost(self, audio: np.ndarray) -> int:
        return packed_frames(audio) if self.pack else ENCODER_FRAMES

    def decode(self, audios: list[np.ndarray]) -> list[SegmentResult]:
        draft, t_enc, t_dec = encode_then(self.adapter, audios, self.adapter.ctc_draft, packed=self.pack)
        lp = draft.log_probs.cpu().numpy()
        return [SegmentResult("", PENDING, 0, t_enc, t_dec, max_entropy=float(h), states=lp[i, :int(L)].copy())
                for i, (h, L) in enumerate(zip(draft.max_entropy.tolist(), draft.lengths.tolist()))]


def lm_token_ids(text: str) -> list[int]:
    """Key phrase -> LM token ids (CTC character id - 1; blank has no LM token)."""
    return [i - 1 for i in charset.encode(text)]


def load_lm(path: str, device):
    from pipeline.lm.ngpu_lm import NGramLM

    p = Path(path)
    if p.is_dir():
        p = p / "lm.ngpu.safetensors"
    return NGramLM.load(str(p), device=device)


class CTCBeamFinisher:
    """Second pool: batched beam search over pending log-probs (pads, lengths, boosting)."""

    name = "ctc_beam"

    def __init__(self, beam_cfg, device="cpu"):
        from pipeline.lm.boosting import read_phrase_file

        self.cfg = beam_cfg
        self.device = torch.device(device)
        lm = load_lm(beam_cfg.lm_path, self.device) if beam_cfg.lm_path else None
        self.shared_phrases = list(beam_cfg.key_phrases or [])
        if beam_cfg.key_phrases_file:
            self.shared_phrases += read_phrase_file(beam_cfg.key_phrases_file)
        self.search = CTCBeamSearch(
            beam_cfg.size, blank=charset.BLANK, beta=beam_cfg.beta, lm=lm,
            alpha_lm=beam_cfg.alpha_lm if lm is not None else 0.0,
            alpha_boost=beam_cfg.alpha_boost, prune_threshold=beam_cfg.prune_threshold,
            flop_top_n=beam_cfg.flop_top_n, flop_ratio=beam_cfg.flop_ratio,
            use_cuda_graphs=beam_cfg.use_cuda_graphs, native=beam_cfg.native)

    def cost(self, result: SegmentResult) -> int:
        return int(result.states.shape[0]) * self.cfg.size

    def _boost(self, results):
        from pipeline.lm.boosting import BoostingTree, batch_phrase_lists, case_variants

        per_row = [r.key_phrases for r in results]
        if not self.shared_phrases and not any(per_row):
            return None
        lists, rows = batch_phrase_lists(self.shared_phrases, per_row)
        if self.cfg.boost_case_variants:
            lists = [case_variants(phrases) for phrases in lists]
        tree = BoostingTree.from_phrases(lists, len(charset.CHARS), tokenize=lm_token_ids,
                                         context_score=self.cfg.context_score,
                                         depth_scaling=self.cfg.depth_scaling)
        return tree.to(self.device).with_lists(rows)

    def finish(self, results: list[SegmentResult]) -> float:
        t0 = time.perf_counter()
        lengths = torch.tensor([r.states.shape[0] for r in results])
        T, C = int(lengths.max()), results[0].states.shape[1]
        lp = torch.full((len(results), T, C), float("-inf"))
        lp[:, :, charset.BLANK] = 0.0
        for i, r in enumerate(results):
            lp[i, :r.states.shape[0]] = torch.tensor(r.states)  # arrow buffers are read-only
        out = self.search(lp.to(self.device), lengths.to(self.device), boost=self._boost(results))
        for r, toks in zip(results, out.tokens):
            r.text, r.stage, r.tokens = charset.decode(toks).strip(), BEAM, len(toks)
            r.states = None
        return time.perf_counter() - t0
