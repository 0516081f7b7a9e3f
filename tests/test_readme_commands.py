"""The README's commands run as written.

Every fenced shell command of README.md is extracted (``&&`` chains split, continued lines
joined, comments dropped) and must be in ``PLAN``, which says what this test does with it:

- ``Run``: run in a scratch folder that holds the repository's ``pipeline/assets`` and
  ``.venv`` (so the README's relative paths work) with ``.venv/bin`` on the PATH, as a
  user with the venv active; the placeholders SRC and DST become the bundled samples and
  a folder of its own; exit 0 and the output checked. The commands run side by side, in
  chains where one needs another's output, which keeps the test near a minute.
- ``NotRun``: not run here, with why: ``NOT_RUN`` lists them.

The Python example is run as written by tests/test_python_api.py; here only that it is the
block that test runs. A README command missing from ``PLAN``, or a ``PLAN`` entry the
README no longer has, fails the first test, so the two never drift apart.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES

pytestmark = pytest.mark.slow       # whole jobs through the command line

README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SHELLS = {"bash", "sh", "shell", "console"}
MANIFEST = "pipeline/assets/samples/samples.jsonl"
N_SAMPLES = len((SAMPLES / "samples.jsonl").read_text().splitlines())


def readme_blocks() -> list[tuple[str, str]]:
    """(language, body) of each fenced block of README.md."""
    return FENCE.findall(README.read_text(encoding="utf-8"))


def shell_commands(body: str) -> list[str]:
    """The commands of a shell block: a line ending in a backslash, or followed by an
    indented one (a synopsis's wrapped options), continues; `&&` separates commands; a
    `#` after a space starts a comment."""
    lines: list[str] = []
    for raw in body.splitlines():
        if lines and (lines[-1].endswith("\\") or raw[:1].isspace()):
            lines[-1] = lines[-1].rstrip("\\").rstrip() + " " + raw.strip()
        elif raw.strip():
            lines.append(raw.strip())
    commands = []
    for line in lines:
        line = re.sub(r"\s+#.*$", "", line)
        commands += [c.strip() for c in line.split(" && ") if c.strip()]
    return commands


def readme_commands() -> list[str]:
    return [c for lang, body in readme_blocks() if lang in SHELLS for c in shell_commands(body)]


@dataclass
class Run:
    """Run ``command`` (the README's text with placeholders replaced) in the scratch
    folder; ``chain``: commands of one chain run in order (a report after its job);
    ``expect``: patterns (regular expressions) the output must hold."""
    command: str
    chain: str
    expect: list[str] = field(default_factory=list)
    cwd_root: bool = False       # run in the repository itself (the lint of the whole tree)


@dataclass
class NotRun:
    why: str
    check: str | None = None     # a file the command names, which must exist


SYNOPSIS = ("shardscribe transcribe --input SRC --output DST [--config NAME] [--model NAME|DIR|ID "
            "[--allow-download]] [--language CODE|auto|CODE,CODE] [--task transcribe|translate] [--set key=value ...] "
            "[--runner ray|local] [--format srt,vtt,json,tsv,txt,nemo] [--overwrite | --resume] [--print | --quiet] "
            "[--retry-errors] [--dry-run] [--verbose] [--progress-interval S] [--audio-column NAME] "
            "[--text-column NAME]")
QUICK_START = f".venv/bin/shardscribe transcribe --input {MANIFEST} --output out/samples"
VALIDATE = "shardscribe validate SRC"
REPORT = "shardscribe report DST"
BASE = ("shardscribe transcribe --config ar --set model.source=embedded-base --set model.language=auto "
        "--input SRC --output DST")


def as_written(command: str, src: str = MANIFEST, dst: str | None = None) -> str:
    """The README's ``command`` with its placeholders SRC and DST filled in, nothing else."""
    return command.replace("SRC", src).replace("DST", dst or "DST")


PLAN: dict[str, Run | NotRun] = {
    # Quick start: the install, then the job on the bundled samples (Ray, default config).
    "bash scripts/setup.sh": NotRun("installs system packages and the venv this test runs in", "scripts/setup.sh"),
    QUICK_START: Run(QUICK_START, "ray-job", [rf"rows +{N_SAMPLES} of {N_SAMPLES}\b", r"WER +\d",
                                               r"Read it: pandas\.read_parquet\("]),
    # The test suite: install, lint, every test.
    "bash scripts/setup.sh --test": NotRun("installs the lab (TTS engines, KenLM, Chromium)", "scripts/setup.sh"),
    ".venv/bin/ruff check .": Run(".venv/bin/ruff check .", "quick", [r"All checks passed!"], cwd_root=True),
    ".venv/bin/python -m pytest -q": NotRun("the whole suite, this test included (CI runs it)"),
    # The synopsis: its transcribe line, with no option taken, is the quick start's job.
    SYNOPSIS: NotRun("the synopsis of the transcribe options; with SRC and DST it is the quick start's "
                     "command, run above"),
    VALIDATE: Run(as_written(VALIDATE), "validate", [rf"validate: {N_SAMPLES} recordings, .* 0 unusable"]),
    REPORT: Run(as_written(REPORT, dst="out/samples"), "ray-job", [r"out/samples/__shardscribe__/report\.html"]),
    # Options picked from the brackets: the keep rule, and transcribe options that keep it
    # short (the CTC head's confidence comes with its greedy pass, no second decoder pass).
    "shardscribe pseudo-label --input SRC --output DST [--min-confidence C | --keep-fraction F] "
    "[transcribe options]": Run(f"shardscribe pseudo-label --input {MANIFEST} --output out/pseudo "
                                "--keep-fraction 0.8 --config ctc_greedy --runner local",
                                "quick", [rf"Pseudo-labels: kept \d+ of {N_SAMPLES} rows",
                                          r"out/pseudo/__pseudo_label/manifest\.jsonl"]),
    "shardscribe configs": Run("shardscribe configs", "quick", [r"(?m)^ *ssd\b", r"(?m)^ *ctc_beam\b"]),
    "shardscribe keys [SECTION]": Run("shardscribe keys && shardscribe keys ssd", "quick", [r"ssd\.preset"]),
    "shardscribe --version": Run("shardscribe --version", "quick", [r"(?m)^shardscribe \d+\.\d+"]),
    # Whisper options.
    "shardscribe transcribe --model ./whisper-small --config ar --input SRC --output DST --set model.language=auto":
        NotRun("needs a Whisper small checkpoint directory, which the repository does not ship and a test "
               "may not download; tests/test_whisper_options.py runs language=auto and the other Whisper "
               "options on multilingual checkpoint directories it builds"),
    # Whisper base, embedded: one bundled recording for SRC.
    BASE: Run(as_written(BASE, src="pipeline/assets/samples/fox_flite_slt.flac", dst="out/base"), "base",
              [r"rows +1 of 1\b", r"fox_flite_slt\.flac \[en\]: "]),
    # Running on a cluster.
    "ray job submit --address http://HEAD:8265 --working-dir . -- shardscribe transcribe --input "
    "s3://bucket/corpus/ --output s3://bucket/out/ --set ray.decode_actors=8":
        NotRun("needs a Ray cluster's head and an S3 bucket; tests/test_cluster.py submits a job with "
               "`ray job submit` to a head it starts, with RAY_ADDRESS only"),
}

NOT_RUN = {command: plan.why for command, plan in PLAN.items() if isinstance(plan, NotRun)}


def test_every_readme_command_is_planned():
    commands = readme_commands()
    assert len(commands) == len(set(commands)), commands
    assert sorted(commands) == sorted(PLAN), (sorted(set(commands) - set(PLAN)), sorted(set(PLAN) - set(commands)))
    for plan in PLAN.values():
        if isinstance(plan, NotRun) and plan.check:
            assert (ROOT / plan.check).is_file(), plan.check


def test_the_python_example_is_the_one_test_python_api_runs():
    import test_python_api

    blocks = [body for lang, body in readme_blocks() if lang == "python"]
    assert len(blocks) == 1 and test_python_api._readme_example() == blocks[0]
    assert callable(test_python_api.test_the_readme_python_example_runs_as_written)


def _scratch(tmp_path: Path) -> Path:
    """A folder where the README's relative paths resolve: the samples, the venv."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "assets").symlink_to(ROOT / "pipeline" / "assets", target_is_directory=True)
    (tmp_path / ".venv").symlink_to(ROOT / ".venv", target_is_directory=True)
    return tmp_path


def _run_chain(runs: list[Run], cwd: Path, env: dict) -> list[tuple[Run, subprocess.CompletedProcess, float]]:
    done = []
    for run in runs:
        start = time.monotonic()
        proc = subprocess.run(["bash", "-c", run.command], cwd=ROOT if run.cwd_root else cwd, env=env,
                              capture_output=True, text=True, timeout=600)
        done.append((run, proc, time.monotonic() - start))
        if proc.returncode != 0:
            break
    return done


def test_the_readme_commands_run_as_written(tmp_path):
    cwd = _scratch(tmp_path)
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    for key in ("RAY_ADDRESS", "SHARDSCRIBE_CACHE"):   # a user's shell: a local Ray, the user's cache
        env.pop(key, None)
    chains: dict[str, list[Run]] = {}
    for plan in PLAN.values():
        if isinstance(plan, Run):
            chains.setdefault(plan.chain, []).append(plan)
    start = time.monotonic()
    with ThreadPoolExecutor(len(chains)) as pool:
        results = [r for rs in pool.map(lambda runs: _run_chain(runs, cwd, env), chains.values()) for r in rs]
    wall = time.monotonic() - start
    timings = ", ".join(f"{r.command.split(' --')[0]} {s:.0f} s" for r, _, s in results)
    print(f"README commands: {len(results)} in {wall:.0f} s wall ({timings})")
    assert len(results) == sum(map(len, chains.values())), [r.command for r, _, _ in results]
    for run, proc, _ in results:
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, (run.command, out[-3000:])
        for pattern in run.expect:
            assert re.search(pattern, out), (run.command, pattern, out[-3000:])
    # Each job wrote where the README says, and its output reads back.
    import pandas as pd

    assert len(pd.read_parquet(cwd / "out" / "samples")) == N_SAMPLES
    assert (cwd / "out" / "samples" / "__shardscribe__" / "report.html").exists()
    assert (cwd / "out" / "pseudo" / "__pseudo_label" / "dataset").is_dir()
