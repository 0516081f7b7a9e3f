"""Audio decoding to 16 kHz mono float32: soundfile (libsndfile) + soxr resampling.

`iter_blocks` reads a file object block by block (a span of it, where one is given) and
yields each block downmixed and resampled (soxr's streaming resampler) to 16 kHz, so a
recording never exists whole at its original rate, channel count or as encoded bytes in
memory; a consumer that keeps only a window of the blocks (pipeline.stream_segment) holds
no more than that window. `decode_stream` collects them into one preallocated 16-kHz
array: its peak is the result plus one block.

What a file costs is bounded before it is decoded: its header's sample rate and channel
count must be in range (pipeline.audio_limits), the audio asked for at most
``max_seconds`` (config ``audio.max_seconds``), a block at most BLOCK_VALUES samples, and
a ``deadline`` is checked between blocks, so a read that runs out of time stops instead of
running on in a thread no one waits for.

Every failure raises AudioError with a message a user can act on and a ``kind`` from a fixed
vocabulary (pipeline.output.ERROR_KINDS, which reads the same kind back from the message);
the pipeline turns it into one output row with that `error`, so a bad file never stops a job.
"""
from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import soundfile as sf
import soxr

from .audio_limits import (MAX_FLOAT_PEAK, MAX_SECONDS, SAMPLE_RATE, UNRECOGNISED, AudioError, StreamInfo,
                           check_header)
from .audio_limits import check_deadline as _check_deadline
from .audio_limits import span_cut_short as _span_cut_short
from .audio_limits import too_long as _too_long
from .audio_limits import too_short as _too_short
from .mp3_frames import DeadlinePassed, untagged_seconds

# libsndfile's frame count for a length it does not know (a FLAC stream without a total).
_UNKNOWN_FRAMES = 1 << 62


def _check_known_length(frames: int) -> None:
    """AudioError (``unsupported``) for a file whose header leaves its length open (a FLAC
    written to a pipe: STREAMINFO's total 0), which libsndfile reports as SF_COUNT_MAX
    frames and fails to read to its end."""
    if frames >= _UNKNOWN_FRAMES:
        raise AudioError("cannot decode audio: unsupported stream without a declared length "
                         "(a FLAC written to a pipe?); re-encode it to a file", "unsupported")


WAV_HEAD_BYTES = 4096   # where a WAV's fmt and data chunk headers are looked for
# A data size this large is a writer's "length unknown" (a pipe it could not seek back
# on): ffmpeg writes 0xffffffff, SoX 0x7ffff000 rounded down to whole blocks (0x7fffefff
# for 24-bit mono, 0x7fffefc2 for GSM), others 0. A WAV of 2 GiB cut short goes unjudged.
OPEN_WAV_LENGTH = 0x7FFF0000


def _wav_data_chunk(head: bytes) -> tuple[int, int, int, int] | None:
    """``(offset, declared size, byte rate, block align)`` of a RIFF/WAVE file's data chunk
    header, from ``head`` (the file's first bytes); None for any other file, or a data chunk
    beyond ``head``. The fmt values are 0 where no fmt chunk came first."""
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos, byte_rate, block_align = 12, 0, 0
    while pos + 8 <= len(head):
        chunk, n = head[pos:pos + 4], int.from_bytes(head[pos + 4:pos + 8], "little")
        if chunk == b"fmt " and pos + 22 <= len(head):
            byte_rate = int.from_bytes(head[pos + 16:pos + 20], "little")
            block_align = int.from_bytes(head[pos + 20:pos + 22], "little")
        elif chunk == b"data":
            return pos, n, byte_rate, block_align
        pos += 8 + n + (n & 1)
    return None


def wav_shortfall(head: bytes, size: int) -> tuple[float, float] | None:
    """``(declared, held)`` seconds of a RIFF/WAVE file (``head``: its first bytes, ``size``:
    its length) whose data chunk declares more audio than the file holds; None for any other
    file, a length left open by a streaming writer (``OPEN_WAV_LENGTH``), or a data chunk beyond
    ``head``. libsndfile reads such a file without complaint, as long as what is there."""
    found = _wav_data_chunk(head)
    if found is None:
        return None
    pos, n, byte_rate, _ = found
    held = size - (pos + 8)
    if not byte_rate or n == 0 or n >= OPEN_WAV_LENGTH or held >= n:
        return None
    return n / byte_rate, max(held, 0) / byte_rate


