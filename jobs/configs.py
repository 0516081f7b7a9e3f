"""List the shipped configs: `shardscribe configs`.

One line each: the name `--config` takes, and what the config runs. A config is a YAML
file in conf/; `--config PATH` takes a file of your own (it may `extends:` a shipped one).
"""
from __future__ import annotations

import argparse

COMMAND = "configs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from ..pipeline.config import shipped_configs

    configs = shipped_configs()
    width = max(map(len, configs))
    for name, summary in configs.items():
        print(f"{name:<{width}}  {summary}")
    return 0
