"""The ``ar`` kind's part of the job around the workers (pipeline.kinds.registry): the
online token map's figures in the summary. SSD's fallback drafts with the same map, so the
``ssd`` kind adds this entry too."""
from __future__ import annotations


def summary_entries(cfg, dst: str, started_at: float, rows_run: int) -> dict:
    """``token_map_online`` (pipeline.kinds.ar.token_map_report) where ``token_map.online``
    grew a map in this run: the model processes keep their maps, so the driver replays
    what the run committed."""
    if not rows_run or not cfg.token_map.online:
        return {}
    from .token_map_report import summary_entry

    return {"token_map_online": summary_entry(dst, cfg)}
