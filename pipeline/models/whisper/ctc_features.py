"""Frozen-encoder feature cache for training the CTC draft head (SSD, seed 000).

The SSD paper keeps its CTC encoder frozen; so do we, which means the Whisper encoder runs
once per utterance and its states are cached: only the valid frames (ceil(samples / 320)
of the 1500 a 30-s window yields) in fp16, in shards of rows keyed by the shard's ids, so
a longer manifest with the same leading rows reuses every finished shard. For evaluation
rows the same encoder pass also yields Whisper's own greedy AR transcript (the reference
the draft is compared with), so held-out utterances are never encoded twice.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

SAMPLES_PER_STATE = 320
SHARD_ROWS = 64


def read_manifest(path: str | Path) -> list[dict]:
    path = Path(path)
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            audio = Path(row["audio"])
            row["audio_path"] = str(audio if audio.is_absolute() else path.parent / audio)
            rows.append(row)
    return rows


def _shard_name(rows: list[dict], pack: bool) -> str:
    digest = hashlib.sha1(("packed-v2\n" if pack else "").encode()
                          + "\n".join(r["id"] + "|" + r["audio_path"] for r in rows).encode())
    return f"shard-{digest.hexdigest()[:16]}"


def _load_audio(path: str) -> np.ndarray:
    import soundfile as sf
    import soxr

    audio, sr = sf.read(path, dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if sr != 16000:
        audio = soxr.resample(audio, sr, 16000).astype(np.float32)
    return audio[: 30 * 16000]


@torch.inference_mode()
def _ar_greedy(model, processor, states: torch.Tensor) -> list[str]:
    from transformers.modeling_outputs import BaseModelOutput

    out = model.generate(encoder_outputs=BaseModelOutput(last_hidden_state=states),
                         max_new_tokens=200, do_sample=False, num_beams=1)
    return [t.strip() for t in processor.batch_decode(out, skip_special_tokens=True)]


@torch.inference_mode()
def encode_shard(model, processor, rows: list[dict], with_ar: bool, batch_size: int = 8):
    """Valid-frame encoder states (fp16) per row, and AR texts when asked."""
    feats, ar_texts, enc_s, ar_s = {}, {}, 0.0, 0.0
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        audios = [_load_audio(r["audio_path"]) for r in chunk]
        t0 = time.perf_counter()
        x = processor.feature_extractor(audios, sampling_rate=16000,
                                        return_tensors="pt").input_features
        states = model.model.encoder(x.to(device, dtype)).last_hidden_state
        enc_s += time.perf_counter() - t0
        for r, a, s in zip(chunk, audios, states):
            valid = min(s.shape[0], max(1, math.ceil(len(a) / SAMPLES_PER_STATE)))
            feats[r["id"]] = s[:valid].to("cpu", torch.float16).contiguous()
        if with_ar:
            t0 = time.perf_counter()
            for r, text in zip(chunk, _ar_greedy(model, processor, states)):
                ar_texts[r["id"]] = text
            ar_s += time.perf_counter() - t0
    return feats, ar_texts, {"encoder_s": enc_s, "ar_decode_s": ar_s}


@torch.inference_mode()
def encode_packed_shard(model, processor, rows: list[dict], seed_key: str,
                        window: int = 30 * 16000, batch_size: int = 4):
    """Pack the rows into 30-s windows (shuffled, 0.1-0.6 s silences, starts on the state
    grid, one peak level per window), encode each window once, and cut every utterance's
    frames out of it."""
    import random

    rng = random.Random(seed_key)
    order = list(range(len(rows)))
    rng.shuffle(order)
    audios = {i: _load_audio(rows[i]["audio_path"]) for i in order}
    windows, current, used = [], [], 0
    for i in order:
        # Starts on the 320-sample state grid, as a clip alone starts at sample 0.
        gap = -(-int(rng.uniform(0.1, 0.6) * 16000) // SAMPLES_PER_STATE) * SAMPLES_PER_STATE
        gap = gap if current else 0
        used = -(-used // SAMPLES_PER_STATE) * SAMPLES_PER_STATE
        if current and used + gap + len(audios[i]) > window:
            windows.append(current)
            current, used, gap = [], 0, 0
        current.append((i, used + gap))
        used += gap + len(audios[i])
    if current:
        windows.append(current)
    feats, enc_s = {}, 0.0
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    for w in range(0, len(windows), batch_size):
        group = windows[w:w + batch_size]
        signals = []
        for win in group:
            sig = np.zeros(window, np.float32)
            # Whisper's log-mel floor is (window max - 8): a quiet clip beside a loud one
            # would lose its low-level detail, so every clip of a window gets the peak level
            # of its first clip (levels still vary from window to window).
            level = float(np.abs(audios[win[0][0]]).max()) or 1.0
            for i, start in win:
                a = audios[i] * (level / (float(np.abs(audios[i]).max()) or 1.0))
                sig[start:start + len(a)] = a
            signals.append(sig)
        t0 = time.perf_counter()
        x = processor.feature_extractor(signals, sampling_rate=16000,
                                        return_tensors="pt").input_features
        states = model.model.encoder(x.to(device, dtype)).last_hidden_state
        enc_s += time.perf_counter() - t0
        for win, s in zip(group, states):
            for i, start in win:
                a = start // SAMPLES_PER_STATE
                b = min(s.shape[0], math.ceil((start + len(audios[i])) / SAMPLES_PER_STATE))
                feats[rows[i]["id"]] = s[a:b].to("cpu", torch.float16).contiguous()
    return feats, {"encoder_s": enc_s, "ar_decode_s": 0.0, "windows": len(windows)}


def cache_features(manifest: str | Path, cache_dir: str | Path, device: str = "cpu",
                   with_ar: bool | None = None, pack: bool = False, limit: int | None = None,
                   log=print) -> list[Path]:
    """Encode every row of ``manifest`` not yet cached; returns the shard paths in order.

    ``with_ar``: also store Whisper's greedy AR text (default: for non-train rows).
    ``limit``: only the first rows (the shards they fill are the full run's shards)."""
    from safetensors.torch import save_file

    rows = read_manifest(manifest)[:limit]
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    shards = [rows[i:i + SHARD_ROWS] for i in range(0, len(rows), SHARD_ROWS)]
    paths, model, processor = [], None, None
    for k, shard in enumerate(shards):
        path = cache_dir / (_shard_name(shard, pack) + ".safetensors")
        paths.append(path)
        if path.exists():
            continue
        if model is None:
            from pipeline.models.whisper.loader import load_whisper

            model, processor = load_whisper(device=device)
        ar = with_ar if with_ar is not None else any(r.get("split", "train") != "train" for r in shard)
        t0 = time.perf_counter()
        if pack:
            feats, timing = encode_packed_shard(model, processor, shard, _shard_name(shard, True))
            ar_texts = {}
        else:
            feats, ar_texts, timing = encode_shard(model, processor, shard, ar)
        meta = [{"id": r["id"], "text": r["text"], "split": r.get("split", "train"),
                 "voice": r.get("voice", ""), "domain": r.get("domain", ""),
                 "duration": r.get("duration"), "ar_text": ar_texts.get(r["id"])}
                for r in shard]
        tmp = path.with_suffix(".tmp")
        save_file(feats, str(tmp), metadata={"rows": json.dumps(meta), "timing": json.dumps(timing)})
        tmp.rename(path)
        log(f"features: shard {k + 1}/{len(shards)} ({len(shard)} rows) in "
            f"{time.perf_counter() - t0:.1f} s (encoder {timing['encoder_s']:.1f} s, "
            f"AR {timing['ar_decode_s']:.1f} s)")
    return paths


def load_cached(paths: list[Path]) -> list[dict]:
    """Rows with their ``states`` [T, D] fp16 tensor and metadata."""
    from safetensors import safe_open

    out = []
    for path in paths:
        with safe_open(str(path), framework="pt") as fh:
            meta = json.loads(fh.metadata()["rows"])
            for m in meta:
                out.append(m | {"states": fh.get_tensor(m["id"])})
    return out
