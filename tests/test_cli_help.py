"""The command line explains itself: a version, the shipped configs, every key, and a
transcribe --help with examples and the common keys at the default config's values."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

from conftest import ROOT
from shardscribe.pipeline.config import load_config, shipped_configs


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_version():
    proc = _cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"shardscribe {version('shardscribe')}"


def test_configs_lists_each_shipped_config_once():
    proc = _cli("configs")
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and names == sorted(p.stem for p in (ROOT / "conf").glob("*.yaml"))
    assert names == list(shipped_configs())


def test_keys_prints_a_section_from_the_config_classes():
    proc = _cli("keys", "beam")
    assert proc.returncode == 0
    listed = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  beam.")]
    assert listed == [f"beam.{k}" for k in load_config("ctc_beam").to_dict()["beam"]]
    assert _cli("keys", "no_such_section").returncode == 2


def test_transcribe_help_has_examples_and_the_default_configs_values():
    proc = _cli("transcribe", "--help")
    assert proc.returncode == 0
    text = proc.stdout
    assert text.count("  shardscribe transcribe --input") == 3
    data = load_config("default").to_dict()
    for key in ("model.device", "model.language", "decoder.kind", "ssd.preset", "batching.recordings_per_batch",
                "audio.vad_threshold"):
        section, name = key.split(".")
        value = data[section][name]
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(key + " "))
        assert line.split("=", 1)[1].split()[0] == ("null" if value is None else str(value)), line


def test_every_command_summary_is_a_whole_sentence():
    proc = _cli("--help")
    summaries = " ".join(proc.stdout.split("positional arguments:")[1].split("options:")[0].split())
    for command in ("bench", "build-lm", "build-token-map", "make-bench-sets", "pseudo-label", "transcribe"):
        assert f" {command} " in summaries
    # each summary ends a sentence before the next command starts
    for command in ("build-token-map", "calibrate", "make-tts-corpus", "pseudo-label", "report"):
        before = summaries.split(f" {command} ", 1)[0].rstrip()
        assert before.endswith((".", "`.", ")", '."')), before[-80:]
