"""Text-to-speech engines Debian ships (espeak-ng, flite, festival), behind one call.

Not a paper algorithm: this renders the synthetic training speech for the CTC draft head
that self-speculative decoding ("Self-Speculative Decoding for LLM-based ASR with CTC
Encoder Drafts", eq. 3) gates on. Every engine runs as a subprocess with list arguments
(never a shell); text goes through stdin or a temporary file, so no transcript is ever
parsed as an option. Output is mono float32 at 16 kHz.
"""
from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
from ...audio import SAMPLE_RATE


# espeak-ng English dialects and voice variants (files under espeak-ng-data/voices/!v).
ESPEAK_DIALECTS = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan",
                   "en-gb-x-gbcwmd", "en-029"]
ESPEAK_VARIANTS = ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5",
                   "klatt", "klatt2", "klatt3", "klatt4", "croak", "whisperf", "Alex",
                   "andrea", "Andy", "annie", "antonio", "aunty", "belinda", "benjamin",
                   "boris", "david", "edward", "grandma", "grandpa", "john", "linda",
                   "max", "michel", "norbert", "paul", "robert", "steph", "travis", "zac"]
FLITE_VOICES = ["kal", "kal16", "awb", "rms", "slt"]
FESTIVAL_VOICES = ["kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts"]


@dataclass(frozen=True)
class Voice:
    """One speaking voice: engine + voice name + prosody settings."""

    engine: str                  # "espeak-ng" | "flite" | "festival"
    name: str                    # engine voice ("en-us+f3", "slt", "kal_diphone")
    rate: float = 1.0            # speaking-rate factor (espeak words/min, festival stretch)
    pitch: int = 50              # espeak pitch 0..99
    extra: tuple = field(default=())

    @property
    def family(self) -> str:
        """Voice identity without prosody: the unit voices are held out by."""
        return f"{self.engine}:{self.name}"

    @property
    def label(self) -> str:
        return f"{self.family}:r{self.rate:.2f}:p{self.pitch}"


def _read_16k(path: Path) -> np.ndarray:
    import soxr

    audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if sr != SAMPLE_RATE:
        audio = soxr.resample(audio, sr, SAMPLE_RATE).astype(np.float32)
    return audio


def _run(cmd: list[str], stdin: bytes | None = None, timeout: float = 60.0) -> None:
    proc = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr[-400:]!r}")


def synthesize(voice: Voice, text: str, workdir: str | Path | None = None) -> np.ndarray:
    """Speak ``text`` with ``voice``; returns mono float32 samples at 16 kHz."""
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        wav, txt = tmp / "out.wav", tmp / "in.txt"
        txt.write_text(text + "\n", encoding="utf-8")
        if voice.engine == "espeak-ng":
            wpm = str(int(round(165 * voice.rate)))
            _run(["espeak-ng", "-v", voice.name, "-s", wpm, "-p", str(voice.pitch),
                  "-w", str(wav), "-f", str(txt)])
        elif voice.engine == "flite":
            # flite's duration_stretch is inverse speed.
            _run(["flite", "-voice", voice.name, "--setf",
                  f"duration_stretch={1.0 / voice.rate:.3f}", "-f", str(txt), "-o", str(wav)])
        elif voice.engine == "festival":
            scm = tmp / "cfg.scm"
            scm.write_text(f"(voice_{voice.name})\n"
                           f"(Parameter.set 'Duration_Stretch {1.0 / voice.rate:.3f})\n")
            _run(["text2wave", "-eval", str(scm), str(txt), "-o", str(wav)], timeout=120)
        else:
            raise ValueError(f"unknown TTS engine {voice.engine!r}")
        return _read_16k(wav)


def available_espeak_variants() -> list[str]:
    """The espeak-ng voice variants installed here (from ESPEAK_VARIANTS)."""
    out = subprocess.run(["espeak-ng", "--voices=variant"], capture_output=True, text=True,
                         check=False).stdout
    # Column 5 is the variant file ("!v/m1"); its basename is what "-v en-us+m1" takes.
    installed = {line.split()[4].split("/")[-1].lower()
                 for line in out.splitlines()[1:] if len(line.split()) > 4}
    return [v for v in ESPEAK_VARIANTS if v.lower() in installed]


def available_flite_voices() -> list[str]:
    out = subprocess.run(["flite", "-lv"], capture_output=True, text=True, check=False).stdout
    names = set(out.split(":", 1)[-1].split())
    return [v for v in FLITE_VOICES if v in names]


def available_festival_voices() -> list[str]:
    roots = [Path("/usr/share/festival/voices")]
    found = {p.name for r in roots if r.exists() for p in r.glob("*/*") if p.is_dir()}
    return [v for v in FESTIVAL_VOICES if v in found]
