"""The token map of "Model-free Speculative Decoding for Transformer-based ASR with Token
Map Drafting" (§III-B, Algorithm 1) built online, from the transcripts a job commits, and
the replay of its drafting over a job's own text.

The paper builds its map offline from domain text. Every job already produces the text a
map needs: the decoder's own transcripts of the corpus it works on. ``OnlineTokenMap``
runs Algorithm 1 incrementally over them: each committed token sequence (closed with
``END``) adds, for every n-gram key of 1..N tokens, the up-to-``max_len`` tokens that
follow it to the key's count trie, and the key's ranked candidates are recomputed on its
next lookup, ranked and pruned as ``build_token_map`` ranks and prunes
(pipeline.decoding.drafting.token_map). Unlike the offline map, a follower seen once is kept (no
``min_count`` of 2): a phrase the corpus said once drafts the next time it comes, and the
drafting policy (pipeline.decoding.drafting.token_map_policy) switches drafting off where that does
not pay. A map given as well (``decoder.token_map``) is consulted after the learned
candidates of each key.

Memory is bounded: at most ``max_keys`` keys, the least recently seen dropped first, and
at most ``NODES_PER_KEY`` trie nodes per key (past it the key's counts are halved and the
nodes that reach zero dropped, so its rarest followers are forgotten first).

Drafting stays exact whatever the map holds: drafts are verified greedily
(pipeline.decoding.drafting.drafters.TokenMapDrafter). ``replay_online`` replays the drafting of a
map that grows batch by batch over greedy AR's own tokens
(pipeline.decoding.drafting.token_map_replay): its passes, drafts and acceptance, exactly
as a decoder with no policy would make them, hence the bound of that map on that text.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from .token_map import (DEFAULT_KEEP, DEFAULT_MIN_SHARE, DEFAULT_ORDER, END, TokenMap, lookup,
                        pruned, rank_candidates, trie_insert)

DEFAULT_MAX_KEYS = 20_000   # about 50 MB of Python objects at the cap (docs/token_map.md)
NODES_PER_KEY = 64          # trie nodes one key may hold before its counts are halved


class OnlineTokenMap:
    """A token map that grows from committed transcripts (see the module docstring); the
    lookup interface of ``TokenMap`` (``order``, ``candidates``) plus :meth:`learn`."""

    def __init__(self, max_len: int, order: int | None = None, max_keys: int = DEFAULT_MAX_KEYS,
                 keep: int = DEFAULT_KEEP, min_share: float = DEFAULT_MIN_SHARE, base: TokenMap | None = None):
        if max_len < 1 or max_keys < 1 or keep < 1:
            raise ValueError("max_len, max_keys and keep must all be >= 1")
        self.order = order or (base.order if base is not None else DEFAULT_ORDER)
        self.max_len, self.max_keys, self.keep, self.min_share = max_len, max_keys, keep, min_share
        self.base = base
        # key -> [occurrences, count trie of followers, trie nodes], least recently seen first
        self._tries: OrderedDict[tuple[int, ...], list] = OrderedDict()
        # key -> its ranked candidates, until the key is seen again (ranked at lookup, so a
        # batch's learning costs only the trie inserts)
        self._ranked: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self.rows = 0           # committed sequences learned
        self.tokens = 0         # and their tokens
        self.dropped = 0        # keys dropped at the max_keys cap

    def learn(self, sequences: Iterable[list[int]]) -> None:
        """Algorithm 1 over committed token sequences (end-of-text excluded)."""
        tries, ranked = self._tries, self._ranked
        for tokens in sequences:
            if not tokens:
                continue
            self.rows += 1
            self.tokens += len(tokens)
            seq = list(tokens) + [END]
            for i in range(1, len(seq)):
                follow = seq[i:i + self.max_len]
                for n in range(1, min(self.order, i) + 1):
                    key = tuple(seq[i - n:i])
                    entry = tries.get(key)
                    if entry is None:
                        entry = tries[key] = [0, {}, 0]
                    else:
                        tries.move_to_end(key)
                    entry[0] += 1
                    entry[2] += trie_insert(entry[1], follow)
                    if entry[2] > NODES_PER_KEY:
                        _forget_rarest(entry)
                    ranked.pop(key, None)
        while len(tries) > self.max_keys:
            key, _ = tries.popitem(last=False)
            ranked.pop(key, None)
            self.dropped += 1

    def ranked(self, key: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The key's candidates, best first: the learned ones, then the given map's."""
        cands = self._ranked.get(key)
        if cands is None:
            entry = self._tries.get(key)
            cands = []
            if entry is not None:
                cands = self._ranked[key] = rank_candidates(
                    pruned(entry[1], max(1.0, self.min_share * entry[0])), self.keep)
        if self.base is not None:
            return cands + list(self.base.table.get(key, ()))
        return cands

    def candidates(self, history: list[int], k: int, max_draft: int, eot: int) -> list[list[int]]:
        return lookup(self.ranked, self.order, history, k, max_draft, eot)

    @property
    def keys(self) -> int:
        return len(self._tries)

    @property
    def nodes(self) -> int:
        return sum(entry[2] for entry in self._tries.values())

    def stats(self) -> dict:
        """Its size: sequences and tokens learned, keys and trie nodes held, keys dropped."""
        return {"rows_learned": self.rows, "tokens_learned": self.tokens, "keys": self.keys, "nodes": self.nodes,
                "keys_dropped": self.dropped}


def _forget_rarest(entry: list) -> None:
    """Halve a key's counts until its trie fits ``NODES_PER_KEY``; nodes at zero go (a
    child never counts more than its parent, so what is left is still a trie)."""
    while entry[2] > NODES_PER_KEY:
        entry[0] //= 2
        entry[1], entry[2] = _halved(entry[1])


def _halved(node: dict) -> tuple[dict, int]:
    out, nodes = {}, 0
    for tok, (cnt, kids) in node.items():
        if cnt // 2:
            sub, n = _halved(kids)
            out[tok] = [cnt // 2, sub]
            nodes += 1 + n
    return out, nodes


def replay_online(tokens: list[list[int]], drafter, batch: int, limit: int, eot: int):
    """Drafting replayed over greedy AR's ``tokens`` (per row, in decoding order) in batches
    of ``batch`` rows, with ``drafter`` (a ``TokenMapDrafter`` over an ``OnlineTokenMap``)
    learning each batch once it is decided, as the decoders do; returns the replay's
    ``ReplayCounts`` (pipeline.decoding.drafting.token_map_replay). The map ends holding
    every row."""
    from .token_map_replay import replay_drafting

    learned = 0

    def propose(row: int, history: list[int], room: int) -> list[list[int]]:
        nonlocal learned
        start = row - row % batch
        if start > learned:
            drafter.learn(tokens[learned:start])
            learned = start
        return drafter.propose(history, room, eot, None)

    counts = replay_drafting(tokens, propose, batch, limit, eot)
    drafter.learn(tokens[learned:])
    return counts
