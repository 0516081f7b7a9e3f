"""What every audio decoder of pipeline.audio shares: the 16-kHz output rate, the limits a
recording's header and length must keep (sample rate, channels, ``audio.max_seconds``, the
short-read tolerance, the deadline), AudioError with its kind, and StreamInfo, what a block
decoder learns as it goes. pipeline.audio (libsndfile) and pipeline.audio_av (FFmpeg) both
raise and fill these, so a row's error and its kind do not depend on which one decoded it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

SAMPLE_RATE = 16000
# Float formats are stored unscaled: a file written as int16 values in float (peaks near
# 32768) decodes to garbage text without an error. Above this peak the samples are scaled
# back to a peak of 1; integer formats never get there (libsndfile gives them [-1, 1)).
MAX_FLOAT_PEAK = 1.5
# A decode that stops early by more than this (the larger of the two) is a truncated or
# corrupt file, not an estimate of the header's length (MP3 frame counts can be off).
SHORT_READ_S, SHORT_READ_SHARE = 1.0, 0.05
# Whatever the tolerance above, a decode that gives less than this share of what the header
# declares is corrupt (a 1.5-s header over 0.6 s of audio is not a shorter recording).
SHORT_READ_MAX_SHARE = 0.5
# The header values a recording may have: outside them a file is refused before decoding
# (a rate of 1 Hz resampled to 16 kHz grows 16000-fold; 1000 channels of a mono file's
# bytes decode as a few milliseconds of noise).
MIN_RATE, MAX_RATE = 1000, 384000
MAX_CHANNELS = 32
MAX_SECONDS = 14400.0   # audio.max_seconds's default: the longest audio decoded for one row


def too_short(missing_s: float, wanted_s: float) -> bool:
    return missing_s > min(max(SHORT_READ_S, SHORT_READ_SHARE * wanted_s), SHORT_READ_MAX_SHARE * wanted_s)


def span_cut_short(length_s: float, got_to_s: float, offset_s: float | None, duration_s: float | None) -> bool:
    """Whether audio that reaches only ``got_to_s`` of ``length_s`` falls short of the part
    asked for (the whole file, or ``duration_s`` from ``offset_s``) past the tolerance."""
    start = offset_s or 0.0
    end = length_s if duration_s is None else min(length_s, start + duration_s)
    return too_short(end - got_to_s, end - start)


class AudioError(ValueError):
    """The bytes are not decodable audio (or hold no samples). ``kind``: one word of
    pipeline.output.ERROR_KINDS; pipeline.output.error_kind gives the same word for the
    message, which is all an output row keeps."""

    def __init__(self, message: str, kind: str = "corrupt"):
        super().__init__(message)
        self.kind = kind


def check_header(rate: int, channels: int) -> None:
    """AudioError (``unsupported``) where a header's sample rate or channel count is out of
    range: checked before any sample is decoded."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"unsupported sample rate: the header declares {rate} Hz "
                         f"(accepted: {MIN_RATE}..{MAX_RATE} Hz)", "unsupported")
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"unsupported channel count: the header declares {channels} channels "
                         f"(accepted: 1..{MAX_CHANNELS})", "unsupported")


def too_long(seconds: float, max_seconds: float, what: str) -> AudioError:
    return AudioError(f"too long: {what} {seconds:.0f} s of audio, over audio.max_seconds "
                      f"({max_seconds:g} s)", "too_long")


def check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise AudioError("read timeout: decoding stopped at its deadline (audio.read_timeout_s)", "timeout")


UNRECOGNISED = "unrecognised or corrupt audio format"


@dataclass
class StreamInfo:
    """What a block decoder learns as it goes: the header's sample rate and channel count
    (set before the first block), the largest absolute sample value seen so far (at the
    original rate), and the 16-kHz samples it would yield in all where the header says
    (``expected``; None where it does not)."""
    rate: int = 0
    channels: int = 0
    peak: float = 0.0
    expected: int | None = None
