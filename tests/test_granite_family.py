"""The granite_speech model family from config, end to end, on a tiny random checkpoint
saved to a temp directory: the CLI's in-process runner reads real audio (broken files mixed
in) through the family's torch log-mel features, and both the LLM decoder (ar) and
self-speculative decoding (ssd, its encoder's CTC head as the draft) run from
`--set model.family=granite_speech --set model.source=DIR`. References are independent of
the family code: transformers' audio_utils (numpy) for the features, and transformers'
GraniteSpeechForConditionalGeneration.forward re-run over the whole sequence at every step
for the transcript.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from conftest import ROOT
from shardscribe.pipeline.audio import decode_audio
from shardscribe.pipeline.models.granite_speech.features import GraniteFeatures
from shardscribe.pipeline.output import SUMMARY_NAME
from test_granite_adapter import CTC_VOCAB, FEATURE_DIM, _model, _reference_ar, _reference_prompt, _tokenizer

N_MELS = FEATURE_DIM // 2   # two mel frames per encoder frame
MAX_NEW = 8
CLIPS = ["fox_flite_slt", "pump_flite_rms", "coffee_espeak_en_us", "shells_flite_kal16"]


def _numpy_log_mels(audio: np.ndarray, fe: GraniteFeatures) -> np.ndarray:
    from transformers.audio_utils import mel_filter_bank, spectrogram, window_function

    fb = mel_filter_bank(num_frequency_bins=fe.n_fft // 2 + 1, num_mel_filters=fe.n_mels, min_frequency=0.0,
                         max_frequency=fe.sampling_rate / 2, sampling_rate=fe.sampling_rate, norm=None,
                         mel_scale="htk")
    window = window_function(fe.win_length, "hann", frame_length=fe.n_fft, center=True, periodic=True)
    mel = spectrogram(audio.astype(np.float64), window, frame_length=fe.n_fft, hop_length=fe.hop_length,
                      fft_length=fe.n_fft, power=2.0, center=True, pad_mode="reflect", mel_filters=fb,
                      mel_floor=1e-10, log_mel="log10").T
    mel = np.maximum(mel, mel.max() - 8.0) / 4 + 1
    if mel.shape[0] % 2:
        mel = mel[:-1]
    return mel.reshape(-1, 2 * fe.n_mels)


def test_torch_log_mels_match_a_numpy_reference(sample_audio):
    fe = GraniteFeatures()
    audios = [sample_audio[c] for c in CLIPS[:2]]
    got = fe.log_mels(audios)
    for i, a in enumerate(audios):
        ref = _numpy_log_mels(a, fe)
        assert got.shape[2] == ref.shape[1] == 2 * fe.n_mels
        # The batch is padded to its longest clip; a clip's own frames come first.
        n = ref.shape[0] if len(a) == max(map(len, audios)) else fe.frames(len(a))
        np.testing.assert_allclose(got[i, :n].numpy(), ref[:n], atol=2e-3)
        assert fe.frames(len(a)) <= got.shape[1]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("granite")
    tok = _tokenizer()
    model = _model(tok)
    model.save_pretrained(root)
    tok.save_pretrained(root)
    (root / "preprocessor_config.json").write_text(json.dumps({"n_mels": N_MELS}))
    (root / "ctc_vocab.json").write_text(json.dumps(CTC_VOCAB))
    return root, tok, model


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, samples_dir):
    root = tmp_path_factory.mktemp("granite-in")
    lines = [{"id": c, "audio": str(next(samples_dir.glob(f"{c}.*")))} for c in CLIPS]
    (root / "random.wav").write_bytes(bytes(np.random.default_rng(3).integers(0, 256, 3000, dtype=np.uint8)))
    (root / "empty.flac").write_bytes(b"")
    lines += [{"id": "random", "audio": str(root / "random.wav")}, {"id": "empty", "audio": str(root / "empty.flac")},
              {"id": "missing", "audio": str(root / "missing.wav")}]
    path = root / "manifest.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, lines


def _transcribe(manifest_path, dst, *sets):
    args = ["transcribe", "--input", str(manifest_path), "--output", str(dst), "--runner", "local"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((dst / SUMMARY_NAME).read_text())
    rows = {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}
    return summary, rows


@pytest.mark.parametrize("config", ["ar", "ssd"])
def test_granite_runs_from_config_with_broken_inputs(checkpoint, manifest, tmp_path, config):
    root, tok, model = checkpoint
    path, lines = manifest
    sets = ["model.family=granite_speech", f"model.source={root}", f"decoder.max_new_tokens={MAX_NEW}",
            "batching.recordings_per_batch=3"]
    if config == "ssd":
        # tau_ctc 0 sends every draft to verification and tau_slm 1 rejects it: each row is
        # re-decoded from its verified prefix, so the text must equal plain greedy AR.
        sets += [f"model.ctc_vocab={root / 'ctc_vocab.json'}", "ssd.tau_ctc=0.0", "ssd.tau_slm=1.0"]
    summary, rows = _transcribe(path, tmp_path / config, f"decoder.kind={config}", *sets)
    assert summary["rows_in"] == summary["rows_out"] == len(lines) == len(rows)
    assert summary["errors"] == 3
    for bad in ("random", "empty", "missing"):
        assert rows[bad]["error"] and rows[bad]["text"] is None, rows[bad]
    fe = GraniteFeatures(n_mels=N_MELS)
    for clip in CLIPS:
        row = rows[clip]
        assert row["error"] is None and row["decoder"] == config
        # The reference: transformers' forward on this clip's features alone, no cache.
        audio = decode_audio(open(row["audio"], "rb").read())[0]
        seg = row["segments"]
        assert len(seg) == 1
        part = audio[int(round(seg[0]["start"] * 16000)):int(round(seg[0]["end"] * 16000))]
        feats = fe.log_mels([part])[0, :fe.frames(len(part))].clone()  # out of inference mode
        tokens, _ = _reference_ar(model, feats, _reference_prompt(tok, model, feats), [], MAX_NEW)
        assert row["text"] == tok.decode(tokens, skip_special_tokens=True).strip(), clip
        if config == "ssd":
            assert seg[0]["stage"] == "ar_fallback"
    assert sum(bool(rows[c]["text"]) for c in CLIPS) >= 2   # the model says something


def test_configs_granite_cannot_serve_fail_in_validation(checkpoint):
    from shardscribe.pipeline.config import ConfigError, load_config

    root, _, _ = checkpoint
    base = ["model.family=granite_speech", f"model.source={root}", f"model.ctc_vocab={root / 'ctc_vocab.json'}"]
    # The beam search has no vocabulary for granite's CTC outputs (no family factory).
    with pytest.raises(ConfigError, match="needs a model with beam_vocabulary; .*use ctc_greedy"):
        load_config("ctc_beam", base + ["decoder.pack_windows=false"])
    # A packed gate needs encoder windows granite cannot pack.
    with pytest.raises(ConfigError, match="needs a model with packable.*ssd.pack_gate=false"):
        load_config("ssd", base + ["ssd.preset=high_rtfx", "ssd.pack_gate=true"])
    assert load_config("ssd", base + ["ssd.preset=high_rtfx", "ssd.pack_gate=false"]).ssd.packs_gate() is False


def test_ssd_on_granite_without_a_ctc_vocabulary_fails_before_any_worker(checkpoint, manifest, tmp_path):
    root, _, _ = checkpoint
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(manifest[0]),
                           "--output", str(tmp_path / "x"), "--config", "ssd", "--runner", "local",
                           "--set", "model.family=granite_speech", "--set", f"model.source={root}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "model.ctc_vocab" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x").exists()
    assert torch.get_num_threads() >= 1


def test_preflight_refuses_a_whisper_checkpoint_and_a_missing_tokenizer(checkpoint, tmp_path):
    """model.family=granite_speech on a Whisper checkpoint is refused from its config.json
    (the loader would build a default-sized random granite model from it), and a granite
    checkpoint without its tokenizer is named as such, not as a missing sentencepiece."""
    import shutil

    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.models.granite_speech.adapter import load_granite_adapter
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    root, _, _ = checkpoint
    whisper = tmp_path / "whisper"
    whisper.mkdir()
    (whisper / "config.json").write_text(json.dumps({"architectures": ["WhisperForConditionalGeneration"],
                                                     "model_type": "whisper"}))
    (whisper / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="holds a WhisperForConditionalGeneration checkpoint .*"
                                         "model.family=granite_speech loads GraniteSpeech"):
        check_model(load_config("ar", ["model.family=granite_speech", f"model.source={whisper}"]).model)
    bad = tmp_path / "bad"
    shutil.copytree(root, bad, ignore=shutil.ignore_patterns("tokenizer*"))
    with pytest.raises(ModelError, match=f"model.source={bad}: the checkpoint has no tokenizer files") as exc:
        check_model(load_config("ar", ["model.family=granite_speech", f"model.source={bad}"]).model)
    assert len(str(exc.value).splitlines()) == 1
    with pytest.raises(ModelError, match=str(bad)):
        load_granite_adapter(str(bad), None)
    check_model(load_config("ar", ["model.family=granite_speech", f"model.source={root}"]).model)


@pytest.mark.parametrize("kind", ["ar", "ctc_greedy"])
def test_a_clip_shorter_than_one_frame_is_empty_text_in_any_batch(checkpoint, sample_audio, kind):
    """100 samples: less than one FFT window (the centred spectrogram cannot reflect-pad
    them alone) and no encoder frame (two 10-ms mel frames each). Alone, beside another such
    clip or beside a longer clip, it gets empty text and no error (the LLM is not left to
    continue a prompt with no audio), and the longer clip the text it gets alone."""
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.kinds import decoder_kind
    from shardscribe.pipeline.models import load_model
    from shardscribe.pipeline.segment_runner import transcribe_prepared

    root, _, _ = checkpoint
    short = (np.random.default_rng(0).standard_normal(100) * 0.1).astype(np.float32)
    cfg = load_config(kind, ["model.family=granite_speech", f"model.source={root}", f"decoder.max_new_tokens={MAX_NEW}",
                             f"model.ctc_vocab={root / 'ctc_vocab.json'}", "decoder.pack_windows=false"])
    decoder = decoder_kind(kind).build_first_stage(load_model(cfg.model), cfg)

    def texts(*audios):
        rows = [{"id": str(i), "audio": str(i), "seg_start": [0.0], "seg_end": [len(a) / 16000], "seg_audio": [a],
                 "error": None} for i, a in enumerate(audios)]
        return [(r["text"], r["error"]) for r in transcribe_prepared(rows, decoder, 10 ** 6)]

    long = sample_audio["fox_flite_slt"]
    alone = texts(long)[0]
    assert texts(short) == [("", None)]
    assert texts(short, short) == [("", None)] * 2
    assert texts(short, long) == [("", None), alone]
