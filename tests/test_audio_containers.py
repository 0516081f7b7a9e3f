"""Every container a user has, decoded through pipeline.audio (libsndfile, or FFmpeg through
pipeline.audio_av): the files are written in the test with PyAV from a shipped sample, and
each decode is checked against that sample as soundfile reads it. Error kinds of what
FFmpeg cannot read, hostile streams bounded by audio.max_seconds and the deadline, and the
folder scan's audio types and its count of skipped files."""
from __future__ import annotations

import io
import time

import av
import numpy as np
import pytest
import soundfile as sf

from audio_containers import CONTAINERS, write_audio, write_video
from conftest import SAMPLES

CLIP = SAMPLES / "fox_flite_slt.flac"      # 16 kHz mono, 2.965 s


@pytest.fixture(scope="module")
def clip():
    samples, rate = sf.read(CLIP, dtype="float32")
    return samples, rate


@pytest.fixture(scope="module")
def files(tmp_path_factory, clip):
    root = tmp_path_factory.mktemp("containers")
    return {ext: write_audio(root / f"fox{ext}", *clip) for ext in CONTAINERS}


def _envelope(x: np.ndarray) -> np.ndarray:
    """RMS per 20 ms: what a lossy codec keeps of the waveform."""
    n = len(x) // 320
    return np.sqrt((x[:n * 320].reshape(n, 320) ** 2).mean(axis=1))


@pytest.mark.parametrize("ext", list(CONTAINERS))
def test_every_container_decodes_to_the_sample(files, clip, ext):
    from shardscribe.pipeline.audio import decode_audio, decode_stream

    want, _ = clip
    with open(files[ext], "rb") as fh:
        got, rate, _ = decode_stream(fh)
    assert rate == CONTAINERS[ext][2]
    # lengths: the sample, plus at most an AAC frame of encoder priming and padding
    assert abs(len(got) - len(want)) <= 0.11 * 16000, (len(got), len(want))
    if ext in (".wav", ".flac"):
        np.testing.assert_allclose(got, want, atol=1 / 32768)
    else:
        # the loudness contour over time, aligned on the best lag (codecs delay by a frame)
        a, b = _envelope(got), _envelope(want)
        n = min(len(a), len(b)) - 8
        best = max(np.corrcoef(a[lag:lag + n], b[:n])[0, 1] for lag in range(8))
        assert best > 0.95, best
    np.testing.assert_array_equal(decode_audio(files[ext].read_bytes())[0], got)


def test_the_audio_of_a_video_and_a_video_without_audio(tmp_path, clip):
    from shardscribe.pipeline.audio import AudioError, decode_stream
    from shardscribe.pipeline.output import error_kind

    with open(write_video(tmp_path / "talk.mp4", *clip), "rb") as fh:
        got, _, _ = decode_stream(fh)
    assert abs(len(got) - len(clip[0])) <= 0.11 * 16000
    with open(write_video(tmp_path / "silent.mp4", None, 16000), "rb") as fh, pytest.raises(AudioError) as err:
        decode_stream(fh)
    assert "no audio stream" in str(err.value) and "video" in str(err.value)
    assert err.value.kind == error_kind(str(err.value)) == "unsupported"


def _two_streams(path, first: np.ndarray, second: np.ndarray) -> None:
    """A Matroska file with two FLAC audio streams."""
    with av.open(str(path), "w", format="matroska") as out:
        streams = [out.add_stream("flac", rate=16000) for _ in range(2)]
        for stream in streams:
            stream.layout = "mono"
        for stream, samples in zip(streams, (first, second)):
            frame = av.AudioFrame.from_ndarray((samples * 32767).astype(np.int16)[None, :], format="s16",
                                               layout="mono")
            frame.sample_rate, frame.pts = 16000, 0
            for packet in [*stream.encode(frame), *stream.encode(None)]:
                out.mux(packet)


def test_audio_stream_picks_the_stream(tmp_path, clip):
    from shardscribe.pipeline.audio import AudioError, decode_stream
    from shardscribe.pipeline.output import error_kind

    t = np.arange(16000) / 16000
    low, high = 0.5 * np.sin(2 * np.pi * 300 * t), 0.5 * np.sin(2 * np.pi * 2000 * t)
    path = tmp_path / "two.mka"
    _two_streams(path, low, high)
    for stream, tone in ((0, 300), (1, 2000)):
        with open(path, "rb") as fh:
            got, _, _ = decode_stream(fh, stream=stream)
        assert np.argmax(np.abs(np.fft.rfft(got[:16000]))) == pytest.approx(tone, abs=2)
    with open(path, "rb") as fh, pytest.raises(AudioError, match=r"audio\.stream 2: .* has 2 audio streams") as err:
        decode_stream(fh, stream=2)
    assert err.value.kind == error_kind(str(err.value)) == "unsupported"
    # a file libsndfile reads has one stream: a second one is asked of FFmpeg, which says so
    with pytest.raises(AudioError, match=r"audio\.stream 1: .* has 1 audio stream \(0\.\.0\)"):
        decode_stream(open(CLIP, "rb"), stream=1)


