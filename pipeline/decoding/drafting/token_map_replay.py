"""The ceiling of token-map drafting on a set, from greedy AR's own tokens ("Model-free
Speculative Decoding for Transformer-based ASR with Token Map Drafting", Algorithm 1's
lookup and §III-A's verification, replayed without the model).

Verification is greedy, so what a drafting pass accepts is fixed by the tokens plain
greedy AR produces: the longest candidate prefix equal to them, then the decoder's next
token. Replaying the lookup over those tokens gives, exactly, the passes a batch of
drafted decoding makes (:func:`replay_drafting` mirrors ``greedy_decode`` with
``map_drafting`` and no policy: the prefill pass decides each row's first token, a row
leaves the batch once it decides end-of-text or reaches the token limit, and a pass where
no alive row has a candidate is a plain step). Against plain AR's passes this is the
speedup drafting would reach if a pass over candidate trees cost no more than a one-token
step: an upper bound on the decoder-time speedup for that map, K and draft length,
whatever the hardware. ``oracle`` gives the bound of a map that always proposes the right
continuation.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReplayCounts:
    """Passes and drafting counts over a set (the counters ``greedy_decode`` keeps)."""
    ar_passes: int = 0          # batch passes of plain greedy AR, prefill included
    passes: int = 0             # batch passes with drafting, prefill included
    ar_row_passes: int = 0      # the same counted per alive row
    row_passes: int = 0
    tm_passes: int = 0          # passes that fed at least one candidate tree
    tm_plain_passes: int = 0    # passes after the prefill with no candidate in any row
    tm_rounds: int = 0          # row-passes with a candidate
    tm_drafted: int = 0         # draft tokens fed (trie nodes below the roots)
    tm_accepted: int = 0        # draft tokens accepted

    @property
    def pass_ratio(self) -> float:
        """AR batch passes over drafted batch passes: the free-width speedup bound."""
        return self.ar_passes / self.passes if self.passes else 1.0

    @property
    def row_pass_ratio(self) -> float:
        """The same with a pass costing in proportion to its alive rows."""
        return self.ar_row_passes / self.row_passes if self.row_passes else 1.0


def _sequence(tokens: list[int], limit: int, eot: int) -> list[int]:
    """What the decoder decides for a row: its tokens, then end-of-text unless the limit
    ended it."""
    return list(tokens) + ([eot] if len(tokens) < limit else [])


def _trie_nodes(cands: list[list[int]]) -> int:
    return len({tuple(c[:i]) for c in cands for i in range(1, len(c) + 1)})


def _accepted(cands: list[list[int]], rest: list[int], eot: int) -> int:
    """Tokens of ``rest`` the tree walk accepts: the longest candidate prefix equal to it,
    end-of-text never accepted (the walk ends there and decides it)."""
    best = 0
    for cand in cands:
        n = 0
        while n < len(cand) and n < len(rest) and cand[n] == rest[n] and rest[n] != eot:
            n += 1
        best = max(best, n)
    return best


def replay_drafting(tokens: list[list[int]], propose, batch: int, limit: int, eot: int,
                    prefixes: list[list[int]] | None = None) -> ReplayCounts:
    """Replay drafting over plain greedy AR's ``tokens`` (per row, end-of-text excluded, as
    ``greedy_decode`` returns them), in batches of ``batch`` rows in order.
    ``propose(row, history, room)`` gives the candidates of row ``row`` (its index in
    ``tokens``) after ``history`` (prefix and decided tokens) with ``room`` tokens left
    (the map's: ``lambda _, h, room: md.propose(h, room, eot, None)``); ``limit``: the
    decoder's token limit per row."""
    counts = ReplayCounts()
    prefixes = prefixes or [[] for _ in tokens]
    for start in range(0, len(tokens), batch):
        seqs = [_sequence(t, limit, eot) for t in tokens[start:start + batch]]
        pres = prefixes[start:start + batch]
        counts.ar_passes += max(len(s) for s in seqs)
        counts.ar_row_passes += sum(len(s) for s in seqs)
        done = [1] * len(seqs)                       # tokens decided; the prefill decides one
        alive = [r for r, s in enumerate(seqs) if s[0] != eot and len(s) > 1]
        counts.passes += 1
        counts.row_passes += len(seqs)
        while alive:
            cands = {}
            for r in alive:
                room = limit - done[r] - 1
                cands[r] = propose(start + r, pres[r] + seqs[r][:done[r]], room) if room > 0 else []
            counts.passes += 1
            counts.row_passes += len(alive)
            if any(cands.values()):
                counts.tm_passes += 1
            else:
                counts.tm_plain_passes += 1
            for r in alive:
                if cands[r]:
                    counts.tm_rounds += 1
                    counts.tm_drafted += _trie_nodes(cands[r])
                a = _accepted(cands[r], seqs[r][done[r]:], eot)
                counts.tm_accepted += a
                done[r] += a + 1
            alive = [r for r in alive if done[r] < len(seqs[r])]
    return counts


def oracle(tokens: list[list[int]], max_draft: int, batch: int, limit: int, eot: int) -> ReplayCounts:
    """The bound of a map that always proposes the next ``max_draft`` tokens right."""
    seqs = [_sequence(t, limit, eot) for t in tokens]

    def propose_right(row: int, history: list[int], room: int) -> list[list[int]]:
        rest = seqs[row][len(history):len(history) + min(max_draft, room)]
        return [rest] if rest else []

    return replay_drafting(tokens, propose_right, batch, limit, eot)