def wav_unwritten_length(head: bytes, size: int, tail: bytes = b"") -> tuple[dict[int, bytes], int] | None:
    """For a RIFF/WAVE file whose data chunk declares 0 bytes but is followed by audio, the
    header bytes that declare what it holds (whole frames), by offset: what a writer to a
    pipe leaves when it cannot seek back to fill in its sizes (festival's ``text2wave -o -``
    through a pipe writes RIFF and data sizes of an empty file), and the length of the file
    to read. libsndfile believes the header and reads zero samples. None for any other
    file, or a data chunk beyond ``head``.

    Such a writer's header rewrite lands after the audio instead (the seek back failed):
    where ``tail`` (the file's last bytes) ends with a header of the same length that
    declares exactly the bytes between the two, it is not audio, and the file to read ends
    before it."""
    found = _wav_data_chunk(head)
    if found is None or found[1] or not found[3]:
        return None
    pos, _, _, block_align = found
    header, held = pos + 8, size - (pos + 8)
    end = tail[-header:] if len(tail) >= header else b""
    if end[:4] == b"RIFF" and end[8:12] == b"WAVE" and int.from_bytes(end[pos + 4:pos + 8], "little") == held - header:
        held -= header
    held -= held % block_align
    if held <= 0:
        return None
    riff = min(pos + held, 0xFFFFFFFF)   # RIFF's size counts from byte 8
    return ({4: riff.to_bytes(4, "little"), pos + 4: min(held, 0xFFFFFFFF).to_bytes(4, "little")}, header + held)


class _FilledHeader:
    """``fh`` read from ``base`` as a file of its own of ``length`` bytes, with ``patches``
    (offset -> bytes) in place of what the file holds there (soundfile reads it through
    read/seek/tell)."""

    def __init__(self, fh, base: int, patches: dict[int, bytes], length: int):
        self.fh, self.base, self.patches, self.length = fh, base, patches, length

    def tell(self) -> int:
        return self.fh.tell() - self.base

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self.tell(), io.SEEK_END: self.length}[whence]
        self.fh.seek(self.base + start + offset)
        return self.tell()

    def read(self, n: int = -1) -> bytes:
        start = self.tell()
        left = max(self.length - start, 0)
        data = self.fh.read(left if n is None or n < 0 else min(n, left))
        for at, value in self.patches.items():
            lo, hi = max(at, start), min(at + len(value), start + len(data))
            if lo < hi:
                data = data[:lo - start] + value[lo - at:hi - at] + data[hi - start:]
        return data


def _check_mp3_length(held: float, decoded_end_s: float, offset_s: float | None = None,
                      duration_s: float | None = None) -> None:
    """AudioError where an MP3 without a length header, whose frames hold ``held`` seconds
    (pipeline.mp3_frames), was decoded only to ``decoded_end_s`` within the part asked
    for, past the short-read tolerance: libsndfile stops at an estimate from the first
    frame's bitrate."""
    if _span_cut_short(held, decoded_end_s, offset_s, duration_s):
        raise AudioError(f"MP3 without a length header (Xing/VBRI): the decoder reads {decoded_end_s:.2f} s of the "
                         f"{held:.2f} s its frames hold; re-encode it (or restore its header) to transcribe it whole",
                         "unsupported")


def _check_wav_length(head: bytes, size: int, offset_s: float | None = None,
                      duration_s: float | None = None) -> None:
    """AudioError where the part of a WAV that is asked for (the whole file, or a span) runs
    past what the file holds by more than the short-read tolerance."""
    short = wav_shortfall(head, size)
    if short is None:
        return
    declared, held = short
    if _span_cut_short(declared, held, offset_s, duration_s):
        raise AudioError(f"truncated or corrupt: the file holds {held:.2f} s of the {declared:.2f} s "
                         "its header declares")


