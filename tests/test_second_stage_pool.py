"""The second stage's pool (pipeline.pending_pool): pending rows of a two-stage decoder
kind collected across batches into full token-budget batches, in both runners
(actors.local_runner, and on Ray the model actor's own loop: actors.stage_loop), with the
transcripts of the unpooled stage (``second_stage.pooled=false``: each batch's own pending rows)."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from shardscribe.pipeline.pending_pool import PendingPool, SecondStageStats


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_full_batches_leave_at_once_the_rest_waits():
    pool = PendingPool(max_tokens=4, max_wait_s=10.0, max_pending_segments=100, clock=Clock())
    for k in range(3):
        pool.add(k, [1])
    assert pool.take() == [] and pool.segments == 3
    pool.add(3, [1])
    pool.add(4, [1])
    (batch,) = pool.take()
    assert batch.trigger == "full" and batch.keys == [0, 1, 2, 3] and batch.segments == 4
    assert pool.segments == 1 and len(pool) == 1


def test_the_wait_the_end_and_the_bound_flush_a_partial_batch():
    clock = Clock()
    pool = PendingPool(max_tokens=8, max_wait_s=5.0, max_pending_segments=100, clock=clock)
    pool.add("a", [2])
    clock.t = 4.9
    assert pool.take() == []
    clock.t = 5.0
    (batch,) = pool.take()
    assert batch.trigger == "wait" and batch.waits == [5.0]
    pool.add("b", [2])
    assert [b.trigger for b in pool.take(drain=True)] == ["bound"]
    pool.add("s", [2])
    assert [b.trigger for b in pool.take(start=True)] == ["start"]
    pool.add("c", [2])
    assert [b.trigger for b in pool.take(final=True)] == ["end"]
    assert pool.segments == 0 and pool.take(final=True) == []


def test_rows_stay_whole_widest_first_and_oldest_first_among_equals():
    clock = Clock()
    pool = PendingPool(max_tokens=9, max_wait_s=100.0, max_pending_segments=100, clock=clock)
    pool.add("old", [3, 3])      # a row of two segments
    clock.t = 1
    pool.add("new", [3])
    clock.t = 2
    pool.add("newest", [3])
    clock.t = 3
    pool.add("long", [6])        # with anything else it pads past the budget
    batches = pool.take(final=True)
    assert [b.keys for b in batches] == [["long"], ["old", "new"], ["newest"]]
    assert [b.trigger for b in batches] == ["full", "full", "end"]
    # the wait of each segment: two for the row of two
    assert batches[1].waits == [3, 3, 2]


def test_the_wait_counts_only_what_is_left_after_the_full_batches():
    """Rows that waited long leave in a full batch first; the partial rest, just arrived,
    keeps waiting (a slow block does not turn every batch into a partial one)."""
    clock = Clock()
    pool = PendingPool(max_tokens=4, max_wait_s=5.0, max_pending_segments=100, clock=clock)
    for k in range(3):
        pool.add(k, [1])
    clock.t = 60.0
    for k in range(3, 6):
        pool.add(k, [1])
    (batch,) = pool.take()
    assert batch.trigger == "full" and batch.keys == [0, 1, 2, 3]


def test_stats_count_calls_segments_waits_and_the_budget_share():
    stats = SecondStageStats(max_tokens=24000)
    stats.record_call(16, 1500, "full")
    stats.record_call(4, 1500, "end")
    stats.record_waits([1.0, 3.0])
    d = stats.as_dict()
    assert d["calls"] == 2 and d["segments"] == 20 and d["mean_segments_per_call"] == 10.0
    assert d["max_segments_per_call"] == 16 and d["mean_wait_s"] == 2.0
    assert d["budget_segments_per_call"] == 16.0
    assert d["by_trigger"]["full"] == {"calls": 1, "segments": 16, "mean_segments_per_call": 16.0}
    assert SecondStageStats().as_dict()["calls"] == 0


def test_second_stage_keys_do_not_enter_the_config_hash():
    from shardscribe.pipeline.config import config_hash, load_config
    from shardscribe.pipeline.config_values import ConfigError

    base = load_config("ssd")
    other = load_config("ssd", ["second_stage.pooled=false", "second_stage.max_wait_s=1",
                                "second_stage.max_pending_segments=7"])
    assert other.second_stage.pooled is False and other.second_stage.max_pending_segments == 7
    assert config_hash(base) == config_hash(other)
    for bad in ("second_stage.max_wait_s=-1", "second_stage.max_pending_segments=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            load_config("ssd", [bad])


# A mixed set: the bundled samples twice (distinct ids); ssd's high_rtfx preset gates some
# and sends the others to the AR fallback. Blocks of 2 recordings, a budget of 4 Whisper
# segments (4 x 1500 encoder frames): unpooled, a call gets a block's 0-2 rejected rows.
# No slow start (first_batch = recordings_per_batch): its first batches are finished one by
# one (trigger "start"), which these counts of pooled calls leave out.
MIXED = ["ssd.preset=high_rtfx", "ssd.adaptive_verify=false", "model.encoder_dtype=float32", "model.quantize=none",
         "batching.recordings_per_batch=2",
         "batching.first_batch=2", "batching.max_tokens=6000"]
BUDGET_SEGMENTS = 4


def _manifest(samples_dir, tmp_path, copies: int = 2):
    from shardscribe.pipeline.sources import read_source

    lines = [json.loads(x) for x in (samples_dir / "samples.jsonl").read_text().splitlines()]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps({"id": f"{x['id']}-{c}", "audio": str(samples_dir / x["audio"])}) + "\n"
                            for c in range(copies) for x in lines))
    return read_source(str(path))


def _texts(dst):
    return {r["id"]: (r["text"], r["stage"], [s["stage"] for s in r["segments"]])
            for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}


def _assert_pooled_fills_the_budget(stats: dict, rejected: int):
    assert stats["segments"] == rejected > BUDGET_SEGMENTS
    full = stats["by_trigger"]["full"]
    assert full["calls"] == rejected // BUDGET_SEGMENTS
    assert full["mean_segments_per_call"] >= 0.75 * stats["budget_segments_per_call"] == 0.75 * BUDGET_SEGMENTS
    # every call but the last (the end of the input) is full
    assert stats["calls"] - full["calls"] <= 1 and stats["max_segments_per_call"] == BUDGET_SEGMENTS


def test_pooled_and_unpooled_transcripts_and_batches_in_both_runners(samples_dir, tmp_path, model_cache):
    """One mixed set through both runners, pooled and not: the same transcripts everywhere;
    unpooled calls get one block's rejected rows, pooled calls fill the budget."""
    import ray

    from shardscribe.actors.local_runner import build_stages, run_local
    from shardscribe.actors.plan import init_ray, run_ray
    from shardscribe.pipeline.config import load_config

    rows = _manifest(samples_dir, tmp_path)
    cache = f"model.cache_dir={model_cache}"
    configs = {"pooled": load_config("ssd", MIXED + [cache, "second_stage.max_wait_s=600"]),
               "unpooled": load_config("ssd", MIXED + [cache, "second_stage.pooled=false"])}
    stages = build_stages(configs["pooled"])
    stats = {}
    for name, cfg in configs.items():
        run_local(rows, cfg, str(tmp_path / f"local_{name}"), progress=False, stages=stages,
                  on_second_stage=lambda s, name=name: stats.update({f"local_{name}": s}))
    already = ray.is_initialized()
    try:
        for name, cfg in configs.items():
            init_ray(cfg)
            seen = {}
            stats[f"ray_{name}"] = run_ray(rows, cfg, str(tmp_path / f"ray_{name}"), on_second_stage=seen.update)
            assert seen == stats[f"ray_{name}"]
    finally:
        if not already:
            ray.shutdown()
    base = _texts(tmp_path / "local_unpooled")
    rejected = sum(st.count("ar_fallback") for _, _, st in base.values())
    assert 0 < rejected < len(rows), base            # some rows rejected, some not
    for run in ("local_pooled", "ray_pooled", "ray_unpooled"):
        assert _texts(tmp_path / run) == base, run
    for runner in ("local", "ray"):
        # unpooled: one call per model-stage batch with a rejected row (blocks of 2 rows
        # joined until their segments fill the budget), at most a budget's segments each
        unpooled = stats[f"{runner}_unpooled"]
        assert unpooled["max_segments_per_call"] <= BUDGET_SEGMENTS and set(unpooled["by_trigger"]) == {"block"}, runner
        _assert_pooled_fills_the_budget(stats[f"{runner}_pooled"], rejected)


