"""CPU threads per stage: a model stage runs its torch ops on model.num_threads, else
OMP_NUM_THREADS (Ray's CPU share), else every CPU the process may use; the VAD on one, in
whichever thread it runs (a row's reader thread starts at torch's default count, and in the
in-process runner it runs beside the model stage); and no stage leaves its count behind for
another. Importing silero-vad sets the count to 1 for the whole process, which once made
the in-process job run its model on one thread of two."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
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
    code = ("import torch; torch.set_num_threads(3); from shardscribe.pipeline.segment import VadSegmenter; "
            "VadSegmenter(); print(torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "3"


def test_the_vad_runs_on_one_thread_in_any_thread(monkeypatch):
    with torch_threads():   # its import sets the process's count to 1
        import silero_vad

    from shardscribe.pipeline.segment import VadSegmenter

    seen = []
    real = silero_vad.get_speech_timestamps

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(silero_vad, "get_speech_timestamps", spy)
    vad = VadSegmenter()
    audio = np.zeros(16000 * 40, np.float32)
    reader = threading.Thread(target=vad.speech_spans, args=(audio,))   # as a row's reader runs it
    reader.start()
    reader.join()
    with torch_threads(2):
        vad.speech_spans(audio)
        assert torch.get_num_threads() == 2
    assert seen == [1, 1]


def test_in_process_stages_each_run_on_their_own_thread_count(monkeypatch, samples_dir, tmp_path, model_cache):
    import shardscribe.actors.transcriber as transcriber
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.sources import read_source

    seen = {"model": set()}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen[name].add(torch.get_num_threads())
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(transcriber, "transcribe_prepared", spy("model", transcriber.transcribe_prepared))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")     # as Ray sets it for an actor of 3 CPUs
    before = torch.get_num_threads()
    rows = read_source(str(samples_dir / "samples.jsonl"))[:2]
    written = run_local(rows, load_config("ctc_greedy", [f"model.cache_dir={model_cache}"]), str(tmp_path / "out"),
                        progress=False)
    assert written == 2
    assert seen["model"] == {3}
    assert torch.get_num_threads() == before