def _libsndfile_reason(exc: "sf.LibsndfileError") -> str:
    reason = getattr(exc, "error_string", "") or str(exc)
    # libsndfile says "not a regular file" when it recognises no container in memory.
    if "regular file" in reason or "not recognised" in reason.lower():
        return UNRECOGNISED
    if "internal error" in reason.lower():   # what a decoder says on damaged frames mid-file
        return f"corrupt data inside the file ({reason.rstrip('.')})"
    if any(w in reason.lower() for w in ("unimplemented", "unsupported", "not supported")):
        return f"unsupported format or encoding ({reason.rstrip('.')})"
    return reason


def _undecodable(reason: str) -> AudioError:
    return AudioError(f"cannot decode audio: {reason}",
                      "unsupported" if reason.startswith("unsupported") else "corrupt")


def _sndfile_reads(fh, pos: int) -> bool:
    """Whether libsndfile reads ``fh`` (from ``pos``; put back there): where it does not
    recognise the container, or holds its codec unsupported (a WAV of GSM or MP3 data),
    FFmpeg (pipeline.audio_av) is asked."""
    try:
        sf.SoundFile(fh).close()
    except sf.LibsndfileError as exc:
        return not _libsndfile_reason(exc).startswith((UNRECOGNISED, "unsupported"))
    except (RuntimeError, TypeError, ValueError):
        return True     # recognised, and refused: its own error names why
    finally:
        fh.seek(pos)
    return True


def ffmpeg_first(head: bytes) -> bool:
    """Whether a file that starts with ``head`` is one libsndfile reads but FFmpeg decodes
    faster (`shardscribe bench audio-decode`, docs/sources.md): MP3 (FFmpeg also reads every
    frame of one without a length header) and Ogg Opus. Ogg Vorbis, faster too, stays with
    libsndfile: FFmpeg's decoder drops the first 256 samples of its first packet."""
    if head[:3] == b"ID3" or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return True
    return head[:4] == b"OggS" and b"OpusHead" in head[:64]


def decode_audio(data: bytes | None, quality: str = "HQ",
                 max_seconds: float = MAX_SECONDS) -> tuple[np.ndarray, int, int]:
    """Decode bytes of WAV/FLAC/OGG/MP3 to mono float32 at 16 kHz (the header checked and
    the length bounded as decode_stream does).

    Returns ``(samples, original_rate, original_channels)``.
    """
    if data is None:
        raise AudioError("no audio bytes (the file could not be read)", "unreadable")
    if len(data) == 0:
        raise AudioError("empty file (0 bytes)", "empty")
    if ffmpeg_first(data[:WAV_HEAD_BYTES]) or not _sndfile_reads(io.BytesIO(data), 0):
        return decode_stream(io.BytesIO(data), quality, max_seconds=max_seconds)
    _check_wav_length(data[:WAV_HEAD_BYTES], len(data))
    fill = wav_unwritten_length(data[:WAV_HEAD_BYTES], len(data), data[-WAV_HEAD_BYTES:])
    if fill:
        patches, length = fill
        filled = bytearray(data[:length])
        for at, value in patches.items():
            filled[at:at + len(value)] = value
        data = bytes(filled)
    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate, channels, mp3 = f.samplerate, f.channels, f.format == "MP3"
            check_header(rate, channels)
            total = f.frames
            _check_known_length(total)
            if max_seconds * rate < total:
                raise _too_long(total / rate, max_seconds, "the header declares")
            samples = f.read(total, dtype="float32", always_2d=True)    # never more than declared
    except AudioError:
        raise
    except sf.LibsndfileError as exc:
        raise _undecodable(_libsndfile_reason(exc)) from None
    except (RuntimeError, TypeError, ValueError) as exc:
        raise _undecodable(str(exc)) from None
    held = untagged_seconds(io.BytesIO(data)) if mp3 else None
    if held is not None:
        _check_mp3_length(held, samples.shape[0] / rate)
    elif _too_short((total - samples.shape[0]) / rate, total / rate):
        raise AudioError(f"truncated or corrupt: decoded {samples.shape[0] / rate:.2f} s of the "
                         f"{total / rate:.2f} s its header declares")
    if samples.shape[0] == 0:
        raise AudioError("audio has zero samples", "empty")
    mono = samples.mean(axis=1) if channels > 1 else samples[:, 0]
    if not np.isfinite(mono).all():
        raise AudioError("audio contains NaN or infinite samples")
    peak = float(np.abs(mono).max())
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE, quality=quality)
    mono = np.ascontiguousarray(mono, dtype=np.float32)
    if peak > MAX_FLOAT_PEAK:
        mono *= np.float32(1.0 / peak)
    return mono, rate, channels


