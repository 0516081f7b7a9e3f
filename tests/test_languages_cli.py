"""The language flags of `shardscribe transcribe` on non-English speech (espeak-ng's
Spanish and French voices) with the multilingual embedded model: `--model base --language
auto` writes each row's detected language, and `model.language_candidates` keeps it to the
corpus's languages; a small job prints its transcripts and says where each output is; a
rerun with another config is refused naming the keys that differ; a hub id is downloaded
only when asked."""
from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from conftest import espeak
from test_whisper_base import CLIPS as BASE_CLIPS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Two sentences each: espeak-ng's French in one short sentence is detected as another
# language with plain auto (test_candidates_keep_a_short_french_row_french below).
CLIPS = {voice: text for voice, (text, _) in BASE_CLIPS.items()}


@pytest.fixture(scope="module")
def base_job(tmp_path_factory, model_cache):
    """One job over a Spanish and a French clip: (its output folder, exit code, stdout, the
    command's arguments)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    import contextlib
    import io

    from shardscribe.jobs.cli import main

    root = tmp_path_factory.mktemp("languages")
    audio = root / "audio"
    audio.mkdir()
    for voice, text in CLIPS.items():
        espeak(text, audio / f"{voice}.wav", voice=voice, speed=150)
    out = root / "out"
    args = ["transcribe", "--input", str(audio), "--output", str(out), "--runner", "local", "--model", "base",
            "--language", "auto", "--set", f"model.cache_dir={model_cache}"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(args)
    return out, code, stdout.getvalue(), args


def test_detected_language_on_each_row_and_transcripts_printed(base_job):
    out, code, stdout, _ = base_job
    assert code == 0, stdout
    rows = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    assert sorted(rows) == ["es.wav", "fr.wav"]
    for voice in CLIPS:
        row = rows[f"{voice}.wav"]
        assert row["error"] is None and row["language"] == voice, (row["language"], row["text"])
        # printed at the end: a job of fewer than 10 recordings shows its transcripts
        assert f"{voice}.wav [{voice}]: {' '.join(row['text'].split())}" in stdout
    assert "Buenos días" in rows["es.wav"]["text"] and "Bonjour" in rows["fr.wav"]["text"]
    # where each output is, and only readers that are installed
    assert f"summary: {out}/__shardscribe__/summary.json" in stdout
    assert "pyarrow.parquet.read_table" in stdout


def test_quiet_prints_no_transcripts_and_print_forces_them(base_job, capsys):
    from shardscribe.jobs.cli import main

    out, _, _, args = base_job
    assert main(args + ["--quiet"]) == 0      # every row already there: nothing runs
    text = capsys.readouterr().out
    assert "es.wav" not in text and "Output:" in text
    assert main(args + ["--print"]) == 0
    assert "es.wav [es]:" in capsys.readouterr().out


def test_other_config_is_refused_naming_the_keys(base_job, capsys):
    from shardscribe.jobs.cli import main

    out, _, _, args = base_job
    other = [a if a != "auto" else "es" for a in args]
    assert main(other) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "model.language auto -> es" in err and "by config ar (" in err, err


@pytest.mark.slow
def test_candidates_keep_a_short_french_row_french(tmp_path, model_cache):
    """"Le café est froid." alone, which plain auto detects as Chinese and decodes as
    Chinese (tests/test_language_detection.py), with the corpus's languages as candidates:
    a French row, in French."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    from shardscribe.jobs.cli import main
    from language_set import render

    audio = tmp_path / "audio"
    render(audio, ["fr_00.wav"])
    out = tmp_path / "out"
    assert main(["transcribe", "--input", str(audio), "--output", str(out), "--runner", "local", "--model", "base",
                 "--language", "es,fr", "--quiet", "--set", f"model.cache_dir={model_cache}"]) == 0
    [row] = pq.read_table(out).to_pylist()
    assert row["language"] == "fr" and row["language_prob"] > 0.9, row
    assert [s["language"] for s in row["segments"]] == ["fr"]
    assert "café" in row["text"].lower(), row["text"]


def test_readers_named_only_when_installed(monkeypatch):
    import importlib.util

    from shardscribe.jobs import console

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    lines = console.output_lines("/data/out", None, ["txt/"])
    assert "datasets" not in "\n".join(lines)
    assert "  formats: /data/out/txt/" in lines


def test_model_names_flags_and_download_key():
    from shardscribe.jobs.cli import build_parser
    from shardscribe.jobs.transcribe import spec_from_args
    from shardscribe.pipeline.config import config_hash, load_config

    args = build_parser().parse_args(["transcribe", "--input", "a", "--output", "b", "--model", "base",
                                      "--language", "fr", "--task", "translate", "--allow-download"])
    spec = spec_from_args(args)
    cfg = load_config(spec.config, list(spec.overrides), model=spec.model)
    assert (cfg.name, cfg.model.source, cfg.model.ctc_head) == ("ar", "embedded-base", None)
    assert (cfg.model.language, cfg.model.task, cfg.model.allow_download) == ("fr", "translate", True)
    # an execution key: the same rows, the same config
    assert config_hash(cfg) == config_hash(load_config(None, ["model.language=fr", "model.task=translate"],
                                                       model="base"))
    # --language es,fr: detection among these two only
    args = build_parser().parse_args(["transcribe", "--input", "a", "--output", "b", "--model", "base",
                                      "--language", "es, fr"])
    cfg = load_config(None, list(spec_from_args(args).overrides), model="base")
    assert (cfg.model.language, cfg.model.language_candidates) == ("auto", ["es", "fr"])
    tiny = load_config(None, model="tiny.en")
    assert (tiny.model.source, tiny.model.ctc_head) == ("embedded", "embedded")


def test_hub_id_is_downloaded_only_when_asked(tmp_path, samples_dir, capsys, monkeypatch):
    import huggingface_hub

    from shardscribe.jobs.cli import main

    calls = []

    def offline(repo_id, **kwargs):
        calls.append(repo_id)
        raise OSError("no network here")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    base = ["transcribe", "--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "o"),
            "--runner", "local", "--model", "nobody-here/whisper-nothing"]
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-download" in err and "hf download nobody-here/whisper-nothing" in err
    assert calls == []
    assert main(base + ["--allow-download"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "download (model.allow_download) failed" in err and "no network" in err, err
    assert calls == ["nobody-here/whisper-nothing"]
    assert not (tmp_path / "o").exists()
