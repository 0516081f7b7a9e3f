"""The length of an MP3 from its frame headers (ISO/IEC 11172-3 and 13818-3, the frame
header's bitrate, sample-rate and padding fields), without decoding it.

libsndfile takes an MP3's length from its Xing/Info or VBRI header, or, where the file has
none (a stream cut to a file, a tag stripped by an editor), estimates it from the first
frame's bitrate, and then decodes no further than that estimate. For a variable-bitrate
file the estimate can be a fraction of the audio, which was dropped without a word. The
walk here counts the samples every frame holds, so the decoder's shortfall can be named.
"""
from __future__ import annotations

import time

# kbit/s by bitrate index, per (MPEG-1?, layer)
_BITRATES = {
    (True, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
# sample rates by version bits (0: MPEG-2.5, 2: MPEG-2, 3: MPEG-1) and index
_RATES = {0: (11025, 12000, 8000), 2: (22050, 24000, 16000), 3: (44100, 48000, 32000)}
# where a first frame may hold a length header: Xing/Info after the side information,
# VBRI 32 bytes after the frame header
LENGTH_TAGS = (b"Xing", b"Info", b"VBRI")
_TAG_SEARCH = 64
_JUNK_MAX = 4096    # bytes looked through for the first frame's sync


class DeadlinePassed(TimeoutError):
    """untagged_seconds ran past its deadline."""


def frame(header: bytes) -> tuple[int, int, int] | None:
    """``(frame bytes, samples, sample rate)`` of the 4-byte frame header, or None where
    it is not one (no sync, a reserved or free-format field)."""
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        return None
    version, layer_bits = (header[1] >> 3) & 3, (header[1] >> 1) & 3
    bitrate_index, rate_index, padding = header[2] >> 4, (header[2] >> 2) & 3, (header[2] >> 1) & 1
    if version == 1 or layer_bits == 0 or bitrate_index in (0, 15) or rate_index == 3:
        return None
    layer, mpeg1 = 4 - layer_bits, version == 3
    bitrate = _BITRATES[(mpeg1, layer)][bitrate_index] * 1000
    rate = _RATES[version][rate_index]
    if layer == 1:
        return (12 * bitrate // rate + padding) * 4, 384, rate
    samples = 1152 if layer == 2 or mpeg1 else 576
    return samples // 8 * bitrate // rate + padding, samples, rate


def _skip_id3(fh, pos: int) -> int:
    fh.seek(pos)
    head = fh.read(10)
    if len(head) == 10 and head[:3] == b"ID3":
        size = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | head[9] & 0x7F
        return pos + 10 + size + (10 if head[5] & 0x10 else 0)
    return pos


def untagged_seconds(fh, pos: int = 0, chunk: int = 1 << 16, deadline: float | None = None) -> float | None:
    """Seconds of audio the frames of the MP3 in ``fh`` (from ``pos``) hold, or None where
    its first frame carries a length header (the decoder's length is then exact) or no
    frame is found. Reads the file once, a chunk at a time; stops at the first byte that
    does not continue the chain of frames (trailing tags, damage). DeadlinePassed once
    time.monotonic() passes ``deadline`` (checked between chunks)."""
    start = _skip_id3(fh, pos)
    fh.seek(start)
    buf, offset, samples, rate, first = b"", 0, 0, 0, True
    while True:
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlinePassed("MP3 frame count stopped at its deadline")
        more = fh.read(chunk)
        buf = buf[offset:] + more
        offset = 0
        while offset + 4 <= len(buf):
            info = frame(buf[offset:offset + 4])
            if info is None:
                if first and offset < _JUNK_MAX:    # junk before the first frame: find its sync
                    offset += 1
                    continue
                return samples / rate if rate else None
            size, n, rate = info
            if first:
                if offset + 4 + _TAG_SEARCH > len(buf) and more:
                    break       # read on: the tag lies past this chunk
                if any(t in buf[offset + 4:offset + 4 + _TAG_SEARCH] for t in LENGTH_TAGS):
                    return None
                first = False
            if offset + size > len(buf) and more:
                break
            offset += size
            samples += n
        if not more:
            return samples / rate if rate else None
