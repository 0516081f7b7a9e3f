"""`shardscribe bench NAME`: every name the command lists is a benchmark that runs (a
module of jobs/bench/ with ``run``), the shared modules are not listed, and an unknown
name is an exit 2 with the list."""
from __future__ import annotations

import importlib

from shardscribe.jobs import bench
from shardscribe.jobs.cli import main


def test_every_listed_benchmark_has_run():
    names = bench.available()
    assert {"ar", "confidence", "ctc-beam", "e2e", "engines", "lm", "regimes", "ssd", "token-map", "transducer"} <= set(names)
    assert not set(names) & {n.replace("_", "-") for n in bench.SHARED}
    for name in names:
        module = importlib.import_module(f"shardscribe.jobs.bench.{name.replace('-', '_')}")
        assert callable(getattr(module, "run", None)), f"bench {name} has no run()"


def test_unknown_benchmark_is_exit_2_with_the_list(capsys):
    assert main(["bench", "ctc-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'ctc-model'" in err and "ctc-beam" in err
