"""List every config key: `shardscribe keys [SECTION]`.

Each key with its type, default and what it does, read from the config classes
themselves: the job's own sections, the registered decoder kinds' sections and the model
families' own `model.*` keys. Set any of them with `--set KEY=VALUE`.
"""
from __future__ import annotations

import argparse

COMMAND = "keys"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("section", nargs="?", default=None,
                        help="only this section (model, decoder, ssd, beam, audio, ...)")


def run(args: argparse.Namespace) -> int:
    from ..pipeline.config_keys import config_keys

    rows = [k for k in config_keys() if args.section in (None, k.key.split(".")[0])]
    if not rows:
        print(f"shardscribe: error: no section {args.section!r}")
        return 2
    section = None
    for k in rows:
        head = k.key.split(".")[0]
        if head != section:
            section = head
            print(f"\n[{section}]" + (f"  {k.owner}" if k.owner and section != "model" else ""))
        owner = f"  [{k.owner}]" if k.owner and section == "model" else ""
        print(f"  {k.key} ({k.type}) = {k.default}{owner}" + (f"\n      {k.comment}" if k.comment else ""))
    return 0
