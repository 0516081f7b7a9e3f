"""Audio decoding through PyAV (FFmpeg's libraries): every container and codec FFmpeg reads
(MP4/M4A/AAC, WebM/Matroska, Opus, AMR, WMA, the audio stream of a video file, ...), to
16-kHz mono float32 blocks, resampled by soxr as pipeline.audio does.

pipeline.audio.iter_blocks hands a file here where libsndfile does not recognise its
container, where FFmpeg decodes it faster (`shardscribe bench
audio-decode`: MP3, Ogg Opus), or where ``audio.stream`` asks for a stream other than the first.
`iter_av_blocks` reads a file object packet by packet (FFmpeg reads it through the file
object's read/seek, so an fsspec file of s3:// or gs:// is read as it is decoded, never
whole) and yields blocks of at most ``BLOCK_SECONDS`` of 16-kHz audio: what one recording
costs in memory is one block, whatever its length.

The caps are pipeline.audio's: the stream's sample rate and channel count are checked
before any sample is decoded (check_header), a stream whose own header declares more than
``max_seconds`` is refused at once, and the count of decoded samples is the measure, so a
header that lies (or a stream that never ends) stops at ``max_seconds`` of audio; the
``deadline`` is checked between packets, so a file of a million tiny packets stops at it.

Errors are AudioError of pipeline.output.ERROR_KINDS: a container FFmpeg does not
recognise (random bytes, text) is ``corrupt`` as libsndfile's refusal is, a container or
codec it recognises but cannot decode, or a file without an audio stream (a silent video),
is ``unsupported`` and names the container or codec, damaged data is ``corrupt``.
"""
from __future__ import annotations

from collections.abc import Iterator

import av
import numpy as np
import soxr

from .audio_limits import (MAX_SECONDS, SAMPLE_RATE, UNRECOGNISED, AudioError, StreamInfo, check_deadline,
                           check_header, span_cut_short, too_long)
from .mp3_frames import LENGTH_TAGS

HEAD_BYTES = 4096      # where an MP3's length header is looked for (after an ID3 tag that fits)
# FFmpeg's demuxers whose length is an estimate from the bitrate unless a header gives it
# (raw elementary streams)
_ESTIMATED = frozenset({"mp3", "aac", "amr", "amrnb", "amrwb", "ac3", "eac3", "dts", "mp2", "truehd"})
BLOCK_SECONDS = 10.0   # source audio gathered before one resample and one yielded block
# The integer sample formats FFmpeg decodes to, and the divisor that puts them in [-1, 1).
_INT_SCALE = {"u8": 128.0, "s16": 32768.0, "s32": 2147483648.0, "s64": 9223372036854775808.0}


def _unsupported(what: str) -> AudioError:
    return AudioError(f"cannot decode audio: unsupported {what}", "unsupported")


def _corrupt(detail: str) -> AudioError:
    return AudioError(f"cannot decode audio: corrupt data inside the file ({detail})", "corrupt")


def _ffmpeg_reason(exc: av.FFmpegError) -> str:
    return (getattr(exc, "strerror", None) or str(exc)).rstrip(".")


def _mono(frame: av.AudioFrame) -> np.ndarray:
    """A decoded frame as mono float32 in [-1, 1): planar or packed, float or integer."""
    fmt = frame.format
    data = frame.to_ndarray()
    channels = frame.layout.nb_channels or 1
    if not fmt.is_planar:
        data = data.reshape(-1, channels).T
    base = fmt.name.rstrip("p")
    if base in _INT_SCALE:
        data = data.astype(np.float32)
        if base == "u8":
            data -= 128.0
        data *= np.float32(1.0 / _INT_SCALE[base])
    elif data.dtype != np.float32:
        data = data.astype(np.float32)
    return data.mean(axis=0, dtype=np.float32) if channels > 1 else np.ascontiguousarray(data[0])


def _pick_stream(container: av.container.InputContainer, index: int):
    audio = list(container.streams.audio)
    name = container.format.long_name or container.format.name
    if not audio:
        others = sorted({s.type for s in container.streams})
        raise _unsupported(f"file: no audio stream in this {name} container"
                           + (f" (it holds {', '.join(others)} only)" if others else ""))
    if index >= len(audio):
        raise _unsupported(f"audio.stream {index}: this {name} container has {len(audio)} audio "
                           f"stream{'s' if len(audio) > 1 else ''} (0..{len(audio) - 1})")
    stream = audio[index]
    ctx = stream.codec_context
    if ctx is None or ctx.codec is None or not ctx.codec.is_decoder:
        codec = f"codec {ctx.name!r}" if ctx is not None and ctx.name else "codec (one FFmpeg does not know)"
        raise _unsupported(f"{codec} in a {name} container: FFmpeg has no decoder for it")
    return stream


def _declared_seconds(stream, container, head: bytes) -> float | None:
    """The stream's length as its header declares it; None where it declares none, or where
    the length is FFmpeg's estimate from the bitrate (a raw elementary stream, an MP3
    without a Xing/Info/VBRI header): there the decoded samples are the only measure."""
    name = container.format.name
    if name in _ESTIMATED and not (name == "mp3" and any(tag in head for tag in LENGTH_TAGS)):
        return None
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return None