def test_the_closing_table_shows_the_second_stage_mean_batch():
    from shardscribe.jobs.console import summary_table

    summary = {"rows_in": 2, "rows_out": 2, "errors": 0, "stages": {}, "audio_seconds": 1.0, "wall_seconds": 1.0,
               "second_stage": {"calls": 3, "segments": 40, "mean_segments_per_call": 13.333,
                                "max_segments_per_call": 16, "mean_wait_s": 2.5}}
    text = "\n".join(summary_table(summary))
    assert "second stage  40 segments in 3 calls (mean 13.3, max 16 a call; mean wait 2.5 s)" in text, text
    assert "second stage" not in "\n".join(summary_table(dict(summary, second_stage=None)))
    one = dict(summary["second_stage"], calls=1, segments=7, mean_segments_per_call=7.0, max_segments_per_call=7)
    assert "7 segments in 1 call (mean 7.0" in "\n".join(summary_table(dict(summary, second_stage=one)))


@pytest.fixture
def toy_two_stage():
    """tests/faults/fault_toy.py's kinds (no model): ``fault_toy2`` leaves the segments
    longer than 3 s pending for a second stage that returns their text."""
    import sys
    from pathlib import Path

    from shardscribe.pipeline.kinds import DECODER_KINDS
    from shardscribe.pipeline.models import FAMILIES

    sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))
    import fault_toy

    DECODER_KINDS[fault_toy.KIND2.name] = fault_toy.KIND2
    FAMILIES[fault_toy.FAMILY.name] = fault_toy.FAMILY
    yield fault_toy
    DECODER_KINDS.pop(fault_toy.KIND2.name, None)
    FAMILIES.pop(fault_toy.FAMILY.name, None)
    sys.path.remove(str(Path(__file__).resolve().parent / "faults"))


