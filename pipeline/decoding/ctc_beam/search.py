"""Batched CTC beam search of "FlexCTC: GPU-powered CTC Beam Decoding with advanced
Contextual Abilities" (Algorithm 1, eq. 1 scores) over [B, beam, V+1] tensors, with the
frame-level token pruning of "FLToP CTC: Frame-Level Token Pruning via Relative Threshold
for Efficient and Memory-Saving Decoding on Diverse Platforms" (Algorithm 1).

:class:`CTCBeamSearch` wires the parts together and picks the frame loop:

- frames (:mod:`.frames`): blank to column 0, padded frames frozen, FLToP pruning and
  run folding;
- fusion lookups (:mod:`.fusion`): NGPU-LM, boosting tree, insertion bonus;
- the per-frame step (:mod:`.step`), run by one of three loops that give identical
  results: on CUDA a captured graph (:mod:`.loop_graphs`), on a CPU one native call
  (:mod:`.loop_native`, where the configuration allows), else eagerly
  (:mod:`.loop_eager`);
- the end: the fusion models' final scores (LM end of sentence, boosting tree), then
  hypotheses that differ only in their last frame label are merged, the n-best are read
  back from the trie (:mod:`.state`).

The only Python loop of the search is over frames, with no host sync and no
data-dependent control flow inside it. On a CPU there is no graph to replay and the
step's tensor ops cost their dispatch, not their arithmetic, hence the native loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# The submodule by its full name: ``from . import loop_native`` reads it through this
# package's __init__, which imports this module (an import cycle).
import shardscribe.pipeline.decoding.ctc_beam.loop_native as loop_native
from .frames import prepare_frames
from .fusion import (FusionModel, LookupCache, ShallowFusion, add_final_scores,
                     initial_states)
from .loop_eager import eager_loop
from .loop_graphs import GraphedFrameLoop
from .state import BeamSearchResult, Beams, Frames, trie_alignments
from .step import FrameStep

LOOPS = ("native", "cuda_graph", "eager")


@dataclass
class SearchInputs:
    """Everything a frame loop needs for one call: the prepared frames, the active fusion
    models [(model, alpha)], their lookups, the initial beams and the valid lengths."""

    frames: Frames
    fusion: list
    lookups: list
    beams: Beams
    lengths: torch.Tensor


class CTCBeamSearch:
    """Batched CTC beam search with shallow fusion and FLToP (see the module docstring).

    Args:
        beam_size: hypotheses kept per utterance (K).
        blank: CTC blank id in the input's last dimension.
        beta: insertion bonus per new token (eq. 1's beta).
        lm, alpha_lm: an n-gram LM implementing :class:`FusionModel` and its weight.
        boost, alpha_boost: a phrase-boosting tree (same protocol) and its weight; a
            per-batch tree (per-utterance phrase lists) can be given to ``__call__``.
        prune_threshold: theta; hypotheses below best - theta are dropped (None = off).
        flop_top_n, flop_ratio: FLToP's N and R (None = exact search over all tokens).
        nbest: how many hypotheses to return per utterance (default: beam_size).
        merge: "max" (Viterbi recombination) or "logsumexp" (prefix probability).
        track_beams: also report the mean number of live hypotheses per frame.
        use_cuda_graphs: on CUDA, replay a captured frame step (falls back to eager
            when capture fails); ignored on CPU.
        preselect: the flat TopK keeps ``preselect * beam_size`` candidates, recombines
            them, then keeps the best ``beam_size``; 1 = Algorithm 1 (recombine after
            TopK, duplicates may occupy beam slots), 2-3 = merge before selection, as
            flashlight does.
        dense_fusion_max_bytes: fusion models that report their state count and fit
            are replaced by exact dense [states, V] lookup tables
            (``pipeline.decoding.ctc_beam.fusion_table``); 0 disables.
        compress_frames: with FLToP, search a run of frames that all keep one and the
            same token as one frame (exact; see :mod:`.frames`). Ignored without FLToP.
        native: on CPU, run the frame loop and the back-tracking in one native call each
            (:mod:`.loop_native`: the same step without per-op dispatch); falls back to
            the torch step where it does not apply (logsumexp merge, fusion models
            without dense tables, no C compiler).

    ``__call__(log_probs [B, T, V+1] or a list of [T_b, V+1], lengths [B]) ->
    BeamSearchResult``; log_probs must be normalised log-probabilities (log_softmax).
    ``last_loop`` names the loop that ran the last call (one of ``LOOPS``).
    """

    def __init__(self, beam_size: int, blank: int = 0, beta: float = 0.0, lm: FusionModel | None = None,
                 alpha_lm: float = 0.0, boost: FusionModel | None = None, alpha_boost: float = 0.0,
                 prune_threshold: float | None = None, flop_top_n: int | None = None,
                 flop_ratio: float | None = None, nbest: int | None = None, merge: str = "max",
                 track_beams: bool = False, use_cuda_graphs: bool = True,
                 dense_fusion_max_bytes: int = 256 * 2 ** 20, preselect: int = 2,
                 compress_frames: bool = True, native: bool = True):
        if beam_size < 1:
            raise ValueError("beam_size must be >= 1")
        if blank < 0:
            raise ValueError("blank must be a non-negative index")
        if merge not in ("max", "logsumexp"):
            raise ValueError("merge must be 'max' or 'logsumexp'")
        if flop_top_n is None and flop_ratio is not None:
            raise ValueError("flop_ratio needs flop_top_n")
        self.beam_size = beam_size
        self.blank = blank
        self.beta = float(beta)
        self.dense_fusion_max_bytes = dense_fusion_max_bytes
        if preselect < 1:
            raise ValueError("preselect must be >= 1")
        self.preselect = preselect
        self.fusion = ShallowFusion(lm, alpha_lm, boost, alpha_boost, dense_fusion_max_bytes)
        self.lm, self.alpha_lm = self.fusion.lm, self.fusion.alpha_lm
        self.boost, self.alpha_boost = self.fusion.boost, self.fusion.alpha_boost
        self.prune_threshold = prune_threshold
        self.flop_top_n, self.flop_ratio = flop_top_n, flop_ratio
        self.compress_frames = compress_frames
        self.nbest = nbest or beam_size
        self.merge = merge
        self.track_beams = track_beams
        self.use_cuda_graphs = use_cuda_graphs
        self.native = native
        self.step = FrameStep(preselect, merge, prune_threshold is not None)
        self.last_loop: str | None = None
        self._graphs: dict = {}  # (input shape, device) -> GraphedFrameLoop
        self._lookups = LookupCache()

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def __call__(self, log_probs: torch.Tensor, lengths: torch.Tensor | None = None,
                 boost: FusionModel | None = None) -> BeamSearchResult:
        inputs = self.prepare(log_probs, lengths, boost)
        beams, choices, alive = self._run(inputs)
        return self.finish(inputs, beams, choices, alive)

    def prepare(self, log_probs: torch.Tensor, lengths: torch.Tensor | None = None,
                boost: FusionModel | None = None) -> SearchInputs:
        """Frames, fusion lookups and initial beams for ``log_probs`` [B, T, V+1], or a
        list of each utterance's [T_b, V+1] log-probs (FLToP on the native path reads
        them in place; otherwise they are padded)."""
        if isinstance(log_probs, torch.Tensor):
            b, t, v1 = log_probs.shape
            device = log_probs.device
        else:
            log_probs = list(log_probs)
            if not log_probs:
                raise ValueError("no utterances")
            b, v1, device = len(log_probs), int(log_probs[0].shape[-1]), log_probs[0].device
            row_lengths = torch.tensor([int(r.shape[0]) for r in log_probs], dtype=torch.int64)
            if lengths is not None and bool((lengths.cpu() > row_lengths).any()):
                raise ValueError("a length is longer than its utterance's log-probs")
            lengths = row_lengths if lengths is None else lengths
            t = int(row_lengths.max())
        if lengths is None:
            lengths = torch.full((b,), t, dtype=torch.int64)
        lengths = lengths.to(device=device, dtype=torch.int64)
        fusion = self.fusion.active(boost)
        frames = prepare_frames(log_probs, lengths, blank=self.blank, prune_threshold=self.prune_threshold,
                                flop_top_n=self.flop_top_n, flop_ratio=self.flop_ratio,
                                compress=self.compress_frames, merge=self.merge, native=self._native(device))
        self.step.set_vocab(v1, device)
        lookups = self._lookups.lookups(fusion, self.beta, v1 - 1, device)
        beams = Beams.initial(b, self.beam_size, device, initial_states(fusion, lookups, b, self.beam_size, device))
        return SearchInputs(frames, fusion, lookups, beams, lengths)

    def finish(self, inputs: SearchInputs, beams: Beams, choices: torch.Tensor,
               alive: torch.Tensor | None) -> BeamSearchResult:
        """The result from a frame loop's ``(beams, choices, alive)``: final fusion
        scores, merge of hypotheses that differ only in their last label, n-best read
        back from the trie."""
        frames = inputs.frames
        k = beams.scores.shape[1]
        scores = add_final_scores(beams.scores, inputs.fusion, inputs.lookups, beams.fusion)
        # hypotheses that differ only in the last frame label are one transcript
        scores, order = scores.sort(dim=1, descending=True)
        scores = self.step.recombine(scores, beams.key.gather(1, order))
        n = min(self.nbest, k)
        nbest_scores, pos = scores.topk(n, dim=1)
        slots = order.gather(1, pos)
        w = frames.values.shape[-1]
        finite = torch.isfinite(nbest_scores)
        native = self._native(choices.device)
        emitted = None
        if native:
            emitted = native.alignments(choices, frames.tokens, slots, w, frames.frame_map,
                                        frames.num_frames, self.blank, finite)
        if emitted is None:
            emitted = trie_alignments(choices, frames.tokens, slots, w, frames.frame_map,
                                      frames.num_frames, self.blank, finite)
        avg = None
        if alive is not None:
            avg = alive / inputs.lengths.clamp(min=1).to(alive)
        return BeamSearchResult.from_emissions(nbest_scores, *emitted, avg_beams=avg)

    # --------------------------------------------------------------- internals
    def _run(self, inputs: SearchInputs):
        """``(beams, choices, alive)`` from the first loop that applies (see ``LOOPS``)."""
        frames, beams, lookups = inputs.frames, inputs.beams, inputs.lookups
        device = frames.values.device
        native = self._native(device)
        out = native.run_loop(self.step, frames, beams, lookups, self.track_beams) if native else None
        if out is not None:
            self.last_loop = "native"
            return out
        if self.use_cuda_graphs and device.type == "cuda":
            graphs = self._graphed_loop(inputs)
            if graphs.ok:
                self.last_loop = "cuda_graph"
                return graphs.run(frames, beams, lookups)
        self.last_loop = "eager"
        return eager_loop(self.step, frames, beams, lookups, self.track_beams)

    def _native(self, device):
        """:mod:`.loop_native` when this search runs natively on ``device`` (a CPU,
        ``native=True``), else None; each of its calls may still return None for a
        configuration it does not cover."""
        if not self.native or torch.device(device).type != "cpu":
            return None
        return loop_native

    def _graphed_loop(self, inputs: SearchInputs) -> GraphedFrameLoop:
        frames, fusion, lookups = inputs.frames, inputs.fusion, inputs.lookups
        key = (tuple(frames.values.shape), str(frames.values.device))
        graphs = self._graphs.get(key)
        if graphs is None or not graphs.matches(frames, fusion, lookups, self.step):
            graphs = self._graphs[key] = GraphedFrameLoop(self.step, frames, fusion, lookups, inputs.beams,
                                                          self.track_beams)
        return graphs

