"""The gate of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts" (eq. 3) with τ_CTC calibrated online.

Beyond the paper, whose gate accepts a draft when its max frame entropy is below a fixed
τ_CTC: here τ_CTC is calibrated online to hold an error rate for the drafts it accepts.

A fixed τ_CTC holds only on speech like the draft head's training data: the head's
entropy says little about real recordings (docs/ssd.md). But the decoder already learns,
for every draft it verifies (eq. 5), whether that draft was right. Eq. 5's own verdict at
τ_SLM is too strict a label: it rejects most drafts whose only flaw is a token the decoder
would spell another way, drafts the fixed gate rightly accepts; high_rtfx's gate
verification (3e-5) is too lax, it catches gross errors only. The label here: a draft is
wrong when the decoder gives one of its tokens a probability <= ``label_tau`` (1e-3: the
measured wrong drafts of real recordings all had one, docs/ssd.md) or does not end the text
after it. It comes from the same verification pass (its per-row
acceptance threshold), which then runs its output projection further along rejected
drafts. The job estimates P(draft wrong | max entropy) on its own corpus as it runs:

- max entropies fall in bins of ``bin_width`` nats up to the cap (the configured τ_CTC);
- each bin keeps exponentially forgotten counts (a half-life in drafts) of the drafts
  seen (every non-empty draft, verified or not), of those verified (checked) and of those
  found wrong;
- for a threshold t, the expected error share of the drafts it would accept weighs each
  checked bin's error rate by the drafts it saw (verification sees the gated bins only
  through probes, the others whole), under a Beta(a, r) prior that is pessimistic on
  purpose, so that a handful of lucky drafts does not open the gate:

      err(t) = (a + sum_{b < t} S_b W_b / C_b) / (a + r + sum_{b < t} S_b),

  over bins with C_b > 0, with S_b drafts seen, C_b checked and W_b found wrong; τ_CTC is
  the largest bin edge with err(t) <= ``max_draft_error`` (0 where none: nothing is gated).

The gate hides its own labels: a draft it accepts is not verified. So one accepted draft
in ``probe_every`` is verified anyway (a probe); it stays final only if verification
accepts it, so probing never costs accuracy, only its share of a verification pass. On a
corpus where drafts are never right, no bin's error falls under the target, τ_CTC stays
at 0 and nothing is gated or probed. Verifying every draft would then cost what
high_accuracy costs for a few prefix tokens; with the gate calibrating itself, batches
skip the draft and its verification while they do not pay
(pipeline.decoding.ssd.verify_policy), and a packed gate that never passes is switched off
by its own policy (pipeline.decoding.ssd.pack_gate_policy).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class GateCalibration:
    max_draft_error: float          # target share of accepted drafts that verification would reject
    cap: float                      # τ_CTC never exceeds this (the configured tau_ctc)
    bin_width: float = 0.05         # nats
    half_life: float = 4096.0       # drafts after which an observation weighs half
    probe_every: int = 8            # one gated draft in this many is verified anyway
    label_tau: float = 1e-3         # a draft token at or below this probability makes the draft wrong
    prior_wrong: float = 1.0
    prior_right: float = 1.0
    seen: np.ndarray = field(init=False, repr=False)
    checked: np.ndarray = field(init=False, repr=False)
    wrong: np.ndarray = field(init=False, repr=False)
    gated_count: int = field(default=0, init=False)
    _tau: float = field(default=0.0, init=False)

    def __post_init__(self):
        if not 0.0 < self.max_draft_error < 1.0:
            raise ValueError(f"max_draft_error must be in (0, 1), got {self.max_draft_error}")
        bins = max(1, int(np.ceil(self.cap / self.bin_width)))
        self.seen, self.checked, self.wrong = np.zeros(bins), np.zeros(bins), np.zeros(bins)

    @property
    def tau(self) -> float:
        """The threshold in force (nats)."""
        return self._tau

    def _bins(self, max_entropy: np.ndarray) -> np.ndarray:
        return np.minimum((max_entropy / self.bin_width).astype(np.int64), len(self.seen) - 1)

    def decide(self, max_entropy: np.ndarray, nonempty: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For one batch at the threshold in force: which drafts the gate accepts, and which
        of those are probes (verified anyway). Counted as seen."""
        h = np.asarray(max_entropy, dtype=np.float64)
        nonempty = np.asarray(nonempty, dtype=bool)
        gated = nonempty & (h < self._tau)
        probes = np.zeros_like(gated)
        if self.probe_every > 0:
            # every probe_every-th gated draft of the job, counted across batches
            index = np.flatnonzero(gated)
            probes[index] = (self.gated_count + 1 + np.arange(len(index))) % self.probe_every == 0
        self.gated_count += int(gated.sum())
        keep = 0.5 ** (int(nonempty.sum()) / self.half_life)
        self.seen *= keep
        self.checked *= keep
        self.wrong *= keep
        # Drafts past the cap are never gated; they still teach the bins below it nothing.
        inside = nonempty & (h < len(self.seen) * self.bin_width)
        np.add.at(self.seen, self._bins(h[inside]), 1.0)
        return gated, probes

    def observe(self, max_entropy: np.ndarray, wrong: np.ndarray) -> None:
        """Verification outcomes of drafts checked in this batch (``wrong``: rejected)."""
        h = np.asarray(max_entropy, dtype=np.float64)
        wrong = np.asarray(wrong, dtype=bool)
        inside = h < len(self.seen) * self.bin_width
        bins = self._bins(h[inside])
        np.add.at(self.checked, bins, 1.0)
        np.add.at(self.wrong, bins, wrong[inside].astype(np.float64))
        self._tau = self.threshold()

    def threshold(self) -> float:
        """The largest bin edge whose accepted drafts' expected error is within the target."""
        checked = self.checked > 1e-9
        rate = np.divide(self.wrong, self.checked, out=np.zeros_like(self.wrong), where=checked)
        mass = np.cumsum(np.where(checked, self.seen, 0.0))
        expected = (self.prior_wrong + np.cumsum(np.where(checked, self.seen * rate, 0.0))) / \
            (self.prior_wrong + self.prior_right + mass)
        ok = np.flatnonzero((mass > 0) & (expected <= self.max_draft_error))
        return 0.0 if len(ok) == 0 else min(self.cap, float(ok[-1] + 1) * self.bin_width)
