"""Search state and results of the batched CTC beam search of "FlexCTC: GPU-powered CTC
Beam Decoding with advanced Contextual Abilities" (§III-A, the BatchedBeamHyps structure),
stored as the trie of "Pushing the Limits of Beam Search Decoding for Transducer-based ASR
models" (§2.1) with that paper's rolling hash (eq. 1).

A hypothesis is a CTC prefix plus the label of its last frame (blank or its last token),
kept in [B, beam] tensors (:class:`Beams`). Per frame the search stores one chosen
candidate per hypothesis (parent x W + column, [S, B, beam]), so a prefix is never copied;
labels, back-pointers, transcripts and emission frames are read back once at the end
(:func:`trie_alignments`). The rolling hash ``h' = (h * P + token) mod M`` and the length
change only on new tokens; both live in one int64 prefix key (length x M + hash).

Internal label ids put blank in column 0 and shift the tokens before it up by one (the
frames are permuted that way once, so every later step can test ``label == 0``);
:func:`model_ids` undoes it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

HASH_BASE = 1_000_003
HASH_MOD = 2_147_483_647  # 2^31 - 1: hash * HASH_BASE + token stays far below 2^63
# a candidate's recombination key is (length x HASH_MOD + hash) x (V+1) + label: exact in
# int64 for prefixes under 2^32 / (V+1) tokens (44 million at V = 96)
NEG_INF = float("-inf")


@dataclass
class Beams:
    """Search state of every hypothesis, [B, beam] each."""

    scores: torch.Tensor      # float32, -inf = dead slot
    last: torch.Tensor        # int64 label of the last frame (internal ids, 0 = blank)
    key: torch.Tensor         # int64 prefix identity: length * HASH_MOD + rolling hash
    fusion: list[torch.Tensor]  # int64 states, one per fusion lookup (lookup-specific form)

    @classmethod
    def initial(cls, batch: int, beam: int, device, fusion_states: list[torch.Tensor]) -> "Beams":
        """Only the first hypothesis of each utterance is alive (FlexCTC Algorithm 1's
        initialisation): an empty prefix, last label blank."""
        scores = torch.full((batch, beam), NEG_INF, device=device)
        scores[:, 0] = 0.0
        zeros = torch.zeros((batch, beam), dtype=torch.int64, device=device)
        return cls(scores, zeros.clone(), zeros.clone(), fusion_states)

    def clone(self) -> "Beams":
        return Beams(self.scores.clone(), self.last.clone(), self.key.clone(), [s.clone() for s in self.fusion])


@dataclass
class Frames:
    """The search's input, frame-major. ``values`` [S, B, W]: frame log-probs (blank in
    column 0), or with FLToP each frame's N surviving scores, whose ids are ``tokens``
    [S, B, N] (None: column = token id); ``lm_tokens``: LM ids of those columns, V for
    blank (the fusion lookups' identity column); ``thresholds`` [S, B]: theta (inf = no
    pruning); ``weights`` [S, B]: original frames each step stands for (0 = padding).
    ``steps`` frames are searched; ``frame_map`` [B, T] maps every original frame to its
    step (None: the identity), ``steps`` for padded frames."""

    values: torch.Tensor
    tokens: torch.Tensor | None
    lm_tokens: torch.Tensor
    thresholds: torch.Tensor
    weights: torch.Tensor
    steps: int
    frame_map: torch.Tensor | None
    num_frames: int


@dataclass
class BeamSearchResult:
    """Per utterance b: ``tokens[b]`` (CTC ids, collapsed, no blanks) of the best
    hypothesis, ``scores[b]`` its eq. 1 score, ``token_frames[b]`` the frame at which each
    token was emitted; the n-best lists are sorted best first (missing entries have score
    -inf and no tokens). ``alignments`` [B, n, T] are the frame labels of each n-best
    hypothesis's surviving alignment. ``avg_beams`` [B]: mean number of live hypotheses
    per valid frame (when ``track_beams``)."""

    tokens: list[list[int]]
    scores: torch.Tensor
    token_frames: list[list[int]]
    nbest_tokens: list[list[list[int]]]
    nbest_scores: torch.Tensor
    nbest_frames: list[list[list[int]]]
    alignments: torch.Tensor
    avg_beams: torch.Tensor | None = None

    @classmethod
    def from_emissions(cls, nbest_scores: torch.Tensor, alignments: torch.Tensor, counts: list[int],
                       flat_tokens: list[int], flat_frames: list[int],
                       avg_beams: torch.Tensor | None) -> "BeamSearchResult":
        """Split the emitted tokens and frames (flat, in (utterance, n-best) order, with
        ``counts`` per hypothesis) into per-utterance n-best lists."""
        b, n = nbest_scores.shape
        nbest_tokens, nbest_frames, at = [], [], 0
        for i in range(b):
            toks_b, frames_b = [], []
            for c in counts[i * n:(i + 1) * n]:
                toks_b.append(flat_tokens[at:at + c])
                frames_b.append(flat_frames[at:at + c])
                at += c
            nbest_tokens.append(toks_b)
            nbest_frames.append(frames_b)
        return cls(tokens=[x[0] for x in nbest_tokens], scores=nbest_scores[:, 0],
                   token_frames=[x[0] for x in nbest_frames], nbest_tokens=nbest_tokens,
                   nbest_scores=nbest_scores, nbest_frames=nbest_frames, alignments=alignments,
                   avg_beams=avg_beams)


def model_ids(internal: torch.Tensor, blank: int) -> torch.Tensor:
    """Undo the blank-to-column-0 permutation of the frames: internal ids to model ids."""
    if blank == 0:
        return internal
    shifted = torch.where(internal <= blank, internal - 1, internal)
    return torch.where(internal == 0, torch.full_like(internal, blank), shifted)


def backtrack(labels: torch.Tensor, parents: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Follow the trie's back-pointers from the final ``slots`` [B, n]: labels [B, n, S]."""
    t = labels.shape[0]
    out = torch.empty((t,) + slots.shape, dtype=torch.int64, device=slots.device)
    cur = slots
    for i in range(t - 1, -1, -1):
        out[i] = labels[i].gather(1, cur)
        cur = parents[i].gather(1, cur)
    return out.permute(1, 2, 0)


def trie_alignments(choices: torch.Tensor, tokens: torch.Tensor | None, slots: torch.Tensor, width: int,
                    frame_map: torch.Tensor | None, num_frames: int, blank: int, finite: torch.Tensor):
    """Back-track the stored choices [S, B, K] from ``slots`` [B, n] and read the emitted
    tokens of the hypotheses where ``finite`` [B, n]: ``(align [B, n, T] in model ids,
    counts, tokens, frames)``, the last three flat in (utterance, n-best) order."""
    b, n = slots.shape
    s = choices.shape[0]
    parents = torch.div(choices, width, rounding_mode="floor")
    labels = choices - parents * width
    if tokens is not None:
        labels = tokens[:s].gather(2, labels)
    align = backtrack(labels, parents, slots)                        # [B, n, S]
    if frame_map is not None:  # steps back to frames; padding maps to a blank
        align = torch.nn.functional.pad(align, (0, 1), value=0)
        align = align.gather(2, frame_map.unsqueeze(1).expand(b, n, num_frames))
    align = model_ids(align, blank)
    prev = torch.nn.functional.pad(align[..., :-1], (1, 0), value=blank)
    emit = (align != blank) & (align != prev) & finite[:, :, None]
    counts = emit.sum(-1).view(-1).tolist()
    flat_frames = emit.nonzero()[:, 2].tolist()
    flat_tokens = align[emit].tolist()
    return align, counts, flat_tokens, flat_frames