@pytest.mark.parametrize("extra, trigger", [(["second_stage.max_pending_segments=3"], "bound"),
                                            (["second_stage.max_wait_s=0"], "wait")])
def test_the_local_buffer_is_bounded_and_drops_nothing(toy_two_stage, samples_dir, tmp_path, extra, trigger):
    """A budget the pool never fills: the bound (or a wait of 0) empties the buffer
    before the next batch is read; every row comes out once, the pending ones finished."""
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config

    rows = _manifest(samples_dir, tmp_path, copies=3)
    cfg = load_config("ar", ["decoder.kind=fault_toy2", "model.family=fault_family", "batching.recordings_per_batch=2",
                             "batching.first_batch=2", "batching.max_tokens=1000"] + extra)
    stats = {}
    assert run_local(rows, cfg, str(tmp_path / "out"), progress=False, on_second_stage=stats.update) == len(rows)
    out = pq.read_table(sorted(str(p) for p in (tmp_path / "out").glob("*.parquet"))).to_pylist()
    assert sorted(r["id"] for r in out) == sorted(r["id"] for r in rows)
    second = [r for r in out if r["stage"] == toy_two_stage.SECOND_STAGE]
    assert second and all(r["text"] and r["error"] is None for r in out)
    assert stats["segments"] == len(second) and set(stats["by_trigger"]) <= {trigger, "end"}
    assert stats["by_trigger"][trigger]["calls"] >= 1
    if trigger == "bound":
        # never more than the bound held, plus the one batch that reached it (2 rows)
        assert stats["max_segments_per_call"] <= 3 + 2
