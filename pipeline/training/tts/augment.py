"""Cheap waveform augmentation for synthetic speech: speed, loudness, noise, room echo.

Not a paper algorithm: it widens the acoustic spread of TTS audio so the CTC draft head
(the draft model of "Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts")
does not learn one engine's exact waveform. The room impulse response is synthetic: a
direct path plus exponentially decaying noise with a random RT60 (the "stochastic tail"
model of late reverberation), which costs one FFT convolution.
"""
from __future__ import annotations

import numpy as np
from ...audio import SAMPLE_RATE



def change_speed(audio: np.ndarray, factor: float) -> np.ndarray:
    """Play ``factor`` times faster (pitch moves with it, like tape speed)."""
    import soxr

    if abs(factor - 1.0) < 1e-3:
        return audio
    return soxr.resample(audio, SAMPLE_RATE * factor, SAMPLE_RATE).astype(np.float32)


def set_loudness(audio: np.ndarray, peak_db: float) -> np.ndarray:
    peak = float(np.abs(audio).max()) or 1.0
    return (audio * (10 ** (peak_db / 20) / peak)).astype(np.float32)


def coloured_noise(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Noise with power ~ 1/f^exponent (0 white, 1 pink, 2 brown), unit RMS."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(len(spec), dtype=np.float64)
    f[0] = 1.0
    noise = np.fft.irfft(spec / f ** (exponent / 2), n)
    return (noise / (np.sqrt(np.mean(noise ** 2)) + 1e-12)).astype(np.float32)


def add_noise(audio: np.ndarray, rng: np.random.Generator, snr_db: float,
              exponent: float) -> np.ndarray:
    rms = float(np.sqrt(np.mean(audio ** 2))) + 1e-9
    noise = coloured_noise(rng, len(audio), exponent) * rms / 10 ** (snr_db / 20)
    return (audio + noise).astype(np.float32)


def synthetic_rir(rng: np.random.Generator, rt60: float, direct_ratio_db: float) -> np.ndarray:
    """Direct impulse + exponentially decaying Gaussian tail (60 dB down at ``rt60`` s)."""
    n = int(rt60 * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    tail = rng.standard_normal(n) * np.exp(-6.9078 * t / rt60)
    tail[: int(0.003 * SAMPLE_RATE)] = 0.0  # first reflections arrive after a few ms
    tail *= 10 ** (-direct_ratio_db / 20) / (np.sqrt(np.sum(tail ** 2)) + 1e-12)
    rir = tail
    rir[0] = 1.0
    return rir.astype(np.float32)


def reverberate(audio: np.ndarray, rir: np.ndarray) -> np.ndarray:
    n = len(audio) + len(rir) - 1
    size = 1 << (n - 1).bit_length()
    wet = np.fft.irfft(np.fft.rfft(audio, size) * np.fft.rfft(rir, size), size)[: len(audio)]
    return wet.astype(np.float32)


def augment(audio: np.ndarray, rng: np.random.Generator, strength: float = 1.0) -> tuple[np.ndarray, dict]:
    """Random chain of the augmentations above; returns the audio and what was applied."""
    applied: dict = {}
    if rng.random() < 0.5 * strength:
        applied["speed"] = round(float(rng.uniform(0.88, 1.12)), 3)
        audio = change_speed(audio, applied["speed"])
    if rng.random() < 0.35 * strength:
        applied["rt60"] = round(float(rng.uniform(0.15, 0.7)), 3)
        audio = reverberate(audio, synthetic_rir(rng, applied["rt60"], float(rng.uniform(0, 10))))
    if rng.random() < 0.5 * strength:
        applied["snr_db"] = round(float(rng.uniform(8, 35)), 1)
        applied["noise_exp"] = int(rng.integers(0, 3))
        audio = add_noise(audio, rng, applied["snr_db"], applied["noise_exp"])
    # Leading/trailing silence, as VAD segments have.
    lead, trail = (int(x) for x in rng.integers(0, int(0.4 * SAMPLE_RATE), size=2))
    audio = np.concatenate([np.zeros(lead, np.float32), audio, np.zeros(trail, np.float32)])
    applied["peak_db"] = round(float(rng.uniform(-25, -1)), 1)
    audio = set_loudness(audio, applied["peak_db"])
    return np.clip(audio, -1.0, 1.0).astype(np.float32), applied
