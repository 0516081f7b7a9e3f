"""A job's progress counts rows as they finish: its first batches are small and grow
(``batching.first_batch``, pipeline.batching.slow_start), in the local runner and in the
Ray plan of a list or a files listing, a two-stage kind's slow-start rows are finished
batch by batch, and the in-process runner reports between batches too (the console's
elapsed time, the log's heartbeat). The piped console's first line: tests/test_console.py."""
from __future__ import annotations

import time

import pytest

from conftest import sample_copies
from shardscribe.pipeline.batching import slow_start


@pytest.mark.parametrize("first, full, sizes", [
    (1, 16, [1, 2, 4, 9]), (1, 64, [1, 2, 4, 8, 16, 33]), (1, 2, [1, 1]), (1, 1, [1]), (4, 16, [4, 12]),
    (16, 16, [16]), (32, 16, [16]),
])
def test_the_slow_start_is_a_few_growing_batches_of_the_first_full_one(first, full, sizes):
    assert slow_start(first, full) == sizes


def test_input_batches_grow_and_keep_every_row_in_order(tmp_path):
    from shardscribe.pipeline.sources import input_batches, open_source, scan

    rows = [{"id": f"r{i}", "audio": f"/nowhere/r{i}.flac"} for i in range(40)]
    batches = list(input_batches(rows, 16, first_batch=1))
    assert [b.num_rows for b in batches] == [1, 2, 4, 9, 16, 8]
    assert [r["id"] for b in batches for r in b.to_pylist()] == [r["id"] for r in rows]
    assert [b.num_rows for b in input_batches(rows, 16)] == [16, 16, 8]
    assert [b.num_rows for b in input_batches(rows[:5], 16, first_batch=1)] == [1, 2, 2]

    source = open_source(str(sample_copies(tmp_path, 20)))
    streamed = list(input_batches(source, 16, scan(source).items, first_batch=1))
    assert [b.num_rows for b in streamed] == [1, 2, 4, 9, 4]
    whole = [r["id"] for b in input_batches(source, 16) for r in b.to_pylist()]
    assert [r["id"] for b in streamed for r in b.to_pylist()] == whole and len(whole) == 20


def _job(tmp_path, runner: str, overrides: list[str], with_summary: bool = False) -> tuple:
    """A job over 16 copies of the bundled samples, batching.recordings_per_batch=16; its
    progress reports with the time each came, and the time it started."""
    from shardscribe.actors.job import JobSpec, run_job

    clips = tmp_path / "clips"
    clips.mkdir()
    sample_copies(clips, 16)
    seen = []
    spec = JobSpec(str(clips), str(tmp_path / "out"), runner=runner,
                   overrides=["batching.recordings_per_batch=16", *overrides])
    start = time.monotonic()
    summary = run_job(spec, on_progress=lambda p: seen.append((time.monotonic(), p)), log=lambda line: None)
    assert summary["rows_out"] == 16 and summary["errors"] == 0
    return (seen, start, summary) if with_summary else (seen, start)


def _running_counts(seen) -> list[int]:
    return sorted({p.rows for _, p in seen if not p.final and 0 < p.rows < 16})


@pytest.mark.slow
def test_a_local_job_counts_rows_as_they_finish(tmp_path, model_cache):
    """The default config (a two-stage kind: most of these rows go to its second stage),
    one batch's worth of recordings: rows show as they finish, in several steps, the first
    well before the end, and reports keep coming while a batch runs."""
    seen, start = _job(tmp_path, "local", [f"model.cache_dir={model_cache}"])
    counts = _running_counts(seen)
    assert len(counts) >= 3, [(round(t - start, 1), p.rows) for t, p in seen]
    rows = [p.rows for _, p in seen]
    assert rows == sorted(rows)
    end = seen[-1][0]
    first = next(t for t, p in seen if p.rows)
    # Loading (on a fresh cache converting) the model comes before any row: a share of the whole job.
    assert end - first > 0.4 * (end - start), (first - start, end - start)
    gaps = [b - a for (a, _), (b, _) in zip(seen, seen[1:-1])]
    assert max(gaps) < 5.0, max(gaps)


@pytest.mark.slow
def test_the_ray_plan_of_a_listing_starts_with_small_blocks(tmp_path, model_cache):
    """Ray Data would bundle small blocks back into whole batches (a map's batch_size):
    the listing's first blocks must reach the driver as they are. The default config's
    rows mostly go to its second pool, which finishes those of the slow start's blocks
    once priced (trigger ``start``) rather than holding them for a full budget (these 16
    rows' segments fit one) or ``second_stage.max_wait_s``."""
    seen, _, summary = _job(tmp_path, "ray", [f"model.cache_dir={model_cache}",
                                             "second_stage.max_wait_s=600"], with_summary=True)
    assert len(_running_counts(seen)) >= 3, [p.rows for _, p in seen]
    triggers = summary["second_stage"]["by_trigger"]
    assert triggers["start"]["calls"] >= 2 and "wait" not in triggers, triggers
