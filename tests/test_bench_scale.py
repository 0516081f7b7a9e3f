"""`shardscribe bench scale --quick`: the scaling bench on a simulated cluster (a head
without GPUs, worker nodes with fake GPUs), run in this process so that it cannot rot. The
report's structure, and every job's rows in = rows out with no duplicates and every row
decoded by the synthetic stage; never its speed (a shared machine's timings are no test)."""
from __future__ import annotations

import argparse
import json

import pytest

from shardscribe.jobs.bench import scale as bench_scale
from shardscribe.pipeline.kinds import DECODER_KINDS


@pytest.mark.slow
def test_quick_scale_bench_reports_every_configuration(tmp_path):
    import ray

    if ray.is_initialized():
        ray.shutdown()
    parser = argparse.ArgumentParser()
    bench_scale.add_arguments(parser)
    args = parser.parse_args([])
    args.quick = True
    result = bench_scale.run(args)
    json.dumps(result, default=float)
    rows, summary = result["rows"], result["summary"]

    assert [(r["nodes"], r["gpus_per_node"]) for r in rows] == list(bench_scale.QUICK_CONFIGS)
    for r in rows:
        assert r["gpus"] == r["nodes"] * r["gpus_per_node"]
        assert r["rows"] == summary["rows_per_gpu"] * r["gpus"]
        assert r["rows_per_s"] > 0 and r["efficiency"] > 0 and r["model_actors"] >= 1
    assert next(r for r in rows if r["gpus"] == 1)["efficiency"] == pytest.approx(1.0)

    assert len(summary["jobs"]) == len(rows) + 3   # the configurations, two driver-CPU sizes, two-stage
    for job in summary["jobs"]:
        assert job["rows_in"] == job["rows_out"] == job["decoded_rows"] > 0, job
        assert job["duplicates"] == 0 and job["errors"] == 0, job
    cpu = summary["driver_cpu"]
    assert cpu["rows"] == [200, 600] and all(s > 0 for s in cpu["cpu_s"])
    assert summary["driver_cpu_s_per_1000_rows"] is not None

    pending = summary["pending"]
    assert pending["rows"] == 48 and pending["pending_rows"] > 0
    assert pending["second_stage_batches"] > 0           # every row went through the second stage
    assert pending["driver_bytes_per_pending_row"] is not None and pending["bytes_source"]
    # The synthetic kinds were registered for the run only.
    assert bench_scale.KIND not in DECODER_KINDS and bench_scale.PENDING_KIND not in DECODER_KINDS
    assert not ray.is_initialized()
