"""make-bench-sets: the held-out splits equal those of the full corpus, and the real sets
are cut from the package files exactly at their STM times."""
from __future__ import annotations

import io
import json
import shutil
import tarfile
import zipfile

import numpy as np
import pytest
import soundfile as sf

from shardscribe.jobs.make_bench_sets import extract_real, render_heldout, stm_segments


def _rows(path):
    return [json.loads(line) for line in open(path)]


@pytest.mark.skipif(not shutil.which("espeak-ng"), reason="needs the Debian TTS engines (scripts/setup.sh)")
def test_heldout_splits_are_those_of_the_full_corpus(tmp_path):
    from shardscribe.pipeline.training.tts.corpus import make_corpus

    make_corpus(tmp_path / "full", 14, seed=5, num_heldout_voice=4, num_heldout_text=4, workers=2)
    counts = render_heldout(tmp_path / "only", 14, 5, 4, workers=2)
    assert counts == {"failed": 0, "heldout_voice": 4, "heldout_text": 4}
    for split in ("heldout_voice", "heldout_text"):
        full, only = _rows(tmp_path / "full" / f"{split}.jsonl"), _rows(tmp_path / "only" / f"{split}_all.jsonl")
        assert full == only
        for row in only:
            a, _ = sf.read(tmp_path / "only" / row["audio"])
            b, _ = sf.read(tmp_path / "full" / row["audio"])
            np.testing.assert_array_equal(a, b)
    voices = _rows(tmp_path / "only" / "heldout_voice_all.jsonl")
    assert _rows(tmp_path / "only" / "heldout_voice.jsonl") + _rows(tmp_path / "only" / "hv_dev.jsonl") == voices
    assert not list((tmp_path / "only" / "audio").glob("train_*"))


def test_stm_lines_are_parsed_and_comments_skipped():
    stm = ";; a comment\nsample 1 A 6.68 7.16 Hello?\nsample 1 B 8.436 8.876 Oh, hello.\n"
    assert stm_segments(stm) == [(6.68, 7.16, "Hello?"), (8.436, 8.876, "Oh, hello.")]


def test_real_sets_are_cut_from_the_package_files(tmp_path, sample_audio):
    sr = 16000
    beckett = np.asarray(sample_audio["beckett_human"], dtype=np.float32)
    buf = io.BytesIO()
    sf.write(buf, beckett, sr, format="WAV")
    wheel = tmp_path / "useful_moonshine_onnx-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("moonshine_onnx/assets/beckett.wav", buf.getvalue())
    conversation = np.random.default_rng(0).uniform(-0.5, 0.5, 10 * sr).astype(np.float32)
    wav, stm = io.BytesIO(), b"sample 1 A 1.0 2.5 Hello there.\nsample 1 B 0.05 0.5 Hi.\n"
    sf.write(wav, conversation, sr, format="WAV", subtype="FLOAT")
    sdist = tmp_path / "pyannote_audio-0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for name, data in (("sample.wav", wav.getvalue()), ("sample.stm", stm)):
            info = tarfile.TarInfo(f"pyannote_audio-0/src/pyannote/audio/sample/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    alsa = tmp_path / "alsa"
    alsa.mkdir()
    sf.write(alsa / "Front_Left.wav", beckett[:sr], sr)

    counts = extract_real(tmp_path / "real", str(wheel), str(sdist), alsa_dir=alsa)
    assert counts == {"real": 2, "conversation": 2}
    rows = _rows(tmp_path / "real" / "real_all.jsonl")
    assert [r["text"] for r in rows] == [rows[0]["text"], "Front left.", "Hello there.", "Hi."]
    assert rows[0]["text"].startswith("Ever tried")
    np.testing.assert_allclose(sf.read(tmp_path / "real" / "beckett.wav")[0], beckett, atol=1e-4)
    first, _ = sf.read(tmp_path / "real" / "conv_00.flac")
    assert len(first) == int(2.6 * sr) - int(0.9 * sr)          # STM times +-0.1 s
    np.testing.assert_allclose(first, conversation[int(0.9 * sr):int(2.6 * sr)], atol=1e-4)
    second, _ = sf.read(tmp_path / "real" / "conv_01.flac")      # the pad stops at the file start
    np.testing.assert_allclose(second, conversation[:int(0.6 * sr)], atol=1e-4)
