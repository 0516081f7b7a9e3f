"""Training and evaluation of the CTC draft head on cached frozen-encoder states.

CTC (Graves et al. 2006) over characters; the encoder is frozen as in SSD, so
training reads cached states only. Evaluation reports what SSD needs to know about its
draft: greedy-CTC CER/WER next to Whisper's own greedy AR on the same utterances, and a
reliability table of the eq. 3 gate statistic (max frame entropy over valid frames)
against the share of drafts that are exactly right after Whisper normalisation.
"""
from __future__ import annotations

import math
import random
import time

import torch
import torch.nn.functional as F

from pipeline.decoding.ctc_greedy import ctc_greedy
from pipeline.training.optim import end_epoch, warmup_cosine_adamw
from pipeline.text import charset

ENTROPY_EDGES = [0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, math.inf]


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


def train_head(head, train_rows: list[dict], eval_rows: list[dict], *, epochs: int, lr: float,
               seed: int, frame_budget: int, device="cpu", time_masks: int = 2,
               mask_width: int = 10, max_minutes: float | None = None, log_every: int = 25,
               stop_after_epoch: int | None = None, log=print) -> list[dict]:
    """AdamW with linear warm-up and cosine decay; returns the per-epoch curve.

    ``stop_after_epoch`` ends the run early while keeping the schedule of the full
    ``epochs`` budget, so a short run reproduces the first epochs of a long one step for
    step (the cheap reproduction check of the model card)."""
    from pipeline.metrics import corpus_cer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    data = examples(train_rows)
    lengths = [d["states"].shape[0] for d in data]
    steps_per_epoch = len(length_batches(lengths, frame_budget, random.Random(0)))
    opt, sched = warmup_cosine_adamw(head.parameters(), lr, epochs * steps_per_epoch, warmup_cap=300)
    curve, t0, step = [], time.perf_counter(), 0
    log(f"train: {len(data)} utterances ({len(train_rows) - len(data)} dropped: too short), "
        f"{sum(lengths)} frames, {steps_per_epoch} steps/epoch, {head.num_parameters()} params")
    for epoch in range(1, epochs + 1):
        head.train()
        loss_sum, n = 0.0, 0
        for batch in length_batches(lengths, frame_budget, rng):
            items = [data[i] for i in batch]
            states, lens = collate(items, device)
            states = time_mask(states, lens, gen, time_masks, mask_width)
            targets = torch.cat([it["target"] for it in items]).to(device)
            target_lens = torch.tensor([len(it["target"]) for it in items], device=device)
            log_probs = head(states, lens).float().log_softmax(-1)
            loss = F.ctc_loss(log_probs.transpose(0, 1), targets, lens, target_lens, blank=0,
                              reduction="mean", zero_infinity=True)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 5.0)
            opt.step()
            sched.step()
            step += 1
            loss_sum += loss.detach().item() * len(items)
            n += len(items)
            if log_every and step % log_every == 0:
                log(f"train: step={step} epoch={epoch} running_loss={loss_sum / n:.4f} "
                    f"lr={sched.get_last_lr()[0]:.2e} "
                    f"minutes={(time.perf_counter() - t0) / 60:.2f}")
        cer = (lambda: corpus_cer([r["text"] for r in eval_rows], greedy_drafts(head, eval_rows, device)[0])) \
            if eval_rows else None
        if end_epoch(curve, epoch=epoch, epochs=epochs, step=step, loss_sum=loss_sum, n=n, t0=t0, eval_cer=cer,
                     max_minutes=max_minutes, stop_after_epoch=stop_after_epoch, log=log):
            break
    head.eval()
    return curve


def _exact(ref: str, hyp: str) -> bool:
    from pipeline.metrics import normalize

    return normalize(ref) == normalize(hyp)


def evaluate(rows: list[dict], ctc_texts: list[str], max_entropy: list[float]) -> dict:
    """Per split: CER/WER of greedy CTC and Whisper AR (normalised), raw cased CER."""
    import jiwer

    from pipeline.metrics import corpus_cer, corpus_wer

    result = {}
    for split in sorted({r["split"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["split"] == split]
        refs = [rows[i]["text"] for i in idx]
        ctc = [ctc_texts[i] for i in idx]
        entry = {"utterances": len(idx),
                 "ctc_cer": corpus_cer(refs, ctc), "ctc_wer": corpus_wer(refs, ctc),
                 "ctc_raw_cer": jiwer.cer(refs, [c if c else " " for c in ctc]),
                 "ctc_exact": sum(_exact(r, c) for r, c in zip(refs, ctc)) / len(idx)}
        ar = [rows[i].get("ar_text") for i in idx]
        if all(a is not None for a in ar):
            entry.update(ar_cer=corpus_cer(refs, ar), ar_wer=corpus_wer(refs, ar),
                         ar_exact=sum(_exact(r, a) for r, a in zip(refs, ar)) / len(idx))
            entry["wer_ratio_ctc_over_ar"] = (entry["ctc_wer"] / entry["ar_wer"]
                                              if entry["ar_wer"] else math.inf)
        result[split] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in entry.items()}
    return result


def calibration_table(rows: list[dict], ctc_texts: list[str], max_entropy: list[float],
                      edges: list[float] = ENTROPY_EDGES) -> list[dict]:
    """Buckets of max frame entropy (nats, valid frames) -> share of exactly-right drafts,
    and the cumulative view SSD's τ_CTC reads: accept every draft below the upper edge."""
    table = []
    for lo, hi in zip(edges, edges[1:]):
        idx = [i for i, e in enumerate(max_entropy) if lo <= e < hi]
        below = [i for i, e in enumerate(max_entropy) if e < hi]
        table.append({
            "max_entropy": f"[{lo:g}, {hi:g})", "utterances": len(idx),
            "exact": round(sum(_exact(rows[i]["text"], ctc_texts[i]) for i in idx) / len(idx), 3)
            if idx else None,
            "accepted_if_tau_is_upper_edge": round(len(below) / len(rows), 3),
            "exact_among_accepted": round(sum(_exact(rows[i]["text"], ctc_texts[i])
                                              for i in below) / len(below), 3) if below else None,
        })
    return table
