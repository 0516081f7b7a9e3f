"""What the benchmarks (jobs/bench/*.py) share, so that none of them imports another:

- held-out audio: a manifest's recordings, decoded and segmented exactly as the job does
  it, with their references (default: the bundled samples; pipeline.heldout, which
  `shardscribe calibrate` reads too);
- held-out text and simulated CTC posteriors (bench ctc-beam's default input), key
  phrases for boosting;
- timing: the fastest of several runs, and contenders timed in turn
  (pipeline.timing.timed underneath: the device is synchronised around each run).

Metrics (WER, phrase F-score) live in pipeline.metrics. This module is not a benchmark
itself: jobs/bench/__init__.py lists it in ``SHARED``, so `shardscribe bench` does not
offer it as one.
"""
from __future__ import annotations

from pathlib import Path

from ...pipeline.heldout import DEFAULT_MANIFEST, load_recordings  # noqa: F401 (the benchmarks' held-out audio)


def flat_segments(recordings: list[list]) -> tuple[list[tuple[int, object]], float]:
    """Every segment as (recording index, 16-kHz audio), in order, and their total seconds."""
    from ...pipeline.audio import SAMPLE_RATE

    flat = [(r, a) for r, segs in enumerate(recordings) for a in segs]
    return flat, sum(len(a) for _, a in flat) / SAMPLE_RATE


def join_by_recording(flat_index: list[tuple[int, object]], seg_texts: list[str], n_recordings: int) -> list[str]:
    """Segment texts (in ``flat_index`` order of (recording, segment)) joined per recording."""
    out: list[list[str]] = [[] for _ in range(n_recordings)]
    for (r, _), text in zip(flat_index, seg_texts):
        if text:
            out[r].append(text)
    return [" ".join(x) for x in out]


def concat_long_form(recordings: list[list], refs: list[str], target_s: float, gap_s: float = 0.4):
    """Long-form inputs from short ones: consecutive single-segment recordings joined with
    short silences into segments of up to ``target_s`` (references joined likewise), so the
    decoder's share of the work is what it is on near-30-s segments."""
    import numpy as np

    from ...pipeline.audio import SAMPLE_RATE

    gap = np.zeros(int(gap_s * SAMPLE_RATE), dtype=np.float32)
    limit = int(target_s * SAMPLE_RATE)
    out_audio, out_refs, cur, cur_refs = [], [], [], []
    for segs, ref in zip(recordings, refs):
        for seg in segs:
            size = sum(len(c) + len(gap) for c in cur)
            if cur and size + len(seg) > limit:
                out_audio.append([np.concatenate([x for c in cur for x in (c, gap)])[:-len(gap)]])
                out_refs.append(" ".join(cur_refs))
                cur, cur_refs = [], []
            cur.append(np.asarray(seg, dtype=np.float32))
        cur_refs.append(ref)
    if cur:
        out_audio.append([np.concatenate([x for c in cur for x in (c, gap)])[:-len(gap)]])
        out_refs.append(" ".join(cur_refs))
    return out_audio, out_refs


def write_long_form(manifest: str, target_s: float, folder: str, limit: int = 0) -> str:
    """:func:`concat_long_form` over a manifest's recordings, written as 16-bit WAVs and a
    JSONL manifest (with the joined references) under ``folder``; returns its path. The
    job then reads them as it reads any file, so every engine sees the same long inputs."""
    import json
    from pathlib import Path

    import soundfile as sf

    from ...pipeline.audio import SAMPLE_RATE

    recordings, refs = load_recordings(manifest, limit)
    audio, joined = concat_long_form(recordings, refs, target_s)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (segs, ref) in enumerate(zip(audio, joined)):
        path = out / f"long_{i:04d}.wav"
        sf.write(str(path), segs[0], SAMPLE_RATE, subtype="PCM_16")
        lines.append(json.dumps({"id": path.stem, "audio": str(path), "text": ref}) + "\n")
    target = out / "long_form.jsonl"
    target.write_text("".join(lines))
    return str(target)