def test_the_audio_stream_key_is_declared_and_checked():
    from shardscribe.pipeline.config import ConfigError, config_hash, load_config

    assert load_config("ar").audio.stream == 0
    assert load_config("ar", ["audio.stream=1"]).audio.stream == 1
    assert config_hash(load_config("ar", ["audio.stream=1"])) != config_hash(load_config("ar"))
    for bad in ("-1", "1.5", "first"):
        with pytest.raises(ConfigError, match="audio.stream"):
            load_config("ar", [f"audio.stream={bad}"])


def test_error_kinds_of_what_ffmpeg_cannot_read(files):
    """An unknown codec is unsupported and says which container; an MP4 cut short (its index
    lost) and an AAC stream with its frames overwritten are corrupt; random bytes stay
    corrupt (no decoder recognises them)."""
    from shardscribe.pipeline.audio import AudioError, decode_stream
    from shardscribe.pipeline.output import error_kind

    unknown = files[".webm"].read_bytes()
    wav_mka = io.BytesIO()
    with av.open(wav_mka, "w", format="matroska") as out:
        stream = out.add_stream("pcm_s16le", rate=16000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1600), np.int16), format="s16", layout="mono")
        frame.sample_rate, frame.pts = 16000, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    unknown = wav_mka.getvalue().replace(b"A_PCM/INT/LIT", b"A_QQQ/INT/LIT")
    m4a = files[".m4a"].read_bytes()
    aac = bytearray(files[".aac"].read_bytes())
    aac[200:] = np.random.default_rng(0).integers(0, 256, len(aac) - 200, dtype=np.uint8).tobytes()
    cases = {"unknown codec": (unknown, "unsupported", r"unsupported codec .* Matroska"),
             "cut m4a": (m4a[:len(m4a) // 3] if m4a.index(b"moov") > len(m4a) // 2 else m4a[len(m4a) // 2:],
                         "corrupt", "cannot decode audio"),
             "random": (bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8)), "corrupt",
                        "unrecognised or corrupt audio format")}
    for name, (data, kind, message) in cases.items():
        with pytest.raises(AudioError, match=message) as err:
            decode_stream(io.BytesIO(data))
        assert err.value.kind == error_kind(str(err.value)) == kind, (name, str(err.value))
    # a damaged AAC stream: FFmpeg resyncs on what still parses, or names the damage
    try:
        decode_stream(io.BytesIO(bytes(aac)))
    except AudioError as exc:
        assert exc.kind == error_kind(str(exc)) == "corrupt", str(exc)


