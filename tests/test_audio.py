"""Audio decoding: formats, mixdown, resampling, and a clear error for each kind of bad file."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from shardscribe.pipeline.audio import AudioError, decode_audio


def _encode(samples, rate, fmt, subtype=None):
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def _tone(rate, seconds=1.0, freq=440.0):
    t = np.arange(int(rate * seconds)) / rate
    return (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


@pytest.mark.parametrize("fmt, subtype", [("WAV", "PCM_16"), ("FLAC", "PCM_16"), ("OGG", "VORBIS"),
                                          ("MP3", "MPEG_LAYER_III")])
def test_formats_decode_to_16k_mono(fmt, subtype):
    data = _encode(_tone(16000), 16000, fmt, subtype)
    samples, rate, channels = decode_audio(data)
    assert rate == 16000 and channels == 1 and samples.dtype == np.float32
    assert abs(len(samples) - 16000) < 2000  # MP3/Vorbis add codec padding
    # The tone survives: its spectrum peaks at 440 Hz.
    spec = np.abs(np.fft.rfft(samples[:16000] if len(samples) >= 16000 else samples))
    assert abs(np.argmax(spec) * 16000 / (2 * (len(spec) - 1)) - 440) < 5


def test_stereo_44k_is_mixed_down_and_resampled():
    left = _tone(44100, 2.0, 440.0)
    data = _encode(np.stack([left, np.zeros_like(left)], axis=1), 44100, "WAV", "FLOAT")
    samples, rate, channels = decode_audio(data)
    assert (rate, channels) == (44100, 2)
    assert abs(len(samples) - 32000) <= 1
    # Mean of the channels: half the left channel's amplitude.
    assert np.max(np.abs(samples[1000:-1000])) == pytest.approx(0.15, rel=0.02)


@pytest.mark.parametrize("data, message", [
    (b"", "empty file"),
    (None, "no audio bytes"),
    (bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8)), "cannot decode audio"),
    (b"This is a text file renamed to .flac\n" * 20, "cannot decode audio"),
])
def test_bad_bytes_raise_clear_errors(data, message):
    with pytest.raises(AudioError, match=message):
        decode_audio(data)


def test_zero_sample_wav():
    with pytest.raises(AudioError, match="zero samples"):
        decode_audio(_encode(np.zeros(0, dtype=np.float32), 16000, "WAV", "PCM_16"))


def test_a_wav_cut_short_is_an_error_not_a_shorter_recording():
    """A WAV whose data chunk declares more audio than the file holds (a copy or an upload
    cut short): libsndfile reads what is there without complaint, so it is checked against
    the header, in both decoders; a cut inside the tolerance, a span inside what is there and
    a length left open by a streaming writer still decode."""
    from shardscribe.pipeline.audio import decode_stream

    full = _encode(_tone(16000, 10.0), 16000, "WAV", "PCM_16")
    header = len(full) - 16000 * 10 * 2
    for decode in (decode_audio, lambda b: _stream(b)):
        with pytest.raises(AudioError, match=r"truncated or corrupt: the file holds 5\.00 s of the 10\.00 s"):
            decode(full[: header + 16000 * 5 * 2])
        samples, _, _ = decode(full[: header + int(16000 * 9.5) * 2])     # 0.5 s short: tolerated
        assert len(samples) == int(16000 * 9.5)
    cut = full[: header + 16000 * 5 * 2]
    samples, _, _ = decode_stream(io.BytesIO(cut), offset_s=1.0, duration_s=3.0)
    assert len(samples) == 16000 * 3
    with pytest.raises(AudioError, match="truncated"):
        decode_stream(io.BytesIO(cut), offset_s=4.0, duration_s=5.0)
    # ffmpeg's and SoX's, writing to a pipe (SoX's rounded down to whole blocks)
    for unknown in (0xFFFFFFFF, 0x7FFFF000, 0x7FFFEFFE, 0x7FFFEFC2):
        open_length = bytearray(cut)
        open_length[header - 4:header] = unknown.to_bytes(4, "little")
        for decode in (decode_audio, _stream):
            assert len(decode(bytes(open_length))[0]) == 16000 * 5


def _unwritten_sizes(wav: bytes, trailer: bool) -> bytes:
    """``wav`` as a writer to a pipe leaves it: RIFF and data sizes of an empty file (it
    could not seek back), and, with ``trailer``, the header it meant to rewrite appended
    after the audio (its seek failed, its write did not)."""
    header = wav.index(b"data") + 8
    out = bytearray(wav)
    out[4:8] = (header - 8).to_bytes(4, "little")
    out[header - 4:header] = bytes(4)
    return bytes(out) + (wav[:header] if trailer else b"")


@pytest.mark.parametrize("rate, channels, subtype", [(16000, 1, "PCM_16"), (44100, 2, "PCM_24")])
def test_a_wav_whose_writer_left_its_sizes_unwritten_decodes_whole(rate, channels, subtype):
    """libsndfile believes a data size of 0 and reads zero samples; both decoders read the
    audio that follows instead (whole frames), without a rewritten header appended after it,
    and give what the same file with its sizes filled in gives, spans included."""
    from shardscribe.pipeline.audio import decode_stream

    tone = _tone(rate, 3.0)
    proper = _encode(np.stack([tone] * channels, axis=1) if channels > 1 else tone, rate, "WAV", subtype)
    want, _, _ = decode_audio(proper)
    span, _, _ = decode_stream(io.BytesIO(proper), offset_s=0.5, duration_s=1.5)
    for trailer in (False, True):
        piped = _unwritten_sizes(proper, trailer)
        for decode in (decode_audio, _stream):
            got, got_rate, got_channels = decode(piped)
            assert (got_rate, got_channels) == (rate, channels)
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(decode_stream(io.BytesIO(piped), offset_s=0.5, duration_s=1.5)[0], span)
    # A byte past the last whole frame is not a sample; a header with nothing after it is empty.
    assert len(decode_audio(_unwritten_sizes(proper, False) + b"\x01")[0]) == len(want)
    with pytest.raises(AudioError, match="zero samples"):
        decode_audio(_unwritten_sizes(_encode(np.zeros(0, np.float32), rate, "WAV", subtype), False))


def test_festival_through_a_pipe_decodes_as_its_file_does(tmp_path):
    """festival's text2wave writing to a pipe (its sizes unwritten, its header rewrite
    appended) against the same text written to a file."""
    import shutil
    import subprocess

    if shutil.which("text2wave") is None:
        pytest.skip("festival's text2wave is not installed (scripts/setup.sh installs it)")
    text = b"The pump in the north wing shows a small leak."
    to_file = tmp_path / "file.wav"
    subprocess.run(["text2wave", "-o", str(to_file)], input=text, check=True, capture_output=True)
    piped = subprocess.run(["text2wave", "-o", "-"], input=text, check=True, stdout=subprocess.PIPE).stdout
    assert piped[40:44] == bytes(4)     # the layout this test is about
    want, _, _ = decode_audio(to_file.read_bytes())
    for decode in (decode_audio, _stream):
        np.testing.assert_array_equal(decode(piped)[0], want)


def _stream(data: bytes):
    from shardscribe.pipeline.audio import decode_stream

    return decode_stream(io.BytesIO(data))


def test_an_mp3_cut_short_is_an_error_not_a_shorter_recording():
    """libsndfile reports the MP3's full length, then stops early without complaint: the
    missing audio must not vanish silently (a WAV cut short reports its remaining length)."""
    rng = np.random.default_rng(0)
    speechy = (0.3 * rng.standard_normal(16000 * 10)).astype(np.float32)
    full = _encode(speechy, 16000, "MP3", "MPEG_LAYER_III")
    samples, _, _ = _stream(full)
    assert abs(len(samples) - 160000) < 4000
    with pytest.raises(AudioError, match=r"truncated or corrupt: decoded .* of the 10\.\d+ s"):
        _stream(full[: len(full) // 2])


def _vbr_mp3(seconds: float = 20.0, quiet_first: bool = False):
    """A variable-bitrate MP3 (loud noise and near-silence in turn, so frames differ in
    size) and the same file without its first frame, the Xing length header."""
    rng = np.random.default_rng(0)
    t = np.arange(int(16000 * seconds)) / 16000
    loud = (t % 4 >= 2) if quiet_first else (t % 4 < 2)
    quiet = 0.0 if quiet_first else 0.001 * np.sin(2 * np.pi * 200 * t)
    signal = np.where(loud, 0.3 * rng.standard_normal(t.size), quiet)
    buf = io.BytesIO()
    sf.write(buf, signal.astype(np.float32), 16000, format="MP3", subtype="MPEG_LAYER_III",
             bitrate_mode="VARIABLE", compression_level=0.5)
    data = buf.getvalue()
    assert b"Xing" in data[:64]
    return data, data[data.index(b"\xff\xf3", 4):]


def test_mp3_frames_hold_what_the_encoder_wrote():
    """The frame walk against the encoder's own count: a tagged file defers to its header,
    an untagged one is counted frame by frame (an ID3 tag before the frames is skipped)."""
    from shardscribe.pipeline.mp3_frames import untagged_seconds

    tagged, untagged = _vbr_mp3()
    assert untagged_seconds(io.BytesIO(tagged)) is None
    held = untagged_seconds(io.BytesIO(untagged))
    assert 20.0 <= held < 20.2           # the encoder's priming and padding frames
    id3 = b"ID3\x04\x00\x00\x00\x00\x02\x00" + bytes(256)
    assert untagged_seconds(io.BytesIO(id3 + untagged)) == held


def test_an_mp3_without_its_length_header_decodes_whole():
    """libsndfile decodes an MP3 without a Xing/VBRI header only as far as its first frame's
    bitrate makes it (a quarter of this VBR file); MP3s decode through FFmpeg, which reads
    every frame: both decoders give the 20 s the encoder wrote, tagged or not, and a span
    inside it is the span asked for."""
    from shardscribe.pipeline.audio import decode_stream

    tagged, untagged = _vbr_mp3()
    with sf.SoundFile(io.BytesIO(untagged)) as f:
        estimate = f.frames / f.samplerate
    assert estimate < 10                          # what libsndfile would have returned
    for decode in (decode_audio, _stream):
        assert abs(len(decode(tagged)[0]) - 320000) < 4000
        assert abs(len(decode(untagged)[0]) - 320000) < 4000
    samples, _, _ = decode_stream(io.BytesIO(untagged), offset_s=1.0, duration_s=3.0)
    assert len(samples) == 48000
    # Quiet first: the first frame's low bitrate makes the estimate too long; the file is
    # whole and decodes whole, not "truncated" against that estimate.
    _, untagged = _vbr_mp3(quiet_first=True)
    with sf.SoundFile(io.BytesIO(untagged)) as f:
        assert f.frames / f.samplerate > 30
    for decode in (decode_audio, _stream):
        assert abs(len(decode(untagged)[0]) - 320000) < 4000


def test_float_samples_stored_unscaled_are_scaled_back():
    """A float WAV written as int16 values (peaks near 32768): the same signal as the
    scaled file, not garbage; both decoders agree."""
    tone = _tone(16000, 1.0)
    good, _, _ = _stream(_encode(tone, 16000, "WAV", "FLOAT"))
    for decode in (_stream, decode_audio):
        loud, _, _ = decode(_encode(tone * 32768, 16000, "WAV", "FLOAT"))
        assert np.abs(loud).max() == pytest.approx(1.0, rel=1e-5)
        assert np.allclose(loud * np.abs(good).max(), good, atol=1e-5)
    # a float file that peaks a little over 1 (an overshoot past full scale) is left as it is
    hot, _, _ = _stream(_encode(tone * 4.0, 16000, "WAV", "FLOAT"))
    assert np.abs(hot).max() == pytest.approx(1.2, rel=1e-3)
