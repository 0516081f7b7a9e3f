"""Where shardscribe keeps what it builds once per machine: converted checkpoints, the
compiled native beam loop and the KenLM binaries.

One rule for all of them: ``$SHARDSCRIBE_CACHE``, else ``$XDG_CACHE_HOME/shardscribe``,
else ``~/.cache/shardscribe``. (scripts/build_kenlm.sh applies the same rule in shell.)
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("SHARDSCRIBE_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "shardscribe"
