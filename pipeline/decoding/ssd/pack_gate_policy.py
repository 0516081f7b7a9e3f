"""When the packed gate (eq. 3 of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts" on packed windows) pays, batch by batch.

A break-even rule on an exponentially forgotten Beta-Bernoulli estimate of the gate's pass
rate (beyond the paper, whose gate is eq. 3).

The packed gate (pipeline.kinds.ssd.stages.SSDFirstPassDecoder) encodes n short clips in W
shared 30-s windows for the CTC draft and the gate, then encodes again alone every clip
of a shared window that the gate (and gate verification) rejects, because Whisper's
decoder reads a clip's whole window. In encoder passes, with a share p of the clips
accepted, packing costs W + (1 - p) n and the plain first pass n, so packing pays when

    p > W / n                                                       (break-even)

A rejected clip alone in its window needs no second pass, which lowers the bar; the CTC
head run again on re-encoded clips and the packed verification pass (one decoder pass
per window holding a gated clip) raise it a little, so the rule is slightly optimistic.
On speech the draft head handles well p is far above the bar (held-out synthetic voices);
on speech unlike its training data nothing passes (22 real recordings: p = 0), and then
every packed window is an encoder pass spent for nothing.

So each batch of short clips is packed only while the running estimate of p is above the
batch's own break-even. The estimate is the mean of a Beta posterior whose counts are
forgotten exponentially (a half-life in clips), so it follows a corpus that changes; its
prior is optimistic, so the first batch packs and is measured. A batch that is not packed
still measures p, on the plain gate: the same head on solo rather than packed windows,
whose drafts and entropies differ somewhat. So that a corpus on which only packed drafts
pass is not judged by solo drafts for ever, one batch in ``probe_every`` consecutive
unpacked ones is packed anyway.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PackGatePolicy:
    prior_passed: float = 2.0   # Beta prior: the first batch packs (estimate 2/3)
    prior_failed: float = 1.0
    half_life: float = 256.0    # clips after which an observation weighs half
    probe_every: int = 16       # at most this many unpacked batches in a row (0: no probes)
    passed: float = 0.0
    seen: float = 0.0
    packed_batches: int = 0
    plain_batches: int = 0
    plain_run: int = 0

    def pass_rate(self) -> float:
        return (self.passed + self.prior_passed) / (self.seen + self.prior_passed + self.prior_failed)

    def should_pack(self, clips: int, windows: int) -> bool:
        """Whether to pack a batch of ``clips`` short clips that would fill ``windows``
        windows; counted as a decision."""
        if clips < 2:
            return False
        probe = self.probe_every > 0 and self.plain_run + 1 >= self.probe_every
        pack = probe or self.pass_rate() > windows / clips
        if pack:
            self.packed_batches += 1
            self.plain_run = 0
        else:
            self.plain_batches += 1
            self.plain_run += 1
        return pack

    def observe(self, passed: int, clips: int) -> None:
        """``passed`` of ``clips`` short clips had their draft accepted by the gate."""
        if clips <= 0:
            return
        keep = 0.5 ** (clips / self.half_life)
        self.passed = self.passed * keep + passed
        self.seen = self.seen * keep + clips