class _Endless(io.RawIOBase):
    """A stream that never ends: ``data`` over and over (a live feed, a looping file); it
    has no end before a terabyte."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:   # as far as anyone will read
            self.pos = 1 << 40
            return self.pos
        self.pos = offset + (self.pos if whence == io.SEEK_CUR else 0)
        return self.pos

    def readinto(self, buf) -> int:
        n = len(buf)
        out = (self.data * (n // len(self.data) + 2))[self.pos % len(self.data):][:n]
        buf[:n] = out
        self.pos += n
        return n


def test_a_stream_that_never_ends_stops_at_max_seconds_and_at_the_deadline(files):
    """ADTS AAC declares no length: the decoded samples are the measure, so an endless
    stream is a too_long error at audio.max_seconds, and with a cap it never reaches, the
    deadline stops it between packets (a file of countless tiny packets likewise)."""
    from shardscribe.pipeline.audio import AudioError, decode_stream

    adts = files[".aac"].read_bytes()
    with pytest.raises(AudioError, match="too long: the stream holds more than 20 s") as err:
        decode_stream(_Endless(adts), max_seconds=20.0)
    assert err.value.kind == "too_long"
    start = time.monotonic()
    with pytest.raises(AudioError, match="read timeout") as err:
        decode_stream(_Endless(adts), max_seconds=1e9, deadline=time.monotonic() + 1.0)
    assert err.value.kind == "timeout" and time.monotonic() - start < 30


def test_a_header_over_max_seconds_is_refused_before_decoding(files):
    """An MP4 declares its length: more than audio.max_seconds is too_long at once; a span
    within the cap of the same file decodes."""
    from shardscribe.pipeline.audio import AudioError, decode_stream

    with pytest.raises(AudioError, match="too long: the header declares 3 s") as err:
        decode_stream(open(files[".m4a"], "rb"), max_seconds=2.0)
    assert err.value.kind == "too_long"
    got, _, _ = decode_stream(open(files[".m4a"], "rb"), offset_s=1.0, duration_s=1.5, max_seconds=2.0)
    assert len(got) == 24000


def test_the_folder_scan_takes_every_decoder_type_and_counts_the_rest(tmp_path, files):
    from shardscribe.pipeline.audio_formats import AUDIO_EXTENSIONS
    from shardscribe.pipeline.sources import SourceError, open_source, skipped_line

    assert set(CONTAINERS) <= set(AUDIO_EXTENSIONS)
    only = tmp_path / "only"
    only.mkdir()
    for ext in (".m4a", ".webm"):
        (only / f"fox{ext}").write_bytes(files[ext].read_bytes())
    source = open_source(str(only))
    assert [f.rsplit("/", 1)[1] for f in source.files] == ["fox.m4a", "fox.webm"]
    assert source.skipped_files == 0 and skipped_line(source) is None
    (only / "notes.txt").write_text("x")
    (only / "cover.jpg").write_bytes(b"x")
    (only / "more.txt").write_text("x")
    (only / "README").write_text("x")
    source = open_source(str(only))
    assert len(source.files) == 2 and source.skipped_files == 4
    assert skipped_line(source) == ("shardscribe: skipped 4 files of a type no decoder reads (2 .txt, "
                                    "1 (no extension), 1 .jpg); the audio types: docs/sources.md")
    none = tmp_path / "none"
    none.mkdir()
    (none / "a.txt").write_text("x")
    with pytest.raises(SourceError, match=r"no audio files.* \(1 \.txt of other types\)"):
        open_source(str(none))


def test_an_mp4_whose_headers_claim_1000_times_its_length(files, clip):
    """mvhd, tkhd and mdhd patched to declare 1000 times the audio (2965 s): nothing is
    refused or sized by the claim (FFmpeg measures the stream by its sample table), and the
    decode is the audio the file holds, under a cap far below the claim."""
    import struct

    from shardscribe.pipeline.audio import decode_stream

    data = bytearray(files[".m4a"].read_bytes())
    for box, skip in ((b"mvhd", 12), (b"tkhd", 16), (b"mdhd", 12)):
        at = data.index(box) + 4 + 4 + skip       # version 0: 32-bit fields
        data[at:at + 4] = struct.pack(">I", struct.unpack(">I", data[at:at + 4])[0] * 1000)
    got, _, _ = decode_stream(io.BytesIO(bytes(data)), max_seconds=60.0)
    assert abs(len(got) - len(clip[0])) <= 0.11 * 16000


def test_a_file_of_a_million_tiny_packets_is_bounded(tmp_path):
    """A million 11-byte ADTS packets (silent AAC frames; 35 hours at 8 kHz, 11 MB): the
    per-packet work is bounded by the caps as a stream's is, audio.max_seconds on the
    decoded samples and the deadline between packets, not by the packets' count."""
    from shardscribe.pipeline.audio import AudioError, decode_stream

    buf = io.BytesIO()
    with av.open(buf, "w", format="adts") as out:
        stream = out.add_stream("aac", rate=8000, layout="mono")
        stream.bit_rate = 8000
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024 * 8), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    data = buf.getvalue()
    frames, at = [], 0
    while at < len(data):      # ADTS frame length: 13 bits of header bytes 3-5
        size = ((data[at + 3] & 3) << 11) | (data[at + 4] << 3) | (data[at + 5] >> 5)
        frames.append(data[at:at + size])
        at += size
    tiny = frames[-2]
    assert len(tiny) <= 16
    path = tmp_path / "tiny_packets.aac"
    path.write_bytes(frames[0] + tiny * 1_000_000)

    start = time.monotonic()
    with pytest.raises(AudioError, match="too long") as err:
        decode_stream(open(path, "rb"), max_seconds=300.0)
    assert err.value.kind == "too_long" and time.monotonic() - start < 60
    start = time.monotonic()
    with pytest.raises(AudioError, match="read timeout") as err:
        decode_stream(open(path, "rb"), max_seconds=1e9, deadline=time.monotonic() + 1.0)
    assert err.value.kind == "timeout" and time.monotonic() - start < 30
