"""The optimiser schedule and the end of an epoch, for every loop here that fits weights:
the CTC draft head of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder
Drafts" (pipeline.models.whisper.ctc_head_fit, which a job may run inside its model actor)
and the lab's trainers (pipeline.training). AdamW under a linear warm-up and cosine
decay; the end of an epoch appends its curve point, logs it, and says whether a
wall-clock or epoch limit stops the run while the schedule stays that of all epochs.

It lives outside pipeline.training because the runtime may fit a head in a job, and the
runtime never imports the lab (tests/test_architecture.py).
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
    ``eval_cer``: a callable giving the held-out CER (or None), or None."""
    point = {"epoch": epoch, "step": step, "train_loss": round(loss_sum / max(n, 1), 4),
             "minutes": round((time.perf_counter() - t0) / 60, 2)}
    cer = eval_cer() if eval_cer is not None else None
    if cer is not None:    # None: no held-out text has words to score
        point["eval_cer"] = round(cer, 4)
    curve.append(point)
    log("train: " + " ".join(f"{k}={v}" for k, v in point.items()))
    if max_minutes is not None and point["minutes"] >= max_minutes and epoch < epochs:
        log(f"train: stopping after epoch {epoch}: --max-minutes {max_minutes} reached")
        return True
    if stop_after_epoch is not None and epoch >= stop_after_epoch and epoch < epochs:
        log(f"train: stopping after epoch {epoch} of {epochs}: --stop-after-epoch")
        return True
    return False


def descend(loss, params, opt, sched, clip_norm: float = 5.0) -> float:
    """One step of the schedule: the gradient of ``loss``, clipped to ``clip_norm``, applied
    by ``opt``, ``sched`` advanced; returns the loss as a float."""
    import torch

    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip_norm)
    opt.step()
    sched.step()
    return loss.detach().item()
