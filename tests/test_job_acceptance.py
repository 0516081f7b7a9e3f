"""A small job on a real local Ray instance, as a new user runs it: a quiet console (under
30 lines, no warning, no error-level line) that ends with the summary table; an output
folder that pandas and Hugging Face datasets load whole, one schema in every part (an
all-error part included), the config of every row recorded, subtitle files beside; and a
rerun with another config refused unless --resume or --overwrite."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest
import srt

from conftest import ROOT
from shardscribe.pipeline.config import config_hash, load_config
from shardscribe.pipeline.output import SIDECAR_DIR, SUCCESS_NAME, SUMMARY_NAME
from shardscribe.pipeline.records import OUTPUT_SCHEMA

ERROR_LEVEL = re.compile(r"\bERROR\b|\] ?E \d|^\[[^\]]* E |Traceback|error:", re.MULTILINE)


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def job(tmp_path_factory, samples_dir, sample_manifest, model_cache):
    root = tmp_path_factory.mktemp("accept")
    (root / "empty.wav").write_bytes(b"")
    # Two broken files first: with two recordings per block and per part they make an all-error part.
    lines = [{"id": "empty.wav", "audio": str(root / "empty.wav")},
             {"id": "missing.wav", "audio": str(root / "missing.wav")}]
    lines += [{"id": m["id"], "audio": str(samples_dir / m["audio"]), "text": m["text"]} for m in sample_manifest[:2]]
    manifest = root / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    dst = root / "out"
    overrides = ["batching.recordings_per_batch=2", "output.rows_per_part=2", f"model.cache_dir={model_cache}"]
    args = ["--input", str(manifest), "--output", str(dst)] + [a for o in overrides for a in ("--set", o)]
    proc = _cli(*args, "--config", "ar", "--format", "srt,vtt,json,tsv,nemo")
    return {"proc": proc, "dst": dst, "args": args, "n": len(lines), "hash": config_hash(load_config("ar", overrides)),
            "overrides": overrides}


def _succeeded(job):
    proc = job["proc"]
    log = job["dst"] / SIDECAR_DIR / "transcribe.log"
    detail = log.read_text()[-3000:] if log.exists() else ""
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:], detail)
    return proc


def test_console_is_quiet_and_ends_with_the_table(job):
    proc = _succeeded(job)
    console = proc.stdout + proc.stderr
    lines = console.splitlines()
    assert len(lines) < 30, console
    assert "warning" not in console.lower(), console
    assert not ERROR_LEVEL.search(console), console
    labels = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert labels[:5] == ["rows", "errors", "stages", "audio", "wall"] and "WER" in labels, proc.stdout
    assert re.search(r"^  errors +2: (empty 1, missing 1|missing 1, empty 1)$",
                     proc.stdout, re.MULTILINE), proc.stdout
    assert re.search(r"^  WER +\d+\.\d % over 2 rows", proc.stdout, re.MULTILINE), proc.stdout
    assert f"Output: {job['dst']}" in proc.stdout and "Read it: pandas.read_parquet(" in proc.stdout
    # Ray's own lines went to the log in the output folder.
    log = (job["dst"] / SIDECAR_DIR / "transcribe.log").read_text()
    assert "ModelActor" in log and str(job["dst"] / SIDECAR_DIR / "transcribe.log") in proc.stderr


def test_standard_readers_load_every_row_with_one_schema(job, tmp_path, monkeypatch):
    import datasets

    _succeeded(job)
    dst, n = job["dst"], job["n"]
    assert len(pd.read_parquet(dst)) == n
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    loaded = datasets.load_dataset("parquet", data_dir=str(dst), split="train", cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == n and sorted(loaded["id"]) == sorted(pd.read_parquet(dst)["id"])
    parts = sorted(dst.glob("*.parquet"))
    tables = [pq.read_table(p) for p in parts]
    assert any(t.num_rows and t.column("error").null_count == 0 for t in tables), "no all-error part"
    for part, t in zip(parts, tables):
        assert t.schema.equals(OUTPUT_SCHEMA, check_metadata=False), (part, t.schema)
    rows = pd.read_parquet(dst)
    assert set(rows["config_hash"]) == {job["hash"]}
    summary = json.loads((dst / SUMMARY_NAME).read_text())
    assert summary["rows_out"] == n and summary["config_hash"] == job["hash"]


def test_subtitles_and_manifest_are_written(job):
    _succeeded(job)
    dst = job["dst"]
    rows = pd.read_parquet(dst).set_index("id")
    for rid in rows.index:
        cues = list(srt.parse((dst / "__srt" / f"{rid}.srt").read_text()))
        if pd.isna(rows.loc[rid, "error"]):
            assert " ".join(c.content.replace("\n", " ") for c in cues) == rows.loc[rid, "text"].strip()
        else:
            assert cues == []
    nemo = [json.loads(line) for line in (dst / "__nemo" / "manifest.nemo.jsonl").read_text().splitlines()]
    assert sorted(x["id"] for x in nemo) == sorted(rows.index[rows["duration_s"].notna()])
    assert all(isinstance(x["duration"], float) for x in nemo)


def test_a_rerun_with_another_config_is_refused_unless_asked(job):
    _succeeded(job)
    dst, args = job["dst"], job["args"]
    refused = _cli(*args, "--config", "ctc_greedy")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "another config" in refused.stderr and "--overwrite" in refused.stderr and "--resume" in refused.stderr
    # A refusal changes nothing: the finished job's marker stays for whoever waits on it.
    assert (dst / SUCCESS_NAME).exists()
    kept = _cli(*args, "--config", "ctc_greedy", "--resume", "--runner", "local")
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert "(0 this run, 4 already there)" in kept.stdout
    assert set(pd.read_parquet(dst)["config_hash"]) == {job["hash"]}
    redo = _cli(*args, "--config", "ctc_greedy", "--overwrite", "--runner", "local")
    assert redo.returncode == 0, redo.stderr[-2000:]
    rows = pd.read_parquet(dst)
    assert len(rows) == job["n"]
    assert set(rows["config_hash"]) == {config_hash(load_config("ctc_greedy", job["overrides"]))}
    assert set(rows["stage"]) == {"ctc_greedy", "error"}
