"""When the drafting of "Model-free Speculative Decoding for Transformer-based ASR with Token Map Drafting" (§III-A) pays, pass by pass.

A break-even rule on exponentially forgotten running estimates (beyond the paper, whose
Fig. 3 shows drafting losing to plain decoding when too few candidate tokens are accepted;
the same kind of estimate as pipeline.decoding.ssd.pack_gate_policy).

A drafting pass feeds each row's candidate tree with its decided token, so it costs more
than a plain one-token pass; it pays back in the tokens it decides. Per alive row, with
g the tokens decided per drafting pass (1 + accepted drafts) and c the seconds of a
drafting pass over those of a plain pass, drafting pays when

    g > c                                                          (break-even)

Both are measured while decoding: g and the drafting seconds on drafting passes, the plain
seconds on plain passes (passes where no row has a candidate are plain anyway). Each is
a ratio of sums forgotten with a half-life in passes, so the estimates follow a corpus
that changes; g starts from an optimistic prior, so drafting is tried and measured first.
While drafting is off, g is not observed, so one pass in ``probe_every`` drafts anyway;
while it is on, one in ``probe_every`` is plain, to keep the plain cost current.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class DraftPolicy:
    prior_gain: float = 2.0       # tokens decided per row per drafting pass, before any is measured
    prior_cost: float = 1.6       # drafting / plain pass seconds, before both are measured (docs/token_map.md)
    prior_weight: float = 1.0     # row-passes the prior weighs (one row of one pass outweighs it)
    half_life: float = 64.0       # passes after which an observation weighs half
    probe_every: int = 64         # at most this many passes of one choice in a row (0: no limit)
    draft_rows: float = 0.0       # forgotten sums: rows and tokens of drafting passes,
    draft_tokens: float = 0.0
    draft_seconds: float = 0.0
    plain_rows: float = 0.0       # and rows and seconds of plain passes
    plain_seconds: float = 0.0
    drafted_passes: int = 0
    plain_passes: int = 0
    run: int = 0                  # consecutive passes of the current choice
    drafting: bool = True
    # The clock passes are timed with: wall time (the cost a job sees); a benchmark on a
    # shared CPU may pass process time, which other processes' load does not inflate.
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False)

    def gain(self) -> float:
        return (self.draft_tokens + self.prior_gain * self.prior_weight) / (self.draft_rows + self.prior_weight)

    def cost(self) -> float:
        if self.draft_rows <= 0 or self.plain_rows <= 0:
            return self.prior_cost
        return (self.draft_seconds / self.draft_rows) / (self.plain_seconds / self.plain_rows)

    def should_draft(self) -> bool:
        """Whether the next pass drafts; counted as a decision."""
        pays = self.gain() > self.cost()
        probe = self.probe_every > 0 and self.run >= self.probe_every and pays == self.drafting
        choice = (not pays) if probe else pays
        self.run = self.run + 1 if choice == self.drafting else 1
        self.drafting = choice
        if choice:
            self.drafted_passes += 1
        else:
            self.plain_passes += 1
        return choice

    def observe(self, drafted: bool, seconds: float, rows: int, decided: int) -> None:
        """One pass over ``rows`` alive rows took ``seconds`` and decided ``decided`` tokens."""
        if rows <= 0:
            return
        keep = 0.5 ** (1.0 / self.half_life)
        if drafted:
            self.draft_rows = self.draft_rows * keep + rows
            self.draft_tokens = self.draft_tokens * keep + decided
            self.draft_seconds = self.draft_seconds * keep + seconds
        else:
            self.plain_rows = self.plain_rows * keep + rows
            self.plain_seconds = self.plain_seconds * keep + seconds
