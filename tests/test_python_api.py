"""A job from Python (jobs.api, over actors.job.run_job): the README's example runs as
written, a refused job raises JobError before anything is written, and the facade with
an override transcribes as the command line with the same --set does."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from conftest import ROOT, SAMPLES


def _readme_example() -> str:
    """The first ```python block of README.md."""
    found = re.search(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S | re.M)
    assert found, "README.md has no ```python block (the Python example)"
    return found.group(1)


def _parquet_rows(dst) -> list[dict]:
    return pq.read_table(str(dst)).to_pylist()    # every part; the sidecar folder is skipped


def test_the_readme_python_example_runs_as_written(tmp_path, model_cache):
    """The block runs unchanged in a folder of its own: the sample path it names is there
    (a link to the repository's assets), its output lands in that folder, and it prints
    the rows and the WER of a job that wrote every row of the manifest."""
    code = _readme_example()
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "assets").symlink_to(ROOT / "pipeline" / "assets", target_is_directory=True)
    (tmp_path / "example.py").write_text(code)
    # The repository on the path, and the converted checkpoint in this session's cache
    # rather than the user's.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SHARDSCRIBE_CACHE": str(model_cache)}
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = len((SAMPLES / "samples.jsonl").read_text().splitlines())
    printed = proc.stdout.split()
    assert printed[0] == str(n), proc.stdout
    out = tmp_path / re.search(r'"(out/[^"]+)"', code).group(1)
    rows = _parquet_rows(out)
    assert len(rows) == n and all(r["error"] is None and r["text"] for r in rows)
    summary = json.loads((out / "__shardscribe__" / "summary.json").read_text())
    assert summary["rows_out"] == n and float(printed[1]) == summary["wer"]


def test_a_bad_config_raises_job_error_and_writes_nothing(tmp_path):
    from shardscribe.jobs.api import JobError, transcribe

    dst = tmp_path / "out"
    with pytest.raises(JobError, match=r"decoder\.max_new_tokenz: unknown key") as info:
        transcribe(str(SAMPLES / "samples.jsonl"), str(dst), config="ar", runner="local", decoder__max_new_tokenz=5)
    assert info.value.code == 2 and "\n" not in str(info.value)
    with pytest.raises(JobError, match=r"decoder\.max_new_tokens: must be >= 1"):
        transcribe(str(SAMPLES / "samples.jsonl"), str(dst), config="ar", runner="local",
                   set={"decoder.max_new_tokens": 0})
    assert not dst.exists()


def test_the_facade_transcribes_as_the_cli_with_the_same_set(tmp_path, model_cache):
    """runner="local" and decoder.max_new_tokens as a keyword: the same config (hash) and
    the same texts as a separate `shardscribe transcribe --set` process."""
    from shardscribe.jobs.api import transcribe

    lines = (SAMPLES / "samples.jsonl").read_text().splitlines()[:3]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({**json.loads(x), "audio": str(SAMPLES / json.loads(x)["audio"])}) + "\n"
                                for x in lines))
    sets = {"model.cache_dir": str(model_cache), "decoder.max_new_tokens": 6}
    api_out, cli_out = tmp_path / "api", tmp_path / "cli"
    summary = transcribe(str(manifest), str(api_out), config="ar", runner="local",
                         set={"model.cache_dir": str(model_cache)}, decoder__max_new_tokens=6)
    proc = subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "transcribe", "--input", str(manifest), "--output",
                           str(cli_out), "--config", "ar", "--runner", "local",
                           *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cli_summary = json.loads((cli_out / "__shardscribe__" / "summary.json").read_text())
    assert summary == json.loads((api_out / "__shardscribe__" / "summary.json").read_text())
    assert summary["rows_out"] == cli_summary["rows_out"] == len(lines)
    assert summary["config_hash"] == cli_summary["config_hash"]
    api_texts = {r["id"]: r["text"] for r in _parquet_rows(api_out)}
    cli_texts = {r["id"]: r["text"] for r in _parquet_rows(cli_out)}
    assert api_texts == cli_texts and all(api_texts.values())
    # The override took: six tokens are fewer words than the references hold.
    references = {json.loads(x)["id"]: json.loads(x)["text"] for x in lines}
    assert all(len(api_texts[i].split()) < len(ref.split()) for i, ref in references.items())


AUDIT = {"decoder.kind": "audit", "model.device": "cpu"}    # every step of a job but the model


def test_run_job_reports_through_its_callbacks(tmp_path):
    """actors.job.run_job with a callable for its lines and one for its progress: no
    console of the command line's, the summary returned is summary.json's."""
    from shardscribe.actors.job import JobProgress, JobSpec, run_job

    lines, progress = [], []
    dst = tmp_path / "out"
    spec = JobSpec(str(SAMPLES / "samples.jsonl"), str(dst), runner="local", formats=["json"],
                   overrides=[f"{k}={v}" for k, v in AUDIT.items()])
    summary = run_job(spec, on_progress=progress.append, log=lines.append)
    n = len((SAMPLES / "samples.jsonl").read_text().splitlines())
    assert summary == json.loads((dst / "__shardscribe__" / "summary.json").read_text())
    assert summary["rows_out"] == n and summary["log"] is None and summary.written == ["__json/"]
    assert lines == [f"shardscribe: validating {n} recordings with config {summary['config']} (local runner)"]
    assert progress[0] == JobProgress(n, 0, 0.0, 0) and progress[-1].final and progress[-1].rows == n
    again = run_job(spec, log=lines.append)          # everything is there: nothing to run
    assert again["run_rows"] == 0 and lines[-2].startswith(f"shardscribe: resuming: {n} of {n}")


def test_the_pseudo_label_facade_runs_the_job_and_the_exports(tmp_path):
    from shardscribe.jobs.api import JobError, pseudo_label

    pytest.importorskip("matplotlib")
    dst = tmp_path / "out"
    with pytest.raises(JobError, match="--keep-fraction: must be in"):
        pseudo_label(str(SAMPLES / "samples.jsonl"), str(dst), runner="local", keep_fraction=0, set=AUDIT)
    assert not dst.exists()
    result = pseudo_label(str(SAMPLES / "samples.jsonl"), str(dst), runner="local", keep_fraction=0.5, set=AUDIT)
    n = len((SAMPLES / "samples.jsonl").read_text().splitlines())
    assert result["summary"]["rows_out"] == result["report"]["rows"] == n
    assert all(os.path.exists(url) for url in result["written"])
    assert any(url.endswith("manifest.jsonl") for url in result["written"])