def iter_av_blocks(fh, quality: str = "HQ", offset_s: float | None = None, duration_s: float | None = None,
                   max_seconds: float = MAX_SECONDS, deadline: float | None = None, info: StreamInfo | None = None,
                   stream_index: int = 0) -> Iterator[np.ndarray]:
    """16-kHz mono float32 blocks of audio stream ``stream_index`` (0: the first) of the file
    object ``fh``, or of its span from ``offset_s`` for ``duration_s`` seconds, in order:
    pipeline.audio.iter_blocks' contract (``info`` filled as the stream is read, the blocks
    not scaled). Raises AudioError."""
    info = info if info is not None else StreamInfo()
    pos = fh.tell()
    head = fh.read(HEAD_BYTES)
    fh.seek(pos)
    try:
        container = av.open(fh, mode="r", metadata_errors="ignore")
    except av.InvalidDataError:
        raise AudioError(f"cannot decode audio: {UNRECOGNISED}", "corrupt") from None
    except av.FFmpegError as exc:
        raise AudioError(f"cannot decode audio: {_ffmpeg_reason(exc)}", "corrupt") from None
    with container:
        stream = _pick_stream(container, stream_index)
        ctx = stream.codec_context
        rate, channels = ctx.sample_rate, ctx.channels
        if not rate or not channels:    # FFmpeg found no frame that parses to give them
            raise _corrupt(f"{ctx.name}: no frame gives a sample rate and channel count")
        check_header(rate, channels)
        info.rate, info.channels = rate, channels
        declared = _declared_seconds(stream, container, head)
        start = offset_s or 0.0
        if declared is not None and start >= declared > 0:
            raise AudioError(f"offset {offset_s} s is at or past the end of the audio ({declared:.2f} s)", "missing")
        asked = None if declared is None else declared - start
        if duration_s is not None:
            asked = duration_s if asked is None else min(asked, duration_s)
        if asked is not None and asked > max_seconds:
            raise too_long(asked, max_seconds, "the header declares" if duration_s is None or asked < duration_s
                            else "the span asks for")
        if asked is not None:
            info.expected = int(np.ceil(asked * SAMPLE_RATE))
        end = None if duration_s is None else start + duration_s
        got = yield from _decode(container, stream, rate, quality, start, end, max_seconds, deadline, info)
        if declared is not None and span_cut_short(declared, start + got, offset_s, duration_s):
            raise AudioError(f"truncated or corrupt: decoded {got:.2f} s of the {declared - start:.2f} s "
                             "its header declares")


def _decode(container, stream, rate: int, quality: str, start: float, end: float | None,
            max_seconds: float, deadline: float | None, info: StreamInfo):
    """Yields the blocks; returns the seconds of source audio kept."""
    if start > 0:
        try:   # to the key frame before the offset; the frames' times trim the rest
            container.seek(int(start / stream.time_base), stream=stream)
        except av.FFmpegError:
            container.seek(0, stream=stream)
    pending: list[np.ndarray] = []
    held = 0                   # source samples in ``pending``
    pos = None                 # source sample index of the next decoded sample
    got = 0                    # source samples kept (within the span)
    done = False
    try:
        for packet in container.demux(stream):
            check_deadline(deadline)
            for frame in packet.decode():
                if pos is None or frame.sample_rate != rate:
                    if pos is not None and frame.sample_rate != rate:
                        raise _unsupported(f"stream: its sample rate changes from {rate} to {frame.sample_rate} Hz")
                    # The frames' rate is the measure: an HE-AAC header gives half of it.
                    rate = frame.sample_rate
                    check_header(rate, info.channels)
                    info.rate = rate
                    first, stop = int(round(start * rate)), None if end is None else int(round(end * rate))
                    cap, block = int(max_seconds * rate), max(1, int(BLOCK_SECONDS * rate))
                    resampler = soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality=quality) \
                        if rate != SAMPLE_RATE else None
                    # after a seek, where the first frame starts; else at 0
                    timed = start > 0 and frame.pts is not None and frame.time_base is not None
                    pos = max(int(round(float(frame.pts * frame.time_base) * rate)), 0) if timed else 0
                mono = _mono(frame)
                lo, hi = pos, pos + len(mono)
                pos = hi
                keep = mono[max(first - lo, 0):len(mono) if stop is None else max(min(stop - lo, len(mono)), 0)]
                if not len(keep):
                    done = stop is not None and lo >= stop
                    if done:
                        break
                    continue
                if got + len(keep) > cap:
                    raise too_long(max_seconds, max_seconds, "the stream holds more than")
                if not np.isfinite(keep).all():
                    raise AudioError("audio contains NaN or infinite samples")
                got += len(keep)
                info.peak = max(info.peak, float(np.abs(keep).max()))
                pending.append(keep)
                held += len(keep)
                if held >= block:
                    yield _flush(pending, resampler, last=False)
                    held = 0
            if done:
                break
    except av.FFmpegError as exc:
        raise _corrupt(f"{stream.codec_context.name}: {_ffmpeg_reason(exc)}") from None
    if got == 0:
        raise AudioError("audio has zero samples", "empty")
    tail = _flush(pending, resampler, last=True)
    if len(tail):
        yield tail
    return got / rate


def _flush(pending: list[np.ndarray], resampler, last: bool) -> np.ndarray:
    mono = pending[0] if len(pending) == 1 else np.concatenate(pending) if pending else np.zeros(0, np.float32)
    pending.clear()
    return resampler.resample_chunk(mono, last=last) if resampler is not None else mono
