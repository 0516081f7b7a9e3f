"""The broken-input set under every shipped config, on Ray (one local instance for all):
each broken recording is one output row with a clear error, whatever the decoder kind
(one pool or two) and whatever the model family; the job exits 0 and its summary counts
the errors. The messages are checked against what each file is, not against our output."""
from __future__ import annotations

import argparse
import io
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf
from shardscribe.pipeline import output

from conftest import ROOT

# default.yaml is ssd.yaml under another name (checked below), so it runs once, as ssd.
CONFIGS = sorted(p.stem for p in (ROOT / "conf").glob("*.yaml") if p.stem != "default")
BROKEN = {"empty.wav": "empty file", "random.wav": "cannot decode", "text_renamed.flac": "cannot decode",
          "zero_samples.wav": "zero samples", "missing.wav": "file not found", "fifo.wav": "FIFO",
          "truncated.wav": "truncated or corrupt"}


def _wav(samples, rate=16000):
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def manifest(tmp_path_factory, samples_dir, sample_manifest):
    root = tmp_path_factory.mktemp("broken")
    files = {"empty.wav": b"", "random.wav": bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8)),
             "text_renamed.flac": b"just some text, not audio\n" * 10,
             "zero_samples.wav": _wav(np.zeros(0, dtype=np.float32)),
             "silence.wav": _wav(np.zeros(24000, dtype=np.float32)),
             # a copy cut short: its header declares 3 s, the file holds 1
             "truncated.wav": _wav(0.3 * np.sin(np.arange(48000) / 5.0))[:44 + 32000]}
    for name, data in files.items():
        (root / name).write_bytes(data)
    os.mkfifo(root / "fifo.wav")
    good = sample_manifest[0]
    lines = [{"id": good["id"], "audio": str(samples_dir / good["audio"]), "text": good["text"]}]
    lines += [{"id": name, "audio": str(root / name)} for name in [*files, "missing.wav", "fifo.wav"]]
    path = root / "manifest.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path, good["id"], len(lines)


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory):
    import ray

    from shardscribe.actors.plan import init_ray
    from shardscribe.pipeline.config import load_config

    already = ray.is_initialized()
    init_ray(load_config("ar", ["ray.num_cpus=4"]))
    yield
    if not already:
        ray.shutdown()


@pytest.fixture(scope="module")
def ctc_checkpoint(tmp_path_factory):
    from test_ctc_family import saved_checkpoint

    root = tmp_path_factory.mktemp("wav2vec2")
    saved_checkpoint("wav2vec2", root)
    return root


@pytest.fixture(scope="module")
def tdt_checkpoint(tmp_path_factory):
    from transducer_reference import build

    root = tmp_path_factory.mktemp("tdt")
    build("tdt", root)
    return root


def test_the_default_config_is_ssd():
    from shardscribe.pipeline.config import load_config

    default, ssd = load_config("default").to_dict(), load_config("ssd").to_dict()
    assert default == ssd and set(CONFIGS) == {p.stem for p in (ROOT / "conf").glob("*.yaml")} - {"default"}


@pytest.mark.parametrize("config", CONFIGS)
def test_broken_inputs_under_every_config_on_ray(config, manifest, ray_session, model_cache, ctc_checkpoint,
                                                tdt_checkpoint, tmp_path, capsys):
    from shardscribe.jobs.transcribe import add_arguments, run

    path, good, n = manifest
    sets = [f"model.cache_dir={model_cache}", "batching.recordings_per_batch=16", "audio.read_timeout_s=60"]
    if config.startswith("ctc_model"):
        sets.append(f"model.source={ctc_checkpoint}")
    if config.startswith("transducer"):      # a random Parakeet TDT: faster than the embedded one
        sets.append(f"model.source={tdt_checkpoint}")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dst = tmp_path / "out"
    args = parser.parse_args(["--input", str(path), "--output", str(dst), "--config", config,
                              *[x for s in sets for x in ("--set", s)]])
    assert run(args) == 0, capsys.readouterr().err[-3000:]
    rows = {r["id"]: r for p in dst.glob("*.parquet") for r in pq.read_table(p).to_pylist()}
    assert len(rows) == n
    for name, message in BROKEN.items():
        row = rows[name]
        assert row["stage"] == "error" and message in (row["error"] or "") and row["text"] is None, row
        assert row["filter_reasons"] == [], row      # an error row is never judged by the filters
    # The filters ran in the pass, in whichever pool finished the row.
    assert all(isinstance(r["filter_reasons"], list) for r in rows.values())
    assert rows["silence.wav"]["error"] is None
    assert rows[good]["error"] is None
    summary = json.loads((dst / output.SUMMARY_NAME).read_text())
    assert summary["errors"] == len(BROKEN) and summary["rows_in"] == summary["rows_out"] == n
    assert (dst / output.SUCCESS_NAME).exists()
