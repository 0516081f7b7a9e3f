"""Frozen-encoder feature cache for training the CTC draft head (SSD).

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
import random
import time
from pathlib import Path

import numpy as np
import torch

from ..audio import SAMPLE_RATE, decode_audio
from ..models.whisper.adapter import SAMPLES_PER_STATE, WINDOW_SAMPLES, WhisperAdapter
from ..packing import pack_signals, plan_windows
from ..sources import read_bytes, read_jsonl_manifest
from ..timing import timed

SHARD_ROWS = 64
# Silence before a clip that joins a training window, drawn per clip (augmentation;
# inference packs with WhisperAdapter's fixed PACK_GAP_S, inside this range).
TRAIN_GAP_S = (0.1, 0.6)


def read_manifest(path: str | Path) -> list[dict]:
    """Training rows (pipeline.sources.read_jsonl_manifest): each line's own keys (``text``,
    ``split``, ``voice``, ...), ``audio`` resolved as the job resolves it, and
    ``audio_path``, the audio path joined to the manifest's folder as written. Shard names,
    and through them the packing order and gaps, are made from ``audio_path``: resolving it
    would re-encode, and re-pack differently, every cached shard."""
    path = Path(path)
    rows = []
    for row in read_jsonl_manifest(str(path), keep_item=True):
        item = row.pop("item")
        audio = Path(item.get("audio", item.get("audio_filepath")))
        rows.append(item | row | {"audio_path": str(audio if audio.is_absolute() else path.parent / audio)})
    return rows


def _shard_name(rows: list[dict], pack: bool) -> str:
    digest = hashlib.sha1(("packed-v2\n" if pack else "").encode()
                          + "\n".join(r["id"] + "|" + r["audio_path"] for r in rows).encode())
    return f"shard-{digest.hexdigest()[:16]}"


def _load_audio(row: dict) -> np.ndarray:
    """16-kHz mono float32 as the job decodes it (pipeline.audio), cut to one window."""
    return decode_audio(read_bytes(row))[0][:WINDOW_SAMPLES]


def _encode(model, processor, signals: list[np.ndarray]) -> torch.Tensor:
    """Encoder states [B, 1500, D] of 16-kHz signals (one 30-s window each)."""
    param = next(model.parameters())
    x = processor.feature_extractor(signals, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    return model.model.encoder(x.to(param.device, param.dtype)).last_hidden_state


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
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        audios = [_load_audio(r) for r in chunk]
        states, secs = timed(_encode, model, processor, audios, device=device)
        enc_s += secs
        for r, a, s in zip(chunk, audios, states):
            valid = WhisperAdapter.valid_frames(len(a), s.shape[0])
            feats[r["id"]] = s[:valid].to("cpu", torch.float16).contiguous()
        if with_ar:
            texts, secs = timed(_ar_greedy, model, processor, states, device=device)
            ar_texts.update(zip((r["id"] for r in chunk), texts))
            ar_s += secs
    return feats, ar_texts, {"encoder_s": enc_s, "ar_decode_s": ar_s}


def plan_training_windows(lengths: list[int], seed_key: str, gap_s: tuple[float, float] = TRAIN_GAP_S):
    """The training windows of clips of these sample counts: ``(order, placements)``, the
    clips shuffled by ``seed_key`` and placed in that order by pipeline.packing.plan_windows
    on WhisperAdapter's window and state grid (as ``WhisperAdapter.plan_packing`` does),
    with a gap drawn uniformly from ``gap_s`` seconds per clip."""
    rng = random.Random(seed_key)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    gaps = [int(rng.uniform(*gap_s) * SAMPLE_RATE) for _ in order]
    return order, plan_windows([lengths[i] for i in order], WINDOW_SAMPLES, gaps, SAMPLES_PER_STATE)


@torch.inference_mode()
def encode_packed_shard(model, processor, rows: list[dict], seed_key: str, batch_size: int = 4,
                        gap_s: tuple[float, float] = TRAIN_GAP_S):
    """Pack the rows into 30-s windows (``plan_training_windows``: shuffled, random gaps,
    starts on the state grid; pipeline.packing.pack_signals: one peak level per window),
    encode each window once, and cut every utterance's frames out of it as
    ``WhisperAdapter.encode_packed`` does."""
    audios = [_load_audio(r) for r in rows]
    order, placements = plan_training_windows([len(a) for a in audios], seed_key, gap_s)
    signals = pack_signals([audios[i] for i in order], placements, WINDOW_SAMPLES)
    by_window: dict[int, list] = {}
    for i, p in zip(order, placements):
        by_window.setdefault(p.window, []).append((rows[i]["id"], p))
    feats, enc_s = {}, 0.0
    device = next(model.parameters()).device
    for w in range(0, len(signals), batch_size):
        states, secs = timed(_encode, model, processor, signals[w:w + batch_size], device=device)
        enc_s += secs
        for k, s in enumerate(states):
            for id_, p in by_window[w + k]:
                first = p.start // SAMPLES_PER_STATE
                n = min(s.shape[0] - first, WhisperAdapter.valid_frames(p.length, s.shape[0]))
                feats[id_] = s[first:first + n].to("cpu", torch.float16).contiguous()
    return feats, {"encoder_s": enc_s, "ar_decode_s": 0.0, "windows": len(signals)}


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
            from ..models.whisper.loader import load_whisper

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
