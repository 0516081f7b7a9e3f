"""Render a synthetic speech corpus with held-out voices and held-out texts.

Not a paper algorithm: the training and evaluation data of the CTC draft head that
self-speculative decoding ("Self-Speculative Decoding for LLM-based ASR with CTC Encoder
Drafts", eq. 3) gates on. Output is a JSONL manifest in the project's input format
(``id``, ``audio`` relative to the manifest, ``text``) plus ``voice``, ``split`` (train /
heldout_voice / heldout_text), ``domain`` and the augmentation applied; one manifest per
split is written beside it so each feeds ``shardscribe transcribe``. Splits are decided by
stable hashes, so a text or voice is held out in every run and size.
"""
from __future__ import annotations

import hashlib
import json
import random
from functools import lru_cache
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from . import engines
from .augment import augment
from .domain_text import domain_sentences
from .text_sources import prose_sentences
from .engines import Voice

SPLITS = ("train", "heldout_voice", "heldout_text")
# Voice identities never used for training: one per engine plus four espeak-ng variants
# (in every dialect), so the held-out set spans all three synthesis methods.
HELDOUT_FLITE = {"awb"}
HELDOUT_FESTIVAL = {"ked_diphone"}
HELDOUT_ESPEAK_VARIANTS = {"f4", "m6", "steph", "klatt3"}
HELDOUT_TEXT_SHARE = 0.08


def _stable_unit(key: str) -> float:
    return int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF


def is_heldout_text(text: str) -> bool:
    return _stable_unit("text:" + text) < HELDOUT_TEXT_SHARE


def is_heldout_voice(voice: Voice) -> bool:
    if voice.engine == "flite":
        return voice.name in HELDOUT_FLITE
    if voice.engine == "festival":
        return voice.name in HELDOUT_FESTIVAL
    return voice.name.split("+")[-1] in HELDOUT_ESPEAK_VARIANTS


@lru_cache(maxsize=1)
def voice_families() -> dict[str, list[tuple[str, str]]]:
    """(engine, name) pairs installed here, per engine."""
    variants = engines.available_espeak_variants()
    return {
        "espeak-ng": [("espeak-ng", f"{d}+{v}") for d in engines.ESPEAK_DIALECTS for v in variants],
        "flite": [("flite", v) for v in engines.available_flite_voices()],
        "festival": [("festival", v) for v in engines.available_festival_voices()],
    }


# Share of utterances per engine: espeak-ng has the most voices, festival is the slowest.
ENGINE_WEIGHTS = {"espeak-ng": 0.45, "flite": 0.35, "festival": 0.20}


def sample_voice(rng: random.Random, heldout: bool) -> Voice:
    fams = voice_families()
    while True:
        engine = rng.choices(list(ENGINE_WEIGHTS), weights=list(ENGINE_WEIGHTS.values()))[0]
        if not fams[engine]:
            continue
        eng, name = rng.choice(fams[engine])
        voice = Voice(eng, name, rate=round(rng.uniform(0.85, 1.2), 2),
                      pitch=rng.randint(25, 75) if eng == "espeak-ng" else 50)
        if is_heldout_voice(voice) == heldout:
            return voice


@dataclass
class Job:
    id: str
    split: str
    domain: str
    text: str
    spoken: str
    voice: Voice
    augment: bool
    seed: int


def text_pool(seed: int, num_domain: int) -> list[dict]:
    items = []
    for source, sents in prose_sentences().items():
        items += [{"text": s, "spoken": s, "domain": source} for s in sents]
    items += [{"text": d["text"], "spoken": d["spoken"], "domain": "maintenance"}
              for d in domain_sentences(num_domain, seed)]
    return items


def plan_corpus(num: int, seed: int, num_heldout_voice: int, num_heldout_text: int,
                domain_share: float = 0.35, augment_share: float = 0.7) -> list[Job]:
    """Which text each utterance says, in which voice, in which split."""
    rng = random.Random(seed)
    pool = text_pool(seed, num_domain=max(200, int(num * domain_share * 1.5)))
    train_texts = [t for t in pool if not is_heldout_text(t["text"])]
    held_texts = [t for t in pool if is_heldout_text(t["text"])]

    def pick(texts: list[dict]) -> dict:
        want_domain = rng.random() < domain_share
        sub = [t for t in texts if (t["domain"] == "maintenance") == want_domain] or texts
        return rng.choice(sub)

    jobs = []
    counts = {"train": num - num_heldout_voice - num_heldout_text,
              "heldout_voice": num_heldout_voice, "heldout_text": num_heldout_text}
    for split, n in counts.items():
        texts = held_texts if split == "heldout_text" else train_texts
        for i in range(n):
            t = pick(texts)
            voice = sample_voice(rng, heldout=split == "heldout_voice")
            jobs.append(Job(id=f"{split}_{i:06d}", split=split, domain=t["domain"],
                            text=t["text"], spoken=t["spoken"], voice=voice,
                            augment=split == "train" and rng.random() < augment_share,
                            seed=rng.randrange(2 ** 31)))
    return jobs


def render(job: Job, out_dir: str) -> dict:
    """Synthesise, augment, write FLAC; returns the manifest row (``error`` on failure)."""
    rel = f"audio/{job.id}.flac"
    row = {"id": job.id, "audio": rel, "text": job.text, "voice": job.voice.label,
           "split": job.split, "domain": job.domain}
    try:
        audio = engines.synthesize(job.voice, job.spoken)
        rng = np.random.default_rng(job.seed)
        # Held-out sets get only silence padding and loudness, so their numbers measure
        # voices and texts, not noise.
        audio, applied = augment(audio, rng, strength=1.0 if job.augment else 0.0)
        if len(audio) > 30 * engines.SAMPLE_RATE:
            raise ValueError("longer than Whisper's 30-s window")
        sf.write(str(Path(out_dir) / rel), audio, engines.SAMPLE_RATE, format="FLAC",
                 subtype="PCM_16")
        row.update(duration=round(len(audio) / engines.SAMPLE_RATE, 3), augment=applied)
    except Exception as exc:  # a failed render is reported, never fatal for the corpus
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def make_corpus(out_dir: str | Path, num: int, seed: int = 0, num_heldout_voice: int = 150,
                num_heldout_text: int = 150, workers: int = 2, domain_share: float = 0.35,
                augment_share: float = 0.7) -> dict:
    out_dir = Path(out_dir)
    (out_dir / "audio").mkdir(parents=True, exist_ok=True)
    jobs = plan_corpus(num, seed, num_heldout_voice, num_heldout_text, domain_share, augment_share)
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        rows = list(pool.map(render, jobs, [str(out_dir)] * len(jobs), chunksize=8))
    ok = [r for r in rows if "error" not in r]
    failed = [r for r in rows if "error" in r]
    with open(out_dir / "manifest.jsonl", "w") as fh:
        for r in ok:
            fh.write(json.dumps(r) + "\n")
    for split in SPLITS:
        with open(out_dir / f"{split}.jsonl", "w") as fh:
            for r in ok:
                if r["split"] == split:
                    fh.write(json.dumps(r) + "\n")
    summary = {"num_rows": len(ok), "num_failed": len(failed),
               "failed": failed[:20],
               "per_split": {s: sum(r["split"] == s for r in ok) for s in SPLITS},
               "hours": round(sum(r["duration"] for r in ok) / 3600, 3),
               "voices": sorted({r["voice"].rsplit(":", 2)[0] for r in ok}),
               "seed": seed, "num": num}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