# ------------------------------------------------------------- held-out text, posteriors
def read_lm_text(path: str) -> list[str]:
    """LM training sentences: a text file's lines, or the ``text`` of a JSONL manifest's rows."""
    import json

    from ...pipeline.lm.build import read_lines

    lines = read_lines([path])
    if path.endswith(".jsonl"):
        return [json.loads(ln)["text"] for ln in lines if json.loads(ln).get("text")]
    return lines


def split_text(seed: int):
    """Held-out and LM-training sentences (every 10th sentence is held out)."""
    from ...pipeline.training.sample_text import pydoc_sentences

    sentences = [s for s in pydoc_sentences(min_chars=20, max_chars=110)]
    held = [s for i, s in enumerate(sentences) if i % 10 == seed % 10]
    train = [s for i, s in enumerate(sentences) if i % 10 != seed % 10]
    return held, train


def pad_log_probs(rows):
    """Per-utterance log-probs [T_i, V] -> ([N, T_max, V], lengths [N]); padded frames are
    certain blanks (0 on the blank, -inf elsewhere)."""
    import torch

    lengths = torch.tensor([r.shape[0] for r in rows])
    out = torch.full((len(rows), int(lengths.max()), rows[0].shape[1]), float("-inf"))
    out[:, :, 0] = 0.0
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out, lengths


def _ctc_alignment(rng, ids: list[int]) -> list[int]:
    """Frame labels for token ``ids``: 0-2 blanks before each token (at least one between
    a doubled token, as in any real CTC alignment), each token on 1-2 frames."""
    labels, prev = [], 0
    for c in ids:
        labels += [0] * int(rng.integers(1 if c == prev else 0, 3)) + [c] * int(rng.integers(1, 3))
        prev = c
    return labels


def simulate_log_probs(texts: list[str], seed: int):
    """Noisy CTC posteriors [N, T, 96] over pipeline.text.charset for ``texts``: 1-2 frames
    per character and 0-2 blank frames between them, noisy logits, and a competing
    character on a share of the frames (case flips, neighbouring letters, random
    characters) that sometimes wins."""
    import numpy as np
    import torch

    from ...pipeline.text import charset

    rng = np.random.default_rng(seed)
    v1 = charset.NUM_CLASSES
    letters = [charset.encode(c)[0] for c in "abcdefghijklmnopqrstuvwxyz"]
    rows = []
    for text in texts:
        labels = _ctc_alignment(rng, charset.encode(text))
        labels += [0] * int(rng.integers(1, 3))
        t = len(labels)
        logits = rng.normal(0.0, 1.0, size=(t, v1))
        for i, y in enumerate(labels):
            logits[i, y] += rng.normal(8.0, 2.0) if y != 0 else rng.normal(9.0, 1.5)
            if y != 0 and rng.random() < 0.25:
                ch = charset.CHARS[y - 1]
                roll = rng.random()
                if ch.isalpha() and roll < 0.2:
                    rival = charset.encode(ch.swapcase())[0]
                elif ch.isalpha() and roll < 0.6:
                    rival = letters[(letters.index(charset.encode(ch.lower())[0]) + int(rng.choice([-1, 1]))) % 26]
                else:
                    rival = int(rng.choice(letters))
                logits[i, rival] = logits[i, y] + rng.normal(-0.5, 1.5)
        rows.append(torch.log_softmax(torch.tensor(logits, dtype=torch.float32), -1))
    return pad_log_probs(rows)


