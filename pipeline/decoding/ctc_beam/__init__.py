"""Batched CTC beam search: "FlexCTC: GPU-powered CTC Beam Decoding with advanced
Contextual Abilities" (Algorithm 1, eq. 1) with "FLToP CTC: Frame-Level Token Pruning via
Relative Threshold for Efficient and Memory-Saving Decoding on Diverse Platforms"
(Algorithm 1).

Modules, each importing only those before it: ``state`` (beams, frames, trie, results),
``fusion`` (NGPU-LM / boosting / insertion-bonus lookups), ``frames`` (blank handling,
FLToP, run folding), ``step`` (the per-frame torch step), the loops ``loop_eager``,
``loop_graphs`` (CUDA graphs) and ``loop_native`` (C, beside it as ``loop_native.c``),
and ``search`` (:class:`CTCBeamSearch`, which picks a loop).
"""
from .fusion import FusionModel
from .search import LOOPS, CTCBeamSearch, SearchInputs
from .state import BeamSearchResult

__all__ = ["CTCBeamSearch", "BeamSearchResult", "FusionModel", "LOOPS", "SearchInputs"]
