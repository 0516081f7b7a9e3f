"""What the two training jobs here share (the CTC draft head of "Self-Speculative Decoding
for LLM-based ASR with CTC Encoder Drafts", pipeline.training.ctc_head_train; the
embedded transducer of "Pushing the Limits of Beam Search Decoding for Transducer-based
ASR models", pipeline.training.transducer_train): AdamW under a linear warm-up and cosine
decay, and the end of an epoch. Both live in pipeline.fit_schedule, where a job's runtime
(in-job fitting of the draft head) reaches them too; the lab imports them from here.
"""
from __future__ import annotations

from ..fit_schedule import end_epoch, warmup_cosine_adamw

__all__ = ["end_epoch", "warmup_cosine_adamw"]
