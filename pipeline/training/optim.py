"""What the two training jobs here share (the CTC draft head of "Self-Speculative Decoding
for LLM-based ASR with CTC Encoder Drafts", pipeline.training.ctc_head_train; the
embedded transducer of "Pushing the Limits of Beam Search Decoding for Transducer-based
ASR models", pipeline.training.transducer_train): AdamW under a linear warm-up
and cosine decay, and the end of an epoch (its curve point, its log line, and whether a
wall-clock or epoch limit stops the run while the schedule stays that of all epochs).
"""
from __future__ import annotations

import math
import time

import torch


def warmup_cosine_adamw(params, lr: float, total_steps: int, warmup_cap: int):
    """AdamW (weight decay 0.01) and its schedule: linear warm-up over
    ``min(warmup_cap, total_steps // 10)`` steps, then a cosine to 0 at ``total_steps``."""
    total = max(1, total_steps)
    warmup = min(warmup_cap, total // 10)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    return opt, sched


def end_epoch(curve: list[dict], *, epoch: int, epochs: int, step: int, loss_sum: float, n: int, t0: float,
              eval_cer=None, max_minutes: float | None = None, stop_after_epoch: int | None = None,
              log=print) -> bool:
    """Append the epoch's point to ``curve`` and log it; True where the run stops here.
    ``eval_cer``: a callable giving the held-out CER, or None."""
    point = {"epoch": epoch, "step": step, "train_loss": round(loss_sum / max(n, 1), 4),
             "minutes": round((time.perf_counter() - t0) / 60, 2)}
    if eval_cer is not None:
        point["eval_cer"] = round(eval_cer(), 4)
    curve.append(point)
    log("train: " + " ".join(f"{k}={v}" for k, v in point.items()))
    if max_minutes is not None and point["minutes"] >= max_minutes and epoch < epochs:
        log(f"train: stopping after epoch {epoch}: --max-minutes {max_minutes} reached")
        return True
    if stop_after_epoch is not None and epoch >= stop_after_epoch and epoch < epochs:
        log(f"train: stopping after epoch {epoch} of {epochs}: --stop-after-epoch")
        return True
    return False
