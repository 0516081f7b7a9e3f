"""Candidate trees for speculative decoding with several drafts per row ("Model-free
Speculative Decoding for Transformer-based ASR with Token Map Drafting", §III-A, Fig. 2:
candidate sequences verified by the main model, the longest matching one kept, plus the
model's correction token).

A row's K candidates usually share their first tokens, so they are merged into a trie and
fed once, after the row's newest decided token (the root), in ONE decoder pass for the
whole batch ("tree attention"): each node attends to the cached past and to its own
ancestors, at the position its depth gives it. Verification walks each row's trie along
the decoder's argmax from the root: a child whose token is the argmax is accepted, the
first argmax with no such child (or end-of-text) is the row's next decided token. So the
output is exactly what plain greedy decoding gives, whatever the candidates. Logits are
computed only along the walked paths, one level per call: the output projection
(vocabulary x width) is the largest matmul of a small decoder, and most nodes are never
on the path (where the adapter has a screened argmax, not even there:
pipeline.models.screened_argmax).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...models.screened_argmax import greedy_tokens

if TYPE_CHECKING:
    from ...models.base import ARDecoderModel


@dataclass
class DraftTrees:
    tokens: list[list[int]]        # per row: node tokens (node 0 is the root, the decided token)
    parents: list[list[int]]       # per row: parent node of each node (-1 for the root)
    depths: list[list[int]]
    children: list[list[dict]]     # per row, per node: token -> child node

    @property
    def width(self) -> int:
        return max(len(t) for t in self.tokens)

    @property
    def drafted(self) -> int:
        """Draft tokens fed (the roots are decided tokens, not drafts)."""
        return sum(len(t) - 1 for t in self.tokens)


def build_trees(roots: list[int], candidates: list[list[list[int]]]) -> DraftTrees:
    """One trie per row: ``roots[n]`` then ``candidates[n]`` merged on shared prefixes."""
    tokens, parents, depths, children = [], [], [], []
    for root, cands in zip(roots, candidates):
        tok, par, dep, kids = [root], [-1], [0], [{}]
        for cand in cands:
            node = 0
            for t in cand:
                nxt = kids[node].get(t)
                if nxt is None:
                    nxt = len(tok)
                    tok.append(t)
                    par.append(node)
                    dep.append(dep[node] + 1)
                    kids.append({})
                    kids[node][t] = nxt
                node = nxt
        tokens.append(tok)
        parents.append(par)
        depths.append(dep)
        children.append(kids)
    return DraftTrees(tokens, parents, depths, children)


def tree_inputs(trees: DraftTrees, past_mask: torch.Tensor, pos: torch.Tensor, pad_id: int, dtype: torch.dtype):
    """(input ids [A, W], additive 4D attention mask [A, 1, W, P + W], positions [A, W], node
    mask [A, W]) of one tree pass; ``past_mask`` [A, P] is the cache's 0/1 mask and ``pos``
    [A, 1] each root's position. Padding slots attend only to themselves (no empty softmax)."""
    A, W = len(trees.tokens), trees.width
    device = past_mask.device
    ids = torch.full((A, W), pad_id, dtype=torch.long)
    depth = torch.zeros((A, W), dtype=torch.long)
    allowed = torch.eye(W, dtype=torch.bool).repeat(A, 1, 1)
    real = torch.zeros((A, W), dtype=torch.long)
    for n, (tok, par, dep) in enumerate(zip(trees.tokens, trees.parents, trees.depths)):
        m = len(tok)
        ids[n, :m] = torch.tensor(tok)
        depth[n, :m] = torch.tensor(dep)
        real[n, :m] = 1
        for i in range(1, m):
            # Ancestors of i: its parent's ancestors and the parent itself.
            allowed[n, i] |= allowed[n, par[i]]
    past = past_mask.bool().unsqueeze(1).expand(A, W, past_mask.shape[1])
    # Padding slots see no past, so they stay masked for every real node and later step.
    past = past & real.bool().to(device).unsqueeze(-1)
    full = torch.cat([past, allowed.to(device)], -1).unsqueeze(1)
    mask = torch.zeros(full.shape, dtype=dtype, device=device).masked_fill_(~full, torch.finfo(dtype).min)
    return ids.to(device), mask, pos + depth.to(device), real.to(device)


def walk_trees(adapter: ARDecoderModel, hidden: torch.Tensor, trees: DraftTrees, eot: int):
    """Greedy verification: per row, the accepted draft tokens (the walked path) and the
    decoder's token after them. ``hidden`` [A, W, D] holds the tree pass's states."""
    A = hidden.shape[0]
    cur = [0] * A
    paths: list[list[int]] = [[] for _ in range(A)]
    next_tok = [0] * A
    active = list(range(A))
    while active:
        rows = torch.tensor(active, device=hidden.device)
        cols = torch.tensor([cur[n] for n in active], device=hidden.device)
        best = greedy_tokens(adapter, hidden[rows, cols]).tolist()
        still = []
        for n, t in zip(active, best):
            child = trees.children[n][cur[n]].get(t) if t != eot else None
            if child is None:
                next_tok[n] = t
            else:
                paths[n].append(t)
                cur[n] = child
                still.append(n)
        active = still
    return paths, next_tok, cur


def kept_columns(trees: DraftTrees, ends: list[int], device) -> torch.Tensor:
    """[A, W] 0/1: the root and the accepted path of each row (ending at node ``ends[n]``):
    the columns of this pass that later steps may attend to."""
    A, W = len(trees.tokens), trees.width
    keep = torch.zeros((A, W), dtype=torch.long)
    for n, node in enumerate(ends):
        while node >= 0:
            keep[n, node] = 1
            node = trees.parents[n][node]
    return keep.to(device)
