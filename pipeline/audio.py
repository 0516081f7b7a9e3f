"""Audio decoding to 16 kHz mono float32: soundfile (libsndfile) + soxr resampling.

Every failure raises AudioError with a message a user can act on; the pipeline turns it
into one output row with that `error`, so a bad file never stops a job.
"""
from __future__ import annotations

import io

import numpy as np
import soundfile as sf
import soxr

SAMPLE_RATE = 16000


class AudioError(ValueError):
    """The bytes are not decodable audio (or hold no samples)."""


def _libsndfile_reason(exc: "sf.LibsndfileError") -> str:
    reason = getattr(exc, "error_string", "") or str(exc)
    # libsndfile says "not a regular file" when it recognises no container in memory.
    if "regular file" in reason or "not recognised" in reason.lower():
        return "unrecognised or corrupt audio format"
    return reason


def decode_audio(data: bytes | None, quality: str = "HQ") -> tuple[np.ndarray, int, int]:
    """Decode bytes of WAV/FLAC/OGG/MP3 to mono float32 at 16 kHz.

    Returns ``(samples, original_rate, original_channels)``.
    """
    if data is None:
        raise AudioError("no audio bytes (the file could not be read)")
    if len(data) == 0:
        raise AudioError("empty file (0 bytes)")
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels = f.samplerate, f.channels
            samples = f.read(dtype="float32", always_2d=True)
    except sf.LibsndfileError as exc:
        raise AudioError(f"cannot decode audio: {_libsndfile_reason(exc)}") from None
    except (RuntimeError, TypeError, ValueError) as exc:
        raise AudioError(f"cannot decode audio: {exc}") from None
    if samples.shape[0] == 0:
        raise AudioError("audio has zero samples")
    mono = samples.mean(axis=1) if channels > 1 else samples[:, 0]
    if not np.isfinite(mono).all():
        raise AudioError("audio contains NaN or infinite samples")
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality=quality)
    return np.ascontiguousarray(mono, dtype=np.float32), rate, channels
