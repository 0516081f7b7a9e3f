"""The token map of "Model-free Speculative Decoding for Transformer-based ASR with Token
Map Drafting" (§III-B, Algorithm 1): n-gram keys of 1..N decoder tokens, each mapped to
ranked continuations that followed it in domain text, and the drafting lookup.

Construction (``build_token_map``, Algorithm 1 with the ranking and pruning of §III-B):
every sentence is tokenised with the decoder's own tokenizer and closed with ``END`` (the
end of the transcript, so a draft can propose end-of-text too). Every n-gram (n = 1..N)
is a key; the up to ``max_len`` tokens that follow each of its occurrences go into a
count trie under it. A key seen fewer than ``min_count`` times is dropped, and so is
every trie node seen fewer than ``min_count`` times, or in less than ``min_share`` of the
key's occurrences (a token the key is rarely followed by is rarely accepted, and every
draft token widens the verification pass). Candidates are then ranked by length
and frequency together: the first is the root-to-leaf path whose node counts sum highest
(a path's sum is how many of its tokens the text would have accepted, so a long path of
frequent tokens beats a short path and a rare long one); each next one is the path with
the highest sum over the nodes not covered yet (the paper merges near candidates; here a
candidate that mostly repeats a better one gains little and is ranked down). ``keep``
candidates per key are stored.

Storage: safetensors arrays (no pickle), loaded into a dict in milliseconds.

Lookup (``candidates``): a row's last n decided tokens for n = N down to 1, longest key
first, give up to K distinct candidates, each cut to ``max_draft`` tokens and at ``END``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

END = -1                # end of the transcript inside stored candidates (the decoder's eot at lookup)
DEFAULT_ORDER = 3       # the paper's best N (its Fig. 4)
DEFAULT_MAX_LEN = 16
DEFAULT_MIN_COUNT = 2
DEFAULT_KEEP = 4
DEFAULT_MIN_SHARE = 0.5       # docs/token_map.md: fewer wasted draft tokens on the domain set


@dataclass
class TokenMap:
    order: int
    table: dict[tuple[int, ...], list[tuple[int, ...]]]  # key -> candidates, best first
    meta: dict = field(default_factory=dict)

    def candidates(self, history: list[int], k: int, max_draft: int, eot: int) -> list[list[int]]:
        """Up to ``k`` distinct continuations of ``history`` (longest matching key first),
        each at most ``max_draft`` tokens, ``END`` read as ``eot`` and nothing after it."""
        return lookup(lambda key: self.table.get(key, ()), self.order, history, k, max_draft, eot)

    @property
    def max_token(self) -> int:
        return max((t for c in self.table.values() for cand in c for t in cand), default=-1)

    def save(self, path: str | Path) -> None:
        import numpy as np
        from safetensors.numpy import save_file

        keys = list(self.table)
        key_tokens = np.full((len(keys), self.order), END, dtype=np.int32)
        key_len = np.zeros(len(keys), dtype=np.int32)
        cand_per_key = np.zeros(len(keys), dtype=np.int32)
        cand_len, flat = [], []
        for i, key in enumerate(keys):
            key_tokens[i, :len(key)] = key
            key_len[i] = len(key)
            cand_per_key[i] = len(self.table[key])
            for cand in self.table[key]:
                cand_len.append(len(cand))
                flat += cand
        arrays = {"key_tokens": key_tokens, "key_len": key_len, "cand_per_key": cand_per_key,
                  "cand_len": np.asarray(cand_len, dtype=np.int32), "tokens": np.asarray(flat, dtype=np.int32)}
        meta = {"order": str(self.order), "meta": json.dumps(self.meta)}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(arrays, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> "TokenMap":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if "order" not in meta:
                raise ValueError(f"{path}: not a token map (no 'order' in its metadata)")
            a = {name: f.get_tensor(name) for name in ("key_tokens", "key_len", "cand_per_key", "cand_len", "tokens")}
        keys = a["key_tokens"].tolist()
        lens, per_key = a["key_len"].tolist(), a["cand_per_key"].tolist()
        cand_len, tokens = a["cand_len"].tolist(), a["tokens"].tolist()
        table, c, t = {}, 0, 0
        for key, n, m in zip(keys, lens, per_key):
            cands = []
            for ln in cand_len[c:c + m]:
                cands.append(tuple(tokens[t:t + ln]))
                t += ln
            c += m
            table[tuple(key[:n])] = cands
        return cls(order=int(meta["order"]), table=table, meta=json.loads(meta.get("meta", "{}")))


def lookup(ranked: Callable[[tuple[int, ...]], Sequence[tuple[int, ...]]], order: int, history: list[int],
           k: int, max_draft: int, eot: int) -> list[list[int]]:
    """The drafting lookup over any map: ``ranked(key)`` gives a key's candidates, best
    first (see :meth:`TokenMap.candidates`)."""
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    if k <= 0 or max_draft <= 0:
        return out
    for n in range(min(order, len(history)), 0, -1):
        for cand in ranked(tuple(history[-n:])):
            cut = cand[:max_draft]
            if END in cut:
                cut = cut[:cut.index(END) + 1]
            if cut in seen:
                continue
            seen.add(cut)
            out.append([eot if t == END else t for t in cut])
            if len(out) == k:
                return out
    return out


# ---------------------------------------------------------------- Algorithm 1 + pruning
def trie_insert(root: dict, seq: list[int]) -> int:
    """Count ``seq`` into a count trie; returns the nodes it created."""
    node, created = root, 0
    for tok in seq:
        child = node.get(tok)
        if child is None:
            child = node[tok] = [0, {}]
            created += 1
        child[0] += 1
        node = child[1]
    return created


def pruned(node: dict, min_count: float) -> dict:
    """A count trie without its nodes counted below ``min_count`` (nor their subtrees)."""
    return {tok: [cnt, pruned(kids, min_count)] for tok, (cnt, kids) in node.items() if cnt >= min_count}


def _best_path(node: dict, covered: set, prefix: tuple = ()) -> tuple[int, tuple]:
    """(gain, path) of the root-to-leaf path with the highest sum of uncovered node counts."""
    best_gain, best = 0, ()
    for tok, (cnt, kids) in node.items():
        here = prefix + (tok,)
        gain, path = _best_path(kids, covered, here)
        gain += 0 if here in covered else cnt
        if gain > best_gain or (gain == best_gain and len(path) + 1 > len(best)):
            best_gain, best = gain, (tok,) + path
    return best_gain, best


def rank_candidates(trie: dict, keep: int) -> list[tuple[int, ...]]:
    """Up to ``keep`` root-to-leaf paths of a count trie, each the best by its uncovered
    count sum (see the module docstring)."""
    covered: set[tuple[int, ...]] = set()
    out = []
    for _ in range(keep):
        gain, path = _best_path(trie, covered)
        if gain <= 0 or not path:
            break
        out.append(path)
        covered.update(path[:i] for i in range(1, len(path) + 1))
    return out


def build_token_map(sentences: Iterable[list[int]], order: int = DEFAULT_ORDER, max_len: int = DEFAULT_MAX_LEN,
                    min_count: int = DEFAULT_MIN_COUNT, keep: int = DEFAULT_KEEP,
                    min_share: float = DEFAULT_MIN_SHARE, meta: dict | None = None) -> TokenMap:
    """Algorithm 1 over tokenised sentences, then ranking and pruning (module docstring)."""
    if order < 1 or max_len < 1 or min_count < 1 or keep < 1:
        raise ValueError("order, max_len, min_count and keep must all be >= 1")
    if not 0.0 <= min_share <= 1.0:
        raise ValueError("min_share must be in [0, 1]")
    tries: dict[tuple[int, ...], list] = {}
    for tokens in sentences:
        seq = list(tokens) + [END]
        for i in range(1, len(seq)):
            follow = seq[i:i + max_len]
            for n in range(1, min(order, i) + 1):
                entry = tries.setdefault(tuple(seq[i - n:i]), [0, {}])
                entry[0] += 1
                trie_insert(entry[1], follow)
    table = {}
    for key, (count, trie) in tries.items():
        if count < min_count:
            continue
        cands = rank_candidates(pruned(trie, max(min_count, min_share * count)), keep)
        if cands:
            table[key] = cands
    info = {"max_len": max_len, "min_count": min_count, "keep": keep, "min_share": min_share, **(meta or {})}
    return TokenMap(order=order, table=table, meta=info)
