"""CPU threads per stage: a model stage runs its torch ops on model.num_threads, else
OMP_NUM_THREADS (Ray's CPU share), else every CPU the process may use; the audio stage on
one (in the in-process runner, where it runs in a thread beside the model stage, on the
count it finds); and neither leaves its count behind for the other (torch's count is process-wide,
and the in-process runner runs every stage in one process). Importing silero-vad sets the
count to 1 for the whole process, which once made the in-process job run its model on one
thread of two."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from shardscribe.pipeline.device import torch_threads, worker_threads

ROOT = Path(__file__).resolve().parents[1]


def test_worker_threads_takes_the_config_then_omp_then_the_cpus_it_may_use(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_threads(5) == 5
    assert worker_threads(0) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert worker_threads(0) == len(os.sched_getaffinity(0))


def test_torch_threads_puts_the_count_back():
    before = torch.get_num_threads()
    with torch_threads(before + 2):
        assert torch.get_num_threads() == before + 2
        torch.set_num_threads(1)   # what a library might do inside
    assert torch.get_num_threads() == before


def test_building_the_vad_keeps_the_process_thread_count():
    # A fresh interpreter: silero-vad's import-time setting happens once per process.
    code = ("import torch; torch.set_num_threads(3); from pipeline.segment import VadSegmenter; "
            "VadSegmenter(); print(torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "3"


def test_in_process_stages_each_run_on_their_own_thread_count(monkeypatch, samples_dir, tmp_path, model_cache):
    import shardscribe.actors.audio_prep as audio_prep
    import shardscribe.actors.transcriber as transcriber
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.sources import read_source

    seen = {"prep": set(), "model": set()}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen[name].add(torch.get_num_threads())
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(audio_prep, "prepare_row_within", spy("prep", audio_prep.prepare_row_within))
    monkeypatch.setattr(transcriber, "transcribe_prepared", spy("model", transcriber.transcribe_prepared))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")     # as Ray sets it for an actor of 3 CPUs
    before = torch.get_num_threads()
    rows = read_source(str(samples_dir / "samples.jsonl"))[:2]
    written = run_local(rows, load_config("ctc_greedy", [f"model.cache_dir={model_cache}"]), str(tmp_path / "out"),
                        progress=False)
    assert written == 2
    # The in-process runner prepares audio in a thread beside the model stage
    # (pipeline.prefetch), where setting torch's process-wide count would set the model's:
    # the audio stage leaves it as it is (the process's before the model stage first runs,
    # the model's after), and the model stage always runs on its own.
    assert seen["model"] == {3} and seen["prep"] <= {before, 3}
    assert before != 1
    assert torch.get_num_threads() == before
