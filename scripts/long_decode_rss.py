"""Peak RSS of decoding one long recording to 16-kHz mono: the whole-bytes path
(pipeline.audio.decode_audio over the file's bytes) against the block-by-block path the
prepare stage uses (pipeline.audio.decode_stream over the open file). Not run in CI.

    PYTHONPATH=. .venv/bin/python scripts/long_decode_rss.py --work /tmp/long [--minutes 60]

Writes a 44.1-kHz stereo 16-bit WAV of that length once, then decodes it in a fresh child
process per path and prints one JSON line each: the child's peak RSS above its RSS
before decoding, and the 16-kHz result's own size (the floor for both paths: a prepared
row carries the whole recording's segments).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import json, resource, sys
from pipeline.audio import decode_audio, decode_stream
def rss_mb():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS")) / 1024
path, mode = sys.argv[1], sys.argv[2]
base = rss_mb()
if mode == "whole":
    with open(path, "rb") as fh:
        samples = decode_audio(fh.read())[0]
else:
    with open(path, "rb") as fh:
        samples = decode_stream(fh)[0]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"mode": mode, "peak_above_start_mb": round(peak - base, 1),
                  "result_mb": round(samples.nbytes / 2**20, 1)}))
"""


def write_wav(path: Path, minutes: float) -> None:
    import soundfile as sf

    rate = 44100
    rng = np.random.default_rng(0)
    with sf.SoundFile(path, "w", rate, 2, subtype="PCM_16", format="WAV") as f:
        for _ in range(int(minutes * 60 / 10)):
            block = rng.normal(0, 0.05, (rate * 10, 2)).astype(np.float32)
            f.write(block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--minutes", type=float, default=60.0)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"long_{args.minutes:g}min_44k_stereo.wav"
    if not path.exists():
        write_wav(path, args.minutes)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for mode in ("whole", "stream"):
        out = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        print(json.dumps({"file_mb": round(path.stat().st_size / 2**20, 1), "minutes": args.minutes, **result}))


if __name__ == "__main__":
    main()
