"""`shardscribe bench audio-decode`: decode time of libsndfile (pipeline.audio's soundfile
path) against PyAV (pipeline.audio_av) on the formats both read (WAV, FLAC, MP3, OGG
Vorbis, Ogg Opus), and of soxr against FFmpeg's resampler (swresample) on 44.1 kHz to 16
kHz, on a few minutes of a shipped sample's speech repeated. pipeline.audio decodes each
format with the faster backend (pipeline.audio.ffmpeg_first: MP3 and Ogg Opus through
FFmpeg), Ogg Vorbis excepted, and resamples with soxr; these figures are why.

Each figure is the best of ``--repeats`` runs of the whole file, in seconds, and the ratio
is PyAV's time over libsndfile's (above 1: libsndfile is faster), measured in the same run.
"""
from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np

SAMPLE = Path(__file__).resolve().parents[2] / "pipeline" / "assets" / "samples" / "weather_flite_awb_stereo44k.flac"
# soundfile's format and subtype for each container both backends read
FORMATS = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
           "ogg": ("OGG", "VORBIS"), "opus": ("OGG", "OPUS")}


def add_arguments(parser) -> None:
    parser.add_argument("--seconds", type=float, default=180.0, help="length of the decoded file")
    parser.add_argument("--repeats", type=int, default=3)


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _speech(seconds: float) -> tuple[np.ndarray, int]:
    import soundfile as sf

    clip, rate = sf.read(SAMPLE, dtype="float32", always_2d=True)
    reps = int(np.ceil(seconds * rate / len(clip)))
    return np.tile(clip, (reps, 1))[:int(seconds * rate)], rate


def _swr(mono: np.ndarray, rate: int) -> np.ndarray:
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=16000)
    out = []
    for i in range(0, len(mono), 4096):
        frame = av.AudioFrame.from_ndarray(mono[None, i:i + 4096], format="flt", layout="mono")
        frame.sample_rate = rate
        out += [f.to_ndarray()[0] for f in resampler.resample(frame)]
    out += [f.to_ndarray()[0] for f in resampler.resample(None)]
    return np.concatenate(out)


def run(args) -> dict:
    import soundfile as sf
    import soxr

    from unittest import mock

    from ...pipeline import audio as decoders
    from ...pipeline.audio_av import iter_av_blocks

    def sndfile(data: bytes) -> None:
        # pipeline.audio's own path, with its FFmpeg-first rule off: libsndfile decodes
        with mock.patch.object(decoders, "ffmpeg_first", lambda head: False):
            decoders.decode_stream(io.BytesIO(data))

    def pyav(data: bytes) -> None:
        for _ in iter_av_blocks(io.BytesIO(data)):
            pass

    seconds = 30.0 if args.quick else args.seconds
    audio, rate = _speech(seconds)
    rows = []
    for name, (fmt, subtype) in FORMATS.items():
        buf = io.BytesIO()
        # written a second at a time: libsndfile's Vorbis writer crashes on one long write
        with sf.SoundFile(buf, "w", 48000 if name == "opus" else rate, audio.shape[1], subtype, format=fmt) as out:
            for i in range(0, len(audio), rate):
                out.write(audio[i:i + rate])
        data = buf.getvalue()
        t_sndfile = _best(lambda: sndfile(data), args.repeats)
        t_pyav = _best(lambda: pyav(data), args.repeats)
        rows.append({"format": name, "audio_s": seconds, "libsndfile_s": t_sndfile, "pyav_s": t_pyav,
                     "pyav_over_libsndfile": t_pyav / t_sndfile})
    mono = audio.mean(axis=1).astype(np.float32)
    want = soxr.resample(mono, rate, 16000, quality="HQ")
    t_soxr = _best(lambda: soxr.resample(mono, rate, 16000, quality="HQ"), args.repeats)
    t_swr = _best(lambda: _swr(mono, rate), args.repeats)
    got = _swr(mono, rate)
    n = min(len(got), len(want))
    # swresample's output is delayed against soxr's by its filter's half length: compare aligned
    lag = int(np.argmax(np.correlate(got[:16000], want[:16000], "full"))) - 15999
    a, b = (got[lag:lag + n - abs(lag)], want[:n - abs(lag)]) if lag >= 0 else (got[:n + lag], want[-lag:n])
    rows.append({"format": "resample 44.1k->16k", "audio_s": seconds, "libsndfile_s": t_soxr, "pyav_s": t_swr,
                 "pyav_over_libsndfile": t_swr / t_soxr,
                 "max_abs_diff": float(np.abs(a - b).max()) if len(a) else None})
    return {"rows": rows, "summary": {"pyav_faster": [r["format"] for r in rows if r["pyav_over_libsndfile"] < 1]}}
