"""When the first pass of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts" (eqs. 3, 5) pays, batch by batch.

A break-even rule on exponentially forgotten running estimates (beyond the paper; its first
pass is the CTC draft, the gate of eq. 3 and the verification of eq. 5, its fallback eqs.
6-7).

SSD's first pass spends, per segment, the CTC draft and one teacher-forced verification
pass. It pays back in tokens the AR fallback does not have to decode: every token of a
draft the gate or the verification makes final, and the verified prefix of the others.
Per segment, with g those tokens and c the first pass's seconds over the fallback's
seconds per decoded token, the first pass pays when

    g > c                                                          (break-even)

On speech the draft head knows (held-out synthetic voices on a GPU, the paper's regime)
the gate and long prefixes carry g far above c. On speech it does not (the 22 real
recordings: 10 verified tokens of 146, docs/ssd.md) the first pass is a cost with nothing
behind it, and a self-calibrating gate that has learnt to accept nothing
(pipeline.decoding.ssd.gate_calibration) still pays for every draft. There the batch skips the
draft and the verification and goes straight to the fallback, which then decodes it as
plain greedy AR.

Both sides are measured as the job runs: g and the first pass's seconds on batches that
draft; the fallback's seconds per decoded token wherever the fallback reports them (it
does when it shares the first pass's process: the local runner, ``bench``). A fallback
pool in another Ray process cannot; there the first pass decodes a sample of the skipped
batches itself (:meth:`wants_cost_sample`) and measures them: all of them would serialise
on the first pool the decoding the fallback pool does beside it. Each is a ratio of sums
forgotten with a half-life in segments, and each starts from a prior worth a few
segments, so that one small batch (a first batch of one clip costs several times what a
full batch does per segment) does not decide alone. g's prior is optimistic, so the
first batches draft and are measured; while drafting is off, g is not observed, so one
batch in ``probe_every`` drafts anyway.

A drafted segment's text is SSD's, a skipped one's plain AR's, and they differ where
verification accepts a token that is not the decoder's argmax (τ_SLM < 0.5). With c
measured, which batches draft depends on timing, so two runs over the same input may
differ; a fixed ``break_even`` (c given in tokens) makes the decisions a function of the
input alone, as the self-calibrating gate's are.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class VerifyPolicy:
    prior_gain: float = 16.0      # tokens decided per segment by the first pass, before any is measured
    prior_cost: float = 6.0       # first-pass seconds per segment over fallback seconds per token (docs/ssd.md)
    prior_weight: float = 4.0     # segments each prior weighs
    half_life: float = 256.0      # segments after which an observation weighs half
    probe_every: int = 16         # at most this many batches in a row without a draft (0: no probes)
    break_even: float | None = None  # c fixed, in tokens per segment (None: measured)
    rows: float = 0.0             # forgotten sums over drafted batches: segments, tokens decided,
    decided: float = 0.0
    seconds: float = 0.0          # and the first pass's seconds beyond the encoder
    ar_tokens: float = 0.0        # forgotten sums over fallback calls: tokens decoded, seconds
    ar_seconds: float = 0.0
    drafted_batches: int = 0
    skipped_batches: int = 0
    skip_run: int = 0             # consecutive batches without a draft

    def gain(self) -> float:
        return (self.decided + self.prior_gain * self.prior_weight) / (self.rows + self.prior_weight)

    def cost(self) -> float:
        if self.break_even is not None:
            return self.break_even
        if self.ar_tokens <= 0 or self.ar_seconds <= 0:
            return self.prior_cost
        # the first pass's seconds in fallback tokens, then averaged with the prior's
        tokens = self.seconds / (self.ar_seconds / self.ar_tokens)
        return (tokens + self.prior_cost * self.prior_weight) / (self.rows + self.prior_weight)

    def should_draft(self) -> bool:
        """Whether the next batch gets the draft and verification; counted as a decision."""
        probe = self.probe_every > 0 and self.skip_run + 1 >= self.probe_every
        draft = probe or self.gain() > self.cost()
        if draft:
            self.drafted_batches += 1
            self.skip_run = 0
        else:
            self.skipped_batches += 1
            self.skip_run += 1
        return draft

    def wants_cost_sample(self) -> bool:
        """Whether a skipped batch should be decoded where the first pass runs, though the
        fallback runs elsewhere, to measure what a fallback token costs: while none has
        been measured, then one skipped batch in ``probe_every`` (call after
        :meth:`should_draft` said skip)."""
        if self.break_even is not None:
            return False
        if self.ar_tokens <= 0:
            return True
        return self.probe_every > 0 and self.skipped_batches % self.probe_every == 1

    def observe_first_pass(self, segments: int, decided: int, seconds: float) -> None:
        """A drafted batch of ``segments``: the first pass decided ``decided`` tokens (final
        drafts and verified prefixes) in ``seconds`` beyond the encoder."""
        if segments <= 0:
            return
        keep = 0.5 ** (segments / self.half_life)
        self.rows = self.rows * keep + segments
        self.decided = self.decided * keep + decided
        self.seconds = self.seconds * keep + seconds

    def observe_fallback(self, segments: int, tokens: int, seconds: float) -> None:
        """The fallback decoded ``tokens`` tokens for ``segments`` segments in ``seconds``."""
        if segments <= 0 or tokens <= 0:
            return
        keep = 0.5 ** (segments / self.half_life)
        self.ar_tokens = self.ar_tokens * keep + tokens
        self.ar_seconds = self.ar_seconds * keep + seconds
