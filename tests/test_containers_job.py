"""The same spoken sentence in every container a user has (.wav .flac .mp3 .ogg .opus .m4a
.mp4 .aac .webm, written in the test with PyAV), a video with that sentence as its audio
and a video without audio, through whole jobs: a folder and a manifest, on the local
runner and on Ray (one local instance for both). Every audio row carries the sentence the
sample's manifest gives; the silent video is one `unsupported` row that says why; the
folder's one other file is counted as skipped, and the console says so."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import soundfile as sf

from audio_containers import CONTAINERS, write_audio, write_video
from conftest import ROOT

pytestmark = pytest.mark.slow
SAMPLE_ID = "pump_flite_rms"   # its text comes through every codec with the ar model


def _words(text: str | None) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", (text or "").lower()).split())


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, samples_dir, sample_manifest):
    sample = next(m for m in sample_manifest if m["id"] == SAMPLE_ID)
    samples, rate = sf.read(samples_dir / sample["audio"], dtype="float32")
    folder = tmp_path_factory.mktemp("containers")
    names = [write_audio(folder / f"fox{ext}", samples, rate).name for ext in CONTAINERS]
    names.append(write_video(folder / "fox_video.mp4", samples, rate).name)
    names.append(write_video(folder / "no_audio.mp4", None, rate).name)
    (folder / "notes.txt").write_text("not audio\n")
    manifest = tmp_path_factory.mktemp("manifest") / "containers.jsonl"
    manifest.write_text("".join(json.dumps({"id": n, "audio": str(folder / n), "text": sample["text"]}) + "\n"
                                for n in names))
    return folder, manifest, names, sample["text"]


def _check(dst, names, text, skipped: int) -> dict:
    from shardscribe.pipeline import output

    rows = {r["id"]: r for p in dst.glob("*.parquet") for r in pq.read_table(p).to_pylist()}
    assert sorted(rows) == sorted(names)
    for name in names:
        if name == "no_audio.mp4":
            continue
        assert rows[name]["error"] is None, rows[name]
        assert _words(rows[name]["text"]) == _words(text), (name, rows[name]["text"])
    silent = rows["no_audio.mp4"]
    assert silent["text"] is None and "no audio stream" in silent["error"], silent
    summary = json.loads((dst / output.SUMMARY_NAME).read_text())
    assert summary["rows_in"] == summary["rows_out"] == len(names)
    assert summary["errors_by_kind"] == {"unsupported": 1}, summary
    assert summary["skipped_by_type"] == skipped
    return summary


def test_every_container_in_a_folder_on_the_local_runner(inputs, model_cache, tmp_path):
    """The CLI, as a user runs it: the folder's .txt is skipped with one console line."""
    folder, _, names, text = inputs
    dst = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(folder), "--output",
                           str(dst), "--runner", "local", "--config", "ar", "--set",
                           f"model.cache_dir={model_cache}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "skipped" in line and "type" in line]
    assert said == ["shardscribe: skipped 1 file of a type no decoder reads (1 .txt); the audio types: "
                    "docs/sources.md"], proc.stderr[-3000:]
    _check(dst, names, text, skipped=1)


def _run(args_list: list[str]) -> int:
    from shardscribe.jobs.transcribe import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run(parser.parse_args(args_list))


def test_every_container_in_a_manifest_on_the_local_runner(inputs, model_cache, tmp_path, capsys):
    _, manifest, names, text = inputs
    dst = tmp_path / "out"
    assert _run(["--input", str(manifest), "--output", str(dst), "--runner", "local", "--config", "ar",
                 "--set", f"model.cache_dir={model_cache}"]) == 0, capsys.readouterr().err[-3000:]
    _check(dst, names, text, skipped=0)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from shardscribe.actors.plan import init_ray
    from shardscribe.pipeline.config import load_config

    already = ray.is_initialized()
    init_ray(load_config("ar", ["ray.num_cpus=4"]))
    yield
    if not already:
        ray.shutdown()


@pytest.mark.parametrize("kind", ["folder", "manifest"])
def test_every_container_on_ray(inputs, kind, ray_session, model_cache, tmp_path, capsys):
    folder, manifest, names, text = inputs
    dst = tmp_path / "out"
    assert _run(["--input", str(folder if kind == "folder" else manifest), "--output", str(dst), "--config", "ar",
                 "--set", f"model.cache_dir={model_cache}"]) == 0, capsys.readouterr().err[-3000:]
    _check(dst, names, text, skipped=1 if kind == "folder" else 0)
