"""Pending segments of a two-stage decoder kind, pooled across input batches so that its
second stage (SSD's AR fallback, CTC/transducer beam search) decodes full token-budget
batches ("sort by length, batch by a token budget", "Self-Speculative Decoding for
LLM-based ASR with CTC Encoder Drafts" §3.2) instead of the 1-15 pending rows of one
batch: on a GPU a decoding step costs about the same for 1 row as for 64.

The pool knows rows only by key and by the second stage's cost of each pending segment
(``SecondStage.cost``); whoever holds the rows (the in-process runner, the Ray driver)
dispatches the batches it returns. A row is dispatched whole (its pending segments in one
batch), so it is committed once, after its second stage. Batches are due when:

- ``full``: they hold a token budget's worth (the next row would not fit);
- ``end``: the input is exhausted (``final``);
- ``wait``: a row has waited ``max_wait_s`` (a slow source holds nothing back);
- ``bound``: the pool holds ``max_pending_segments`` and nothing else will drain it;
- ``start``: the pool is emptied after each of a job's slow-start batches
  (``batching.first_batch``) but the last, in both runners, so the first rows finish
  within seconds.

No Ray, no decoder: pipeline layer.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

TRIGGERS = ("full", "end", "wait", "bound", "block", "start")


@dataclass
class _Entry:
    costs: list[int]
    since: float


@dataclass
class PooledBatch:
    keys: list
    trigger: str
    waits: list[float]          # seconds each row waited in the pool
    segments: int


class PendingPool:
    def __init__(self, max_tokens: int, max_wait_s: float, max_pending_segments: int, clock=time.monotonic):
        self.max_tokens = max(1, int(max_tokens))
        self.max_wait_s = max_wait_s
        self.max_pending_segments = max_pending_segments
        self.clock = clock
        self._entries: dict = {}
        self.segments = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key, costs: list[int]) -> None:
        """A row waiting for its second stage: one cost per pending segment."""
        costs = [max(1, int(c)) for c in costs] or [1]
        self._entries[key] = _Entry(costs, self.clock())
        self.segments += len(costs)

    def oldest_wait(self) -> float:
        if not self._entries:
            return 0.0
        return self.clock() - min(e.since for e in self._entries.values())

    def _pack(self) -> list[list]:
        """Keys in batches, longest first and, among equal costs, oldest first:
        ``segments x widest segment <= max_tokens`` (pipeline.batching.pack_by_budget with
        rows kept whole; a row over the budget on its own is a batch of its own)."""
        order = sorted(self._entries, key=lambda k: (-max(self._entries[k].costs), self._entries[k].since))
        batches, current, count, width = [], [], 0, 0
        for key in order:
            costs = self._entries[key].costs
            w = width if current else max(costs)
            if current and (count + len(costs)) * w > self.max_tokens:
                batches.append(current)
                current, count = [], 0
                w = max(costs)
            current.append(key)
            count += len(costs)
            width = w
        if current:
            batches.append(current)
        return batches

    def _full(self, keys: list) -> bool:
        costs = [c for k in keys for c in self._entries[k].costs]
        return len(costs) * max(costs) > self.max_tokens - max(costs)   # one more would not fit

    def take(self, final: bool = False, drain: bool = False, start: bool = False) -> list[PooledBatch]:
        """The batches due now, removed from the pool: every full one; then what is left
        (a partial batch) when ``final`` (the input is exhausted), ``drain`` (the caller's
        bound), once its oldest row has waited ``max_wait_s``, or when ``start`` (the
        caller has just added a slow-start batch's rows)."""
        if not self._entries:
            return []
        batches = self._pack()
        # Every batch but the last was closed because the next row did not fit: full.
        out = [self._remove(b, "full") for b in batches[:-1]]
        last = batches[-1]
        if self._full(last):
            out.append(self._remove(last, "full"))
        elif final:
            out.append(self._remove(last, "end"))
        elif drain:
            out.append(self._remove(last, "bound"))
        elif self.oldest_wait() >= self.max_wait_s:
            out.append(self._remove(last, "wait"))
        elif start:
            out.append(self._remove(last, "start"))
        return out

    def _remove(self, keys: list, trigger: str) -> PooledBatch:
        now = self.clock()
        entries = [self._entries.pop(k) for k in keys]
        n = sum(len(e.costs) for e in entries)
        self.segments -= n
        return PooledBatch(keys, trigger, [now - e.since for e in entries for _ in e.costs], n)


@dataclass
class SecondStageStats:
    """What the second stage did: one entry per call of its ``finish`` (a packed batch),
    with the trigger that dispatched it and its widest segment's cost, and the seconds
    each segment waited for its batch."""
    max_tokens: int = 0
    calls: list = field(default_factory=list)     # [(segments, widest cost, trigger)]
    waits: list = field(default_factory=list)

    def record_call(self, segments: int, width: int, trigger: str | None) -> None:
        self.calls.append((int(segments), int(width), trigger or "block"))

    def record_waits(self, waits: list[float]) -> None:
        self.waits.extend(float(w) for w in waits)

    def merge(self, calls: list, waits: list | None = None) -> None:
        self.calls.extend(tuple(c) for c in calls)
        self.waits.extend(waits or [])

    def as_dict(self) -> dict:
        """calls, segments, mean/max segments per call, mean wait; ``by_trigger``: the
        same per trigger; ``budget_segments_per_call``: the mean of what the token budget
        allows each call (max_tokens // its widest segment), so ``mean / budget`` is the
        share of the budget the batches used."""
        segs = [c[0] for c in self.calls]
        out = {
            "calls": len(segs),
            "segments": sum(segs),
            "mean_segments_per_call": round(sum(segs) / len(segs), 3) if segs else 0.0,
            "max_segments_per_call": max(segs) if segs else 0,
            "mean_wait_s": round(sum(self.waits) / len(self.waits), 3) if self.waits else 0.0,
        }
        if self.max_tokens and self.calls:
            out["budget_segments_per_call"] = round(
                sum(max(1, self.max_tokens // max(1, c[1])) for c in self.calls) / len(self.calls), 3)
        by = {}
        for n, _, trigger in self.calls:
            t = by.setdefault(trigger, {"calls": 0, "segments": 0})
            t["calls"] += 1
            t["segments"] += n
        for t in by.values():
            t["mean_segments_per_call"] = round(t["segments"] / t["calls"], 3)
        out["by_trigger"] = by
        return out
