"""Station announcements: a text domain no draft head, token map or threshold was tuned on.

Not a paper algorithm: the in-domain set on which drafts that learn from the corpus are
measured (the CTC drafts of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder
Drafts", adapted on the model's own transcripts). Rail announcements repeat a small
vocabulary (stations, platforms, times, reasons for delay) in many combinations, which is
what a long production job over one source looks like.

Each sentence comes in two forms, as in ``domain_text``: ``text`` as Whisper writes it
(digits for platforms and minutes, clock times as "8:15") and ``spoken`` with every number
in words, because the engines misread digits. The train and held-out sentences are
disjoint (a stable hash of the text decides), so the held-out set measures new sentences
in voices the train set never used.
"""
from __future__ import annotations

import hashlib
import random

from .domain_text import int_to_words

STATIONS = ["Brno", "Ostrava", "Olomouc", "Pardubice", "Kolin", "Prague Central", "Zlin",
            "Jihlava", "Tabor", "Pilsen", "Liberec", "Opava", "Breclav", "Znojmo", "Havirov",
            "Kromeriz", "Prerov", "Trebic", "Vyskov", "Hodonin"]
SERVICES = ["regional", "express", "intercity", "night", "local", "fast"]
REASONS = ["a signal failure", "a broken down train", "track works", "a shortage of staff",
           "a fault with the doors", "severe weather", "a late running freight train",
           "an earlier incident", "a points failure near the station"]
CARRIAGES = ["first class", "the bicycle area", "the quiet coach", "the restaurant car",
             "the front four coaches", "the rear two coaches"]
HELDOUT_TEXT_SHARE = 0.2


def _clock(rng: random.Random) -> tuple[str, str]:
    """A departure time as Whisper writes it ("8:15") and as spoken ("eight fifteen")."""
    h, m = rng.randint(5, 23), rng.choice([0, 5, 10, 12, 15, 20, 25, 30, 35, 40, 42, 45, 50, 55])
    h12 = h if h <= 12 else h - 12
    if m == 0:
        return f"{h12} o'clock", f"{int_to_words(h12)} o'clock"
    spoken_m = f"oh {int_to_words(m)}" if m < 10 else int_to_words(m)
    return f"{h12}:{m:02d}", f"{int_to_words(h12)} {spoken_m}"


def announcement(rng: random.Random) -> dict:
    """One announcement: {"text", "spoken", "kind"}."""
    service, dest, via = rng.choice(SERVICES), *rng.sample(STATIONS, 2)
    (t_text, t_spoken), platform = _clock(rng), rng.randint(1, 12)
    minutes, reason, coach = rng.choice([5, 10, 15, 20, 25, 30, 40, 45]), rng.choice(REASONS), rng.choice(CARRIAGES)
    kind = rng.choice(["departure", "delay", "platform", "calling", "cancel", "coach"])
    if kind == "departure":
        t = f"The {{t}} {service} service to {dest} will depart from platform {{p}}."
    elif kind == "delay":
        t = rng.choice([f"The {{t}} train to {dest} is delayed by about {{d}} minutes due to {reason}.",
                        f"We are sorry to announce that the {service} train to {dest} is running {{d}} minutes late."])
    elif kind == "platform":
        t = rng.choice([f"Platform change: the {{t}} train to {dest} will now leave from platform {{p}}.",
                        f"The train now arriving at platform {{p}} is the {service} service to {dest}."])
    elif kind == "calling":
        t = f"This train calls at {via} and {dest}. Please mind the gap."
    elif kind == "cancel":
        t = f"The {{t}} {service} service to {dest} has been cancelled due to {reason}."
    else:
        t = f"Passengers for {dest} should travel in {coach} of this train."
    text = t.format(t=t_text, p=platform, d=minutes)
    spoken = t.format(t=t_spoken, p=int_to_words(platform), d=int_to_words(minutes))
    return {"text": text, "spoken": spoken, "kind": kind}


def is_heldout_announcement(text: str) -> bool:
    """A stable share of the sentences, never used for training in any run or size."""
    digest = hashlib.sha1(text.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2 ** 32 < HELDOUT_TEXT_SHARE


def announcements(n: int, seed: int, heldout: bool) -> list[dict]:
    """``n`` distinct sentences of the held-out (or the train) side of the split."""
    rng = random.Random(seed)
    seen, out = set(), []
    for _ in range(n * 50):
        s = announcement(rng)
        if s["text"] not in seen and is_heldout_announcement(s["text"]) == heldout:
            seen.add(s["text"])
            out.append(s)
            if len(out) == n:
                break
    return out
