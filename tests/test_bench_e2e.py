"""`shardscribe bench e2e`: the model calls it records during the job are the job's (the
replay gives back the same segment texts, in the job's batches), every clip comes back,
and the table has the job's and the model's rows with RTFx from their own seconds."""
from __future__ import annotations

import argparse

import pytest


@pytest.mark.slow
def test_e2e_replays_the_jobs_own_model_calls(model_cache, monkeypatch):
    from shardscribe.jobs.bench import e2e

    replayed = []
    original = e2e.ModelCalls.replay

    def replay(self, threads):
        # The replay's first-stage results, against what the job decoded from the same calls.
        decode = self._decode
        self._decode = lambda *a, **k: replayed.append(decode(*a, **k)) or replayed[-1]
        try:
            return original(self, threads)
        finally:
            self._decode = decode

    monkeypatch.setattr(e2e.ModelCalls, "replay", replay)
    args = argparse.Namespace(manifest=None, quick=True, out=None, device=None, config="ctc_greedy",
                              model=None, overrides=[f"model.cache_dir={model_cache}", "batching.recordings_per_batch=2",
                                                     "batching.max_joined_blocks=1"],
                              runners="local", rounds=1, limit=5)
    result = e2e.run(args)
    summary, rows = result["summary"], result["rows"]
    assert summary["recordings"] == 5 and len(summary["texts"]) == 5
    assert all(summary["texts"].values())
    # 5 recordings in blocks of 2: three first-stage calls, replayed once each.
    assert summary["batches"] == 3 and len(replayed) == 3
    replay_texts = sorted(r.text for batch in replayed for r in batch)
    assert replay_texts == sorted(summary["texts"].values())
    by_what = {r["what"]: r for r in rows}
    model = next(r for w, r in by_what.items() if w.startswith("model alone"))
    job = by_what["job, local runner"]
    assert model["rtfx"] == pytest.approx(summary["audio_s"] / model["seconds"])
    assert job["vs_model"] == pytest.approx(summary["job_over_model"])
