"""The configs an output folder's rows were made with, kept beside them: one JSON file per
config_hash under DST/__shardscribe__/configs/, holding what the hash covers
(pipeline.config.hashed_config). A rerun with another config is refused naming the keys
that differ (actors.job.run), not only two hashes."""
from __future__ import annotations

import json
import posixpath

CONFIGS_DIR = "configs"


def _path(dst: str, job_hash: str) -> str:
    from .output import sidecar_path

    return sidecar_path(dst, posixpath.join(CONFIGS_DIR, f"{job_hash}.json"))


def record_config(dst: str, cfg, job_hash: str, options: dict | None = None) -> None:
    """Keep ``cfg`` (hashing to ``job_hash``) beside DST's rows, once per hash."""
    from .config import hashed_config
    from .storage import url_to_fs

    fs, path = url_to_fs(_path(dst, job_hash), options)
    if fs.exists(path):
        return
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    with fs.open(path, "w") as fh:
        json.dump({"config": cfg.name, "config_hash": job_hash, "keys": hashed_config(cfg)}, fh, sort_keys=True)


def recorded_config(dst: str, job_hash: str, options: dict | None = None) -> dict | None:
    """The record of ``job_hash`` in DST ({config, config_hash, keys}); None where there is
    none (rows written before configs were kept) or it cannot be read."""
    from .storage import url_to_fs

    try:
        fs, path = url_to_fs(_path(dst, job_hash), options)
        with fs.open(path, "r") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("keys"), dict) else None
