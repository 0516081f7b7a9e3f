"""End to end: ``shardscribe build-lm --tokenizer DIR`` and ``transcribe --config
transducer_beam`` (ALSD++ of "Pushing the Limits of Beam Search Decoding for
Transducer-based ASR models" in its own pool) on a random Parakeet TDT saved here, with an
LM, per-row key phrases and a broken file mixed in: rows in = rows out, and the beam
pool's text for one clip equals the search run in-process on that clip."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, manifest_with_random_bytes, transcribe_cli
from shardscribe.pipeline.config import load_config
from transducer_reference import build


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("tdt")
    build("tdt", root, max_symbols=3, zero_duration_bias=-100.0)
    return root


@pytest.fixture(scope="module")
def lm_dir(checkpoint, tmp_path_factory):
    from shardscribe.pipeline.lm.build import find_lmplz
    from shardscribe.pipeline.training.sample_text import pydoc_sentences

    find_lmplz(build=False)
    tmp = tmp_path_factory.mktemp("lm")
    (tmp / "text.txt").write_text("\n".join(pydoc_sentences()[:800]) + "\n")
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "build-lm", "--tokenizer", str(checkpoint),
                           "--text", str(tmp / "text.txt"), "--order", "3", "--output", str(tmp / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((tmp / "out" / "lm.json").read_text())
    assert info["vocab_size"] == 35          # the model's non-blank tokens (blank = 35)
    return tmp / "out"


def test_transcribe_transducer_beam_with_lm_phrases_and_a_broken_file(checkpoint, lm_dir, tmp_path, samples_dir,
                                                                      sample_manifest):
    path, lines = manifest_with_random_bytes(tmp_path, samples_dir, sample_manifest[:4], at=1)
    lines[0]["key_phrases"] = ["the weather"]
    lines[2]["key_phrases"] = ["pump in"]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    dst = tmp_path / "out"
    sets = [f"model.source={checkpoint}", f"beam.lm_path={lm_dir}", "batching.recordings_per_batch=3"]
    summary, rows = transcribe_cli(dst, "--runner", "local", "--input", str(path), "--config", "transducer_beam",
                                   *[a for s in sets for a in ("--set", s)])
    assert summary["rows_in"] == summary["rows_out"] == len(lines) == len(rows)
    assert summary["errors"] == 1 and rows["random"]["error"] and rows["random"]["text"] is None
    for line in lines:
        if line["id"] != "random":
            row = rows[line["id"]]
            assert row["error"] is None and row["decoder"] == "transducer_beam", row
            assert all(seg["stage"] == "beam" for seg in row["segments"]), row["segments"]
    # the pool's text for the last clip (no key phrases) equals the search run here
    from shardscribe.pipeline.audio import decode_audio
    from shardscribe.pipeline.kinds.transducer_beam.stages import build_search
    from shardscribe.pipeline.models import load_model

    cfg = load_config("transducer_beam", sets)
    adapter = load_model(cfg.model)
    last = lines[-1]
    row = rows[last["id"]]
    assert len(row["segments"]) == 1
    audio = decode_audio(open(last["audio"], "rb").read())[0]
    enc = adapter.encode([audio])
    out = build_search(cfg).search(enc.states, enc.valid_frames)
    assert row["text"] == adapter.decode_text(out.tokens[0]).strip()
    assert torch.isfinite(out.scores).all()


def test_config_validation():
    cfg = load_config("transducer_beam", ["model.source=/x"])
    assert (cfg.model.family, cfg.decoder.kind, cfg.transducer.algorithm) == ("transducer", "transducer_beam", "alsd")
    from shardscribe.pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="transducer.pruning"):
        load_config("transducer_beam", ["transducer.pruning=middle"])
    with pytest.raises(ConfigError, match="needs a model with transducer"):
        load_config("transducer_greedy", ["model.family=ctc"])


def test_aes_on_a_tdt_fails_before_any_worker_starts(tmp_path, checkpoint):
    """AES++ is defined for RNN-T: a TDT (the embedded default, a Parakeet TDT directory)
    under transducer.algorithm=aes is one line and exit 2 from the driver, and the shipped
    RNN-T twin passes the same check."""
    from shardscribe.pipeline.kinds import decoder_kind
    from shardscribe.pipeline.models.preflight import ModelError, check_model

    check_transducer_search = decoder_kind("transducer_beam").check

    for source in ("embedded", str(checkpoint)):
        with pytest.raises(ModelError, match="AES\\+\\+ searches RNN-T models.*embedded_rnnt"):
            check_transducer_search(load_config("transducer_beam", ["transducer.algorithm=aes",
                                                                     f"model.source={source}"]))
    rnnt = load_config("transducer_beam", ["transducer.algorithm=aes", "model.source=embedded_rnnt"])
    check_model(rnnt.model)
    check_transducer_search(rnnt)
    with pytest.raises(ModelError, match="model.source=embedded_rnnt: .*model.family=transducer"):
        check_model(load_config("ar", ["model.source=embedded_rnnt"]).model)
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(tmp_path / "none.jsonl"),
                           "--output", str(tmp_path / "out"), "--config", "transducer_beam",
                           "--set", "transducer.algorithm=aes"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "AES++ searches RNN-T" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
