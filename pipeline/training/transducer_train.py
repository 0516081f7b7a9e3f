"""Training of the embedded transducer (pipeline.models.transducer.embedded) with the TDT
loss of "Efficient Sequence Transduction by Jointly Predicting Tokens and Durations"
(§3.2: the forward variable over (frame, label) with token arcs of every duration and
blank arcs of durations >= 1), computed frame-synchronously (pipeline.training.tdt_loss).

The encoder side is frozen, so training reads cached Whisper encoder states
(pipeline.training.ctc_features), runs the frozen CTC-head adapter over them once,
and then trains only the frame projection, predictor and joint. Evaluation: greedy
decoding (pipeline.decoding.transducer.greedy) on held-out rows, CER/WER after Whisper's
normaliser.
"""
from __future__ import annotations

import random
import time

import torch

from ..fit_schedule import descend
from .optim import end_epoch, warmup_cosine_adamw
from ..text import charset



@torch.inference_mode()
def adapter_hidden(ctc_head, rows: list[dict], frame_budget: int = 40000) -> list[dict]:
    """Rows with ``hidden`` [t, d] fp16: the frozen CTC adapter's output over ``states``."""
    from .ctc_head_train import collate, length_batches

    ctc_head.eval()
    out = [None] * len(rows)
    for batch in length_batches([r["states"].shape[0] for r in rows], frame_budget, random.Random(0)):
        states, lengths = collate([rows[i] for i in batch], "cpu")
        hidden, steps = ctc_head.hidden(states, lengths)
        for j, i in enumerate(batch):
            out[i] = {k: v for k, v in rows[i].items() if k != "states"} | {
                "hidden": hidden[j, :int(steps[j])].to(torch.float16).clone()}
    return out


def examples(rows: list[dict]) -> list[dict]:
    """Rows with a non-empty character target."""
    out = []
    for r in rows:
        target = charset.encode(r["text"])
        if target:
            out.append(r | {"target": torch.tensor(target, dtype=torch.long)})
    return out


def cell_batches(frames: list[int], labels: list[int], cell_budget: int, rng: random.Random) -> list[list[int]]:
    """Batches of similar size whose padded joint lattice (B x T x (U + 1)) fits ``cell_budget``."""
    order = sorted(range(len(frames)), key=lambda i: (frames[i], labels[i], rng.random()))
    batches, current, t_max, u_max = [], [], 0, 0
    for i in order:
        t_new, u_new = max(t_max, frames[i]), max(u_max, labels[i] + 1)
        if current and t_new * u_new * (len(current) + 1) > cell_budget:
            batches.append(current)
            current, t_new, u_new = [], frames[i], labels[i] + 1
        current.append(i)
        t_max, u_max = t_new, u_new
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def pad_hidden(items: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' ``hidden`` right-padded into [B, T, D] fp32, and their lengths."""
    lengths = torch.tensor([it["hidden"].shape[0] for it in items])
    hidden = torch.zeros(len(items), int(lengths.max()), items[0]["hidden"].shape[1])
    for i, it in enumerate(items):
        hidden[i, :lengths[i]] = it["hidden"].float()
    return hidden, lengths


def collate(items: list[dict]):
    hidden, lengths = pad_hidden(items)
    label_lengths = torch.tensor([len(it["target"]) for it in items])
    targets = torch.zeros(len(items), int(label_lengths.max()), dtype=torch.long)
    for i, it in enumerate(items):
        targets[i, :label_lengths[i]] = it["target"]
    return hidden, lengths, targets, label_lengths


def tdt_batch_loss(model, hidden, lengths, targets, label_lengths) -> torch.Tensor:
    """The batch's mean per-label negative log-likelihood (NeMo's and transformers' "mean")."""
    from .tdt_loss import tdt_loss

    cfg = model.config
    logits = model.all_logits(model.project(hidden), targets)
    durations = list(cfg.durations) or None      # none: an RNN-T
    nll = tdt_loss(logits[..., :cfg.vocab_size], logits[..., cfg.vocab_size:] if durations else None, targets,
                   lengths, label_lengths, cfg.blank, durations)
    return (nll / label_lengths).mean()


@torch.inference_mode()
def greedy_texts(model, rows: list[dict], batch_size: int = 64) -> list[str]:
    from ..decoding.transducer.greedy import transducer_greedy
    from ..models.transducer.embedded import EmbeddedTransducerAdapter

    model.eval()
    adapter = EmbeddedTransducerAdapter(model)
    order = sorted(range(len(rows)), key=lambda i: rows[i]["hidden"].shape[0])
    texts = [""] * len(rows)
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        hidden, lengths = pad_hidden([rows[i] for i in idx])
        out = transducer_greedy(adapter, model.project(hidden), lengths)
        for j, i in enumerate(idx):
            texts[i] = adapter.decode_text(out.tokens[j])
    return texts


def train(model, train_rows: list[dict], eval_rows: list[dict], *, epochs: int, lr: float, seed: int,
          cell_budget: int, max_minutes: float | None = None, stop_after_epoch: int | None = None,
          log_every: int = 50, log=print) -> list[dict]:
    """AdamW with linear warm-up and cosine decay over ``epochs``; returns the per-epoch
    curve. ``stop_after_epoch`` ends the run early on the full run's schedule (how the
    shipped weights are reproduced without a wall-clock limit)."""
    from ..metrics import corpus_cer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    data = examples(train_rows)
    frames = [d["hidden"].shape[0] for d in data]
    labels = [len(d["target"]) for d in data]
    steps_per_epoch = len(cell_batches(frames, labels, cell_budget, random.Random(0)))
    opt, sched = warmup_cosine_adamw(model.parameters(), lr, epochs * steps_per_epoch, warmup_cap=200)
    curve, t0, step = [], time.perf_counter(), 0
    log(f"train: {len(data)} utterances, {sum(frames)} frames, {steps_per_epoch} steps/epoch, "
        f"{model.num_parameters()} params")
    for epoch in range(1, epochs + 1):
        model.train().requires_grad_(True)     # the evaluation's adapter freezes it
        loss_sum, n = 0.0, 0
        for batch in cell_batches(frames, labels, cell_budget, rng):
            hidden, lengths, targets, label_lengths = collate([data[i] for i in batch])
            loss = tdt_batch_loss(model, hidden, lengths, targets, label_lengths)
            step += 1
            loss_sum += descend(loss, model.parameters(), opt, sched) * len(batch)
            n += len(batch)
            if log_every and step % log_every == 0:
                log(f"train: step={step} epoch={epoch} running_loss={loss_sum / n:.4f} "
                    f"lr={sched.get_last_lr()[0]:.2e} minutes={(time.perf_counter() - t0) / 60:.2f}")
        cer = (lambda: corpus_cer([r["text"] for r in eval_rows], greedy_texts(model, eval_rows))) \
            if eval_rows else None
        if end_epoch(curve, epoch=epoch, epochs=epochs, step=step, loss_sum=loss_sum, n=n, t0=t0, eval_cer=cer,
                     max_minutes=max_minutes, stop_after_epoch=stop_after_epoch, log=log):
            break
    model.eval()
    return curve