def simulate_token_log_probs(n: int, vocab: int, seed: int, tokens_per_utt: int = 50):
    """Like ``simulate_log_probs`` over a BPE-sized vocabulary with random token strings
    (no text, no LM): for FLToP's large-vocabulary regime (the FlexCTC paper uses 1024 BPE)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    rows, truths = [], []
    for _ in range(n):
        truth = rng.integers(1, vocab + 1, size=tokens_per_utt).tolist()
        labels = _ctc_alignment(rng, truth)
        logits = rng.normal(0.0, 1.0, size=(len(labels), vocab + 1))
        for i, y in enumerate(labels):
            logits[i, y] += rng.normal(9.0, 1.5) if y else rng.normal(10.0, 1.0)
            if y and rng.random() < 0.25:
                logits[i, int(rng.integers(1, vocab + 1))] = logits[i, y] + rng.normal(-0.5, 1.5)
        rows.append(torch.log_softmax(torch.tensor(logits, dtype=torch.float32), -1))
        truths.append(truth)
    return (*pad_log_probs(rows), truths)


# ------------------------------------------------------------------------- key phrases
def key_phrases(held: list[str], train: list[str], count: int) -> list[str]:
    """Words of the held-out text that the LM text has at most once (the domain terms a
    user would boost), then rare training words as distractors, ``count`` in all."""
    import re
    from collections import Counter

    word = re.compile(r"[A-Za-z][A-Za-z_]{4,}")
    train_counts = Counter(w for s in train for w in word.findall(s))
    held_words = [w for w, _ in Counter(w for s in held for w in word.findall(s)).most_common()]
    phrases = [w for w in held_words if train_counts[w] <= 1]
    for w, n in sorted(train_counts.items(), key=lambda x: (x[1], x[0])):
        if len(phrases) >= count:
            break
        if w not in phrases:
            phrases.append(w)
    return phrases[:count]


def domain_phrases(count: int = 100) -> list[str]:
    """Key phrases of the maintenance domain (pipeline.training.tts.domain_text): equipment, places,
    people, days, actions, faults, measured quantities and units."""
    from ...pipeline.training.tts import domain_text as d

    out = d.EQUIPMENT + d.PLACES + d.PEOPLE + d.DAYS + d.ACTIONS + d.FAULTS
    out += sorted({m[0] for m in d.MEASURES} | {m[1] for m in d.MEASURES if m[1] != "%"})
    return list(dict.fromkeys(out))[:count]


# ------------------------------------------------------------------------------ timing
def best_of(reps: int, fn):
    """Output and the fastest of ``reps`` timed runs (other jobs share this machine)."""
    from ...pipeline.timing import timed

    best = None
    for _ in range(reps):
        out, secs = timed(fn)
        best = secs if best is None else min(best, secs)
    return out, best


def interleaved_ms_per_utt(contenders: dict, rounds: int) -> dict:
    """Fastest ms/utterance of each ``name: (utterances, fn)``, the contenders run in turn
    for ``rounds`` rounds after one warm-up round."""
    from ...pipeline.timing import timed

    best = {}
    for r in range(rounds + 1):
        for name, (_, fn) in contenders.items():
            _, secs = timed(fn)
            if r:
                best[name] = min(best.get(name, secs), secs)
    return {name: 1000.0 * best[name] / contenders[name][0] for name in contenders}


# ------------------------------------------------------------------ held-out TTS speech
def heldout_voice_speech(items: list[dict], seed: int) -> list:
    """Each ``{"text", "spoken"}`` item said by a held-out voice of the synthetic corpus
    (pipeline.training.tts.corpus: voices the CTC head never heard), 16-kHz float32, unaugmented;
    an item the engine fails on is left out (its index is missing from the result's
    ``(index, audio)`` pairs)."""
    import random
    import subprocess

    from ...pipeline.training.tts.corpus import sample_voice
    from ...pipeline.training.tts.engines import synthesize

    rng = random.Random(seed)
    out = []
    for i, item in enumerate(items):
        voice = sample_voice(rng, heldout=True)
        try:
            out.append((i, synthesize(voice, item["spoken"])))
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
            continue
    return out


def save_figure(fig, path: str, dpi: int) -> None:
    """Lay out ``fig``, write it to ``path`` (its folder created) and free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
