"""Fitting the character CTC draft head of "Self-Speculative Decoding for LLM-based ASR
with CTC Encoder Drafts" on frozen encoder states.

The paper keeps its encoder frozen and drafts with a CTC output over it; we fit that
output (pipeline.models.whisper.ctc_head) with the CTC loss (Graves et al. 2006) on
states already computed, so fitting never runs the encoder. Rows are dicts with
``states`` [T, D] (valid frames) and ``text`` (the transcript to learn: a reference, or
the model's own greedy AR text). This is the one training loop of the head: the lab's
``train-ctc-head`` and ``train-draft-head`` call it, and it imports nothing from the lab
(pipeline.training), so a job's model actor may fit a head with it too.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..ctc_greedy import ctc_greedy
from ...fit_schedule import descend, end_epoch, warmup_cosine_adamw
from ...text import charset


@dataclass
class FitOptions:
    epochs: int = 12
    lr: float = 2e-3
    seed: int = 0
    frame_budget: int = 12000        # padded frames per batch
    device: str = "cpu"
    time_masks: int = 2              # SpecAugment-style masked spans per utterance
    mask_width: int = 10             # frames, at most, per masked span
    # Wall-clock limit of the fitting, in minutes (None: none). Checked at the end of each
    # epoch, or after every step with ``stop_within_epoch`` (a hard budget, for a job).
    max_minutes: float | None = None
    stop_within_epoch: bool = False
    # End after this epoch but keep the schedule of ``epochs`` (a short run reproduces the
    # first epochs of a long one step for step).
    stop_after_epoch: int | None = None
    log_every: int = 25              # steps between progress lines (0: none)


def examples(rows: list[dict]) -> list[dict]:
    """Rows whose transcript fits CTC's length constraint (frames >= labels + repeats)."""
    out = []
    for r in rows:
        target = charset.encode(r["text"])
        repeats = sum(a == b for a, b in zip(target, target[1:]))
        if target and len(target) + repeats <= r["states"].shape[0]:
            out.append(r | {"target": torch.tensor(target, dtype=torch.long)})
    return out


def length_batches(lengths: list[int], frame_budget: int, rng: random.Random) -> list[list[int]]:
    """Batches of similar length under a padded-frame budget, in a seeded random order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, current, longest = [], [], 0
    for i in order:
        longest_new = max(longest, lengths[i])
        if current and longest_new * (len(current) + 1) > frame_budget:
            batches.append(current)
            current, longest_new = [], lengths[i]
        current.append(i)
        longest = longest_new
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(items: list[dict], device) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([it["states"].shape[0] for it in items])
    states = torch.zeros(len(items), int(lengths.max()), items[0]["states"].shape[1])
    for i, it in enumerate(items):
        states[i, : lengths[i]] = it["states"].float()
    return states.to(device), lengths.to(device)


def time_mask(states: torch.Tensor, lengths: torch.Tensor, gen: torch.Generator,
              masks: int, width: int) -> torch.Tensor:
    """SpecAugment-style time masking on encoder states (zeroed spans), seeded."""
    if masks <= 0:
        return states
    b, t, _ = states.shape
    keep = torch.ones(b, t, 1, device=states.device)
    starts = (torch.rand(b, masks, generator=gen) * lengths[:, None].cpu()).long()
    widths = torch.randint(0, width + 1, (b, masks), generator=gen)
    for i in range(b):
        for s, w in zip(starts[i].tolist(), widths[i].tolist()):
            keep[i, s:s + w] = 0.0
    return states * keep


@torch.inference_mode()
def greedy_drafts(head, rows: list[dict], device="cpu", frame_budget: int = 20000):
    """Greedy CTC text and max valid-frame entropy per row (input order)."""
    head.eval()
    texts, max_ent = [None] * len(rows), [0.0] * len(rows)
    batches = length_batches([r["states"].shape[0] for r in rows], frame_budget, random.Random(0))
    for batch in batches:
        states, lengths = collate([rows[i] for i in batch], device)
        log_probs = head(states, lengths).float().log_softmax(-1)
        g = ctc_greedy(log_probs, lengths)
        for j, i in enumerate(batch):
            texts[i] = charset.decode(g.tokens[j])
            max_ent[i] = float(g.max_entropy[j])
    return texts, max_ent


def fit_ctc_head(head, train_rows: list[dict], eval_rows: list[dict], options: FitOptions,
                 log=print) -> list[dict]:
    """Fit ``head`` in place: AdamW with linear warm-up and cosine decay over
    ``options.epochs``; returns the per-epoch curve (train loss, minutes, and the greedy
    draft's CER against ``eval_rows``' texts where there are any). Deterministic given
    ``options.seed`` on one CPU thread, the initial weights aside."""
    from ...metrics import corpus_cer

    o = options
    torch.manual_seed(o.seed)
    rng = random.Random(o.seed)
    gen = torch.Generator().manual_seed(o.seed)
    data = examples(train_rows)
    lengths = [d["states"].shape[0] for d in data]
    steps_per_epoch = len(length_batches(lengths, o.frame_budget, random.Random(0)))
    opt, sched = warmup_cosine_adamw(head.parameters(), o.lr, o.epochs * steps_per_epoch, warmup_cap=300)
    curve, t0, step = [], time.perf_counter(), 0
    log(f"train: {len(data)} utterances ({len(train_rows) - len(data)} dropped: too short), "
        f"{sum(lengths)} frames, {steps_per_epoch} steps/epoch, {head.num_parameters()} params")
    if not data:
        head.eval()
        return curve
    out_of_time = False
    for epoch in range(1, o.epochs + 1):
        head.train()
        loss_sum, n = 0.0, 0
        for batch in length_batches(lengths, o.frame_budget, rng):
            items = [data[i] for i in batch]
            states, lens = collate(items, o.device)
            states = time_mask(states, lens, gen, o.time_masks, o.mask_width)
            targets = torch.cat([it["target"] for it in items]).to(o.device)
            target_lens = torch.tensor([len(it["target"]) for it in items], device=o.device)
            log_probs = head(states, lens).float().log_softmax(-1)
            loss = F.ctc_loss(log_probs.transpose(0, 1), targets, lens, target_lens, blank=0,
                              reduction="mean", zero_infinity=True)
            step += 1
            loss_sum += descend(loss, head.parameters(), opt, sched) * len(items)
            n += len(items)
            if o.log_every and step % o.log_every == 0:
                log(f"train: step={step} epoch={epoch} running_loss={loss_sum / n:.4f} "
                    f"lr={sched.get_last_lr()[0]:.2e} "
                    f"minutes={(time.perf_counter() - t0) / 60:.2f}")
            if o.stop_within_epoch and o.max_minutes is not None and time.perf_counter() - t0 >= 60 * o.max_minutes:
                out_of_time = True
                break
        cer = (lambda: corpus_cer([r["text"] for r in eval_rows], greedy_drafts(head, eval_rows, o.device)[0])) \
            if eval_rows else None
        if end_epoch(curve, epoch=epoch, epochs=o.epochs, step=step, loss_sum=loss_sum, n=n, t0=t0,
                     eval_cer=cer, max_minutes=o.max_minutes, stop_after_epoch=o.stop_after_epoch, log=log):
            break
        if out_of_time:
            log(f"train: stopped within epoch {epoch}: the {o.max_minutes}-minute budget is spent")
            break
    head.eval()
    return curve
