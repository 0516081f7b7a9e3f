"""Dense lookup tables for shallow-fusion models with few states (the NGPU-LM / GPU-PB fusion
of "FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities", §III-B).

A back-off n-gram LM or boosting tree answers ``advance(states)`` by walking back-off
chains: several dependent gathers per frame. When ``states x vocabulary`` is small (a
character LM: tens of thousands of states x ~100 tokens), it is cheaper to run ``advance``
once over every state and keep the result as two [S, V] tables; every later lookup is one
gather. Results are bit-identical to the wrapped model (the table *is* its output).
"""
from __future__ import annotations

import torch


def num_states(model) -> int | None:
    """The state count of a fusion model, when it tells (``num_states`` or ``graph.num_states``)."""
    n = getattr(model, "num_states", None)
    if n is None and hasattr(model, "graph"):
        n = getattr(model.graph, "num_states", None)
    return None if n is None else int(n)


class DenseFusionTable:
    """``advance``/``advance_labels``/``final`` of ``model`` precomputed for every state.

    ``init_states`` is delegated, so per-utterance start states (boosting lists bound with
    ``with_lists``) keep working. Next states are stored as int32 (half the memory)."""

    def __init__(self, model, states: int, chunk: int = 8192):
        self.model = model
        scores, nexts = [], []
        device = getattr(model, "device", "cpu")
        for start in range(0, states, chunk):
            ids = torch.arange(start, min(states, start + chunk), dtype=torch.int64, device=device)
            sc, nx = model.advance(ids)
            scores.append(sc.float())
            nexts.append(nx.to(torch.int32))
        self.scores = torch.cat(scores)
        self.next = torch.cat(nexts)
        self.final_scores = model.final(torch.arange(states, dtype=torch.int64, device=device)).float()

    @classmethod
    def maybe(cls, model, max_bytes: int):
        """The table when the model's size is known and fits in ``max_bytes``, else the model."""
        if isinstance(model, cls):
            return model
        states = num_states(model)
        vocab = getattr(model, "vocab_size", None)
        if states is None or vocab is None or states * vocab * 8 > max_bytes:
            return model
        return cls(model, states)

    def to(self, device) -> "DenseFusionTable":
        self.scores, self.next = self.scores.to(device), self.next.to(device)
        self.final_scores = self.final_scores.to(device)
        return self

    @property
    def vocab_size(self) -> int:
        return self.scores.shape[1]

    def init_states(self, batch_size: int, bos: bool = True) -> torch.Tensor:
        return self.model.init_states(batch_size, bos=bos)

    # index_select / flat index_select: several times faster than advanced indexing on CPU
    def advance(self, states: torch.Tensor):
        flat = states.reshape(-1)
        shape = tuple(states.shape) + (self.vocab_size,)
        return (self.scores.index_select(0, flat).view(shape),
                self.next.index_select(0, flat).long().view(shape))

    def advance_labels(self, states: torch.Tensor, labels: torch.Tensor):
        flat = (states * self.vocab_size + labels).reshape(-1)
        return (self.scores.view(-1).index_select(0, flat).view(states.shape),
                self.next.view(-1).index_select(0, flat).long().view(states.shape))

    def scores_only(self, states: torch.Tensor) -> torch.Tensor:
        """[..., V] scores without the next states (the decoder looks those up only for
        the tokens it keeps)."""
        return self.scores.index_select(0, states.reshape(-1)).view(tuple(states.shape) + (self.vocab_size,))

    def final(self, states: torch.Tensor) -> torch.Tensor:
        return self.final_scores.index_select(0, states.reshape(-1)).view(states.shape)
