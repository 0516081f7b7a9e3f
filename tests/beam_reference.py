"""Independent references for the beam-search tests: a dense bigram fusion model and a
brute-force search over every CTC alignment (tiny inputs only), and CTC-like peaky
test posteriors."""
from __future__ import annotations

import itertools
import math

import torch


class BigramTable:
    """A fusion model (pipeline.decoding.ctc_beam.FusionModel) from a dense table.

    States: 0..V-1 = last LM token, V = sentence start. ``table`` [V+1, V] natural-log
    scores, ``eos`` [V+1]. ``with_labels`` adds the optional ``advance_labels`` lookup.
    """

    def __init__(self, table: torch.Tensor, eos: torch.Tensor, with_labels: bool = True):
        self.table, self.eos = table.float(), eos.float()
        self.vocab_size = table.shape[1]
        if with_labels:
            self.advance_labels = self._advance_labels

    @classmethod
    def random(cls, vocab_size: int, seed: int, with_labels: bool = True) -> "BigramTable":
        g = torch.Generator().manual_seed(seed)
        table = torch.randn(vocab_size + 1, vocab_size + 1, generator=g).log_softmax(-1)
        return cls(table[:, :vocab_size], table[:, vocab_size], with_labels)

    def init_states(self, batch_size: int, bos: bool = True) -> torch.Tensor:
        return torch.full((batch_size,), self.vocab_size if bos else 0, dtype=torch.int64)

    def advance(self, states):
        n = states.numel()
        return self.table[states], torch.arange(self.vocab_size).expand(n, -1).clone()

    def _advance_labels(self, states, labels):
        return self.table[states, labels], labels.clone()

    def final(self, states):
        return self.eos[states]

    def sentence(self, lm_tokens: list[int]) -> float:
        """Total log score of a token sequence including end of sentence."""
        state, total = self.vocab_size, 0.0
        for tok in lm_tokens:
            total += float(self.table[state, tok])
            state = tok
        return total + float(self.eos[state])


def collapse(path, blank: int = 0) -> tuple[int, ...]:
    out, prev = [], None
    for x in path:
        if x != blank and x != prev:
            out.append(x)
        prev = x
    return tuple(out)


def brute_force(log_probs: torch.Tensor, beta: float = 0.0, fusion=(), merge: str = "max",
                blank: int = 0) -> list[tuple[tuple[int, ...], float]]:
    """Every transcript with its eq. 1 score: acoustic part merged over all alignments by
    max or logsumexp, plus beta * N and alpha * (fusion model sentence score incl. end),
    best first. ``fusion``: [(model with .sentence(), alpha)]; LM token = id - 1 (blank 0)."""
    lp = log_probs.double()
    t, v1 = lp.shape
    acoustic: dict[tuple[int, ...], list[float]] = {}
    for path in itertools.product(range(v1), repeat=t):
        score = float(sum(lp[i, c] for i, c in enumerate(path)))
        acoustic.setdefault(collapse(path, blank), []).append(score)
    out = []
    for prefix, scores in acoustic.items():
        if merge == "max":
            am = max(scores)
        else:
            top = max(scores)
            am = top + math.log(sum(math.exp(s - top) for s in scores))
        lm_tokens = [c - 1 if blank == 0 else (c if c < blank else c - 1) for c in prefix]
        total = am + beta * len(prefix) + sum(a * m.sentence(lm_tokens) for m, a in fusion)
        out.append((prefix, total))
    return sorted(out, key=lambda x: -x[1])


def peaky_log_probs(b, t, v1, seed):
    """CTC-like posteriors: mostly confident blanks, confident tokens held for 1-3 frames,
    and some ambiguous frames, so runs of single-survivor frames of both kinds occur."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, v1, generator=g)
    labels = torch.zeros(b, t, dtype=torch.int64)
    for i in range(b):
        pos = 0
        while pos < t:
            if torch.rand(1, generator=g) < 0.4:
                tok, span = int(torch.randint(1, v1, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
            else:
                tok, span = 0, int(torch.randint(1, 6, (1,), generator=g))
            labels[i, pos:pos + span] = tok
            pos += span
    sharp = torch.where(torch.rand(b, t, generator=g) < 0.25, 1.5, 9.0)
    logits.scatter_add_(2, labels[..., None], sharp[..., None])
    return logits.log_softmax(-1)


def fusion_kwargs(fusion: str, v1: int, seed: int, dense_lm: bool = False) -> dict:
    """CTCBeamSearch arguments for the fusion settings the batched tests sweep: "lm" (a
    random bigram table, alpha 0.6; ``dense_lm`` gives it a state count so the search
    folds it into a dense table, as it does NGPU-LMs) and "lm+boost" (plus a three-phrase
    boosting tree, alpha 0.8); anything else: no fusion model."""
    kw = {}
    if fusion.startswith("lm"):
        lm = BigramTable.random(v1 - 1, seed)
        if dense_lm:
            lm.num_states = v1
        kw.update(lm=lm, alpha_lm=0.6)
    if fusion == "lm+boost":
        from shardscribe.pipeline.lm.boosting import BoostingTree

        kw.update(boost=BoostingTree.from_phrases([[[0, 1], [2, 3, 4], [5]]], vocab_size=v1 - 1,
                                                  context_score=1.5), alpha_boost=0.8)
    return kw