BLOCK_SECONDS = 30.0  # decoded per read: bounds the original-rate working memory
BLOCK_VALUES = 1 << 22  # and at most this many samples (all channels) per read: 16 MB of float32
PREALLOCATE_S = 3600.0  # the 16-kHz result is allocated for at most this long, then grows


def iter_blocks(fh, quality: str = "HQ", offset_s: float | None = None, duration_s: float | None = None,
                max_seconds: float = MAX_SECONDS, deadline: float | None = None,
                info: StreamInfo | None = None, stream: int = 0) -> Iterator[np.ndarray]:
    """Decode the file object ``fh`` (or its span from ``offset_s`` for ``duration_s``
    seconds) as 16-kHz mono float32 blocks of at most BLOCK_SECONDS, in order.

    The header is checked before any sample is decoded (check_header; a declared length,
    of which at most ``max_seconds`` may be asked for), no more than it declares is read,
    and ``deadline`` (a time.monotonic() value) is checked between blocks: past it the decode
    stops with a ``timeout`` AudioError, so a caller that gave up on it gets its thread and
    memory back. A file cut short is found after its last block (the AudioError then comes
    from the generator's end). ``info`` is filled as the stream is read; the blocks are not
    scaled (a float file's peak over MAX_FLOAT_PEAK is the caller's to scale).

    Raises AudioError."""
    info = info if info is not None else StreamInfo()
    pos = fh.tell()
    head = fh.read(WAV_HEAD_BYTES)
    if not head:
        raise AudioError("empty file (0 bytes)", "empty")
    if head[:4] == b"RIFF":
        try:
            size = fh.seek(0, io.SEEK_END) - pos
        except (OSError, ValueError):   # a stream of unknown length: nothing to compare
            size = None
        if size is not None:
            _check_wav_length(head, size, offset_s, duration_s)
            if wav_unwritten_length(head, size):
                fh.seek(pos + max(size - WAV_HEAD_BYTES, 0))
                patches, length = wav_unwritten_length(head, size, fh.read(WAV_HEAD_BYTES))
                fh, pos = _FilledHeader(fh, pos, patches, length), 0
    fh.seek(pos)
    if stream or ffmpeg_first(head) or not _sndfile_reads(fh, pos):
        from .audio_av import iter_av_blocks    # PyAV: every container FFmpeg reads

        yield from iter_av_blocks(fh, quality, offset_s, duration_s, max_seconds, deadline, info, stream)
        return
    try:
        with sf.SoundFile(fh) as f:
            rate, channels, total = f.samplerate, f.channels, f.frames
            check_header(rate, channels)
            _check_known_length(total)
            info.rate, info.channels = rate, channels
            start = int(round((offset_s or 0.0) * rate))
            if start >= total > 0:
                raise AudioError(f"offset {offset_s} s is at or past the end of the audio "
                                 f"({total / rate:.2f} s)", "missing")
            asked = None if duration_s is None else int(round(duration_s * rate))
            want = total - start if asked is None else min(total - start, asked)
            if want > max_seconds * rate:      # at most what the header declares is read
                raise _too_long(want / rate, max_seconds, "the header declares" if asked is None or
                                asked > total - start else "the span asks for")
            info.expected = int(np.ceil(max(want, 0) * SAMPLE_RATE / rate))
            if start:
                f.seek(start)
            stream = (soxr.ResampleStream(rate, SAMPLE_RATE, 1, dtype="float32", quality=quality)
                      if rate != SAMPLE_RATE else None)
            block = max(1, min(int(BLOCK_SECONDS * rate), BLOCK_VALUES // channels))
            left, got = want, 0
            while left > 0:
                _check_deadline(deadline)
                data = f.read(min(block, left), dtype="float32", always_2d=True)
                if data.shape[0] == 0:
                    break
                left -= data.shape[0]
                got += data.shape[0]
                mono = data.mean(axis=1) if channels > 1 else data[:, 0]
                del data
                if not np.isfinite(mono).all():
                    raise AudioError("audio contains NaN or infinite samples")
                if len(mono):
                    info.peak = max(info.peak, float(np.abs(mono).max()))
                out = stream.resample_chunk(mono, last=left <= 0) if stream else mono
                if len(out):
                    yield np.ascontiguousarray(out, dtype=np.float32)
            if stream is not None and left > 0:  # stopped early: flush the resampler
                out = stream.resample_chunk(np.zeros(0, np.float32), last=True)
                if len(out):
                    yield np.ascontiguousarray(out, dtype=np.float32)
            mp3 = f.format == "MP3"
        # An MP3 without a length header has only an estimate of its length, short or long:
        # its frames are the measure; any other file is measured against its header.
        held = untagged_seconds(fh, pos, deadline=deadline) if mp3 else None
        if held is not None:
            _check_mp3_length(held, (start + got) / rate, offset_s, duration_s)
        elif _too_short(left / rate, want / rate):
            raise AudioError(f"truncated or corrupt: decoded {got / rate:.2f} s of the "
                             f"{want / rate:.2f} s its header declares")
    except AudioError:
        raise
    except DeadlinePassed:
        raise AudioError("read timeout: decoding stopped at its deadline (audio.read_timeout_s)", "timeout") from None
    except sf.LibsndfileError as exc:
        raise _undecodable(_libsndfile_reason(exc)) from None
    except (RuntimeError, TypeError, ValueError) as exc:
        raise _undecodable(str(exc)) from None


def peak_scale(peak: float) -> float | None:
    """The factor a float recording whose samples peak at ``peak`` is scaled by (None:
    it is not): see MAX_FLOAT_PEAK."""
    return 1.0 / peak if peak > MAX_FLOAT_PEAK else None


def decode_stream(fh, quality: str = "HQ", offset_s: float | None = None,
                  duration_s: float | None = None, max_seconds: float = MAX_SECONDS,
                  deadline: float | None = None, stream: int = 0) -> tuple[np.ndarray, int, int]:
    """The whole of ``iter_blocks``' decode (same arguments) in one preallocated 16-kHz
    array, scaled back to a peak of 1 where a float file's samples exceed MAX_FLOAT_PEAK.

    Returns ``(samples, original_rate, original_channels)``; raises AudioError."""
    info = StreamInfo()
    blocks = iter_blocks(fh, quality, offset_s, duration_s, max_seconds, deadline, info, stream)
    first = next(blocks, None)    # the header is read (and checked) by the first block
    expect = min(info.expected or 0, int(PREALLOCATE_S * SAMPLE_RATE))
    out = _Growing(expect + 64)
    if first is not None:
        out.add(first)
        del first
        for block in blocks:
            out.add(block)
    if out.n == 0:
        raise AudioError("audio has zero samples", "empty")
    samples = out.result()
    scale = peak_scale(info.peak)
    if scale is not None:
        samples *= np.float32(scale)
    return samples, info.rate, info.channels


class _Growing:
    """A float32 array filled in chunks, allocated once at its expected size."""

    def __init__(self, size: int):
        self.buf, self.n = np.empty(size, np.float32), 0

    def add(self, chunk: np.ndarray) -> None:
        if self.n + len(chunk) > len(self.buf):     # grows by half: amortised linear copying
            grown = np.empty(max(self.n + len(chunk) + 4096, len(self.buf) * 3 // 2), np.float32)
            grown[:self.n] = self.buf[:self.n]
            self.buf = grown
        self.buf[self.n:self.n + len(chunk)] = chunk
        self.n += len(chunk)

    def result(self) -> np.ndarray:
        # A view when the estimate was close; a copy only when it left much unused.
        return self.buf[:self.n] if self.n > len(self.buf) - 4096 else self.buf[:self.n].copy()
