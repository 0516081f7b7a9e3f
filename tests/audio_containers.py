"""Audio files of every container a user has, written with PyAV (FFmpeg's encoders) from
float samples: the inputs of the container tests and the decode benchmark."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

# extension -> (FFmpeg muxer, audio encoder, encoder rate)
CONTAINERS = {
    ".wav": ("wav", "pcm_s16le", 16000),
    ".flac": ("flac", "flac", 16000),
    ".mp3": ("mp3", "libmp3lame", 16000),
    ".ogg": ("ogg", "vorbis", 16000),
    ".opus": ("opus", "libopus", 48000),
    ".m4a": ("ipod", "aac", 16000),
    ".mp4": ("mp4", "aac", 16000),
    ".aac": ("adts", "aac", 16000),
    ".webm": ("webm", "libopus", 48000),
}


def _resample(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    import soxr

    return samples if rate == to else soxr.resample(samples, rate, to).astype(np.float32)


def _add_audio(container, codec: str, rate: int):
    stream = container.add_stream(codec, rate=rate)
    # FFmpeg's own Vorbis encoder is marked experimental and writes stereo only
    stream.layout = "stereo" if codec == "vorbis" else "mono"
    if codec == "vorbis":
        stream.codec_context.options = {"strict": "experimental"}
    return stream


def _write_audio(container, stream, samples: np.ndarray) -> None:
    ctx = stream.codec_context
    fmt = ctx.format.name
    size = ctx.frame_size or 1024
    data = np.clip(samples, -1.0, 1.0)
    if fmt.startswith("s16"):
        data = (data * 32767).astype(np.int16)
    elif fmt.startswith("s32"):
        data = (data * 2147483647).astype(np.int32)
    else:
        data = data.astype(np.float32)
    layout = stream.layout.name
    channels = stream.layout.nb_channels
    pts = 0
    for i in range(0, len(data), size):
        chunk = data[i:i + size]
        planes = np.repeat(chunk[None, :], channels, axis=0)
        planes = planes if ctx.format.is_planar else planes.T.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(planes), format=fmt, layout=layout)
        frame.sample_rate, frame.pts, frame.time_base = ctx.sample_rate, pts, Fraction(1, ctx.sample_rate)
        pts += len(chunk)
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)


def write_audio(path: Path, samples: np.ndarray, rate: int) -> Path:
    """``samples`` (mono float at ``rate``) as the container ``path``'s extension names."""
    muxer, codec, enc_rate = CONTAINERS[path.suffix]
    with av.open(str(path), "w", format=muxer) as container:
        stream = _add_audio(container, codec, enc_rate)
        _write_audio(container, stream, _resample(samples, rate, enc_rate))
    return path


def write_video(path: Path, samples: np.ndarray | None, rate: int, seconds: float = 1.0) -> Path:
    """An .mp4 of a small H.264 picture for ``seconds``, with ``samples`` as its AAC audio
    (the video stream first), or no audio stream at all where ``samples`` is None."""
    with av.open(str(path), "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=10)
        video.width, video.height, video.pix_fmt = 64, 48, "yuv420p"
        audio = _add_audio(container, "aac", 16000) if samples is not None else None
        frames = int(seconds * 10) if samples is None else int(np.ceil(len(samples) / rate * 10))
        for i in range(frames):
            picture = np.full((48, 64, 3), (i * 20) % 256, np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                container.mux(packet)
        for packet in video.encode(None):
            container.mux(packet)
        if audio is not None:
            _write_audio(container, audio, _resample(samples, rate, 16000))
    return path
