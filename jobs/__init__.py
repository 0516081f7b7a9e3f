"""Command-line entry points: one module per `shardscribe` sub-command (jobs/cli.py
registers them), plus the benchmarks behind `shardscribe bench NAME`."""
