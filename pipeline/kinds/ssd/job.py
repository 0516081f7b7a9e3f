"""The ``ssd`` kind's part of the job around the workers (pipeline.kinds.registry): where
``ssd.adapt`` keeps the adapted draft head, and what the summary says of it."""
from __future__ import annotations

from ..ar.job import summary_entries as token_map_entries


def prepare_job(cfg, dst: str) -> None:
    """``ssd.adapt_dir`` left unset: the head is kept beside the rows it was fitted on
    (DST's sidecar), so a rerun or a resumed job drafts with it at once."""
    if cfg.ssd.adapt and cfg.ssd.adapt_dir is None:
        from ...output.layout import sidecar_path

        cfg.ssd.adapt_dir = sidecar_path(dst, "draft_head")


def summary_entries(cfg, dst: str, started_at: float, rows_run: int) -> dict:
    """The fallback's online token map (as the ``ar`` kind's), then ``ssd_adapt``: where the
    head is, what it was fitted on, whether this run fitted it."""
    out = token_map_entries(cfg, dst, started_at, rows_run)
    if cfg.ssd.adapt and cfg.ssd.adapt_dir:
        from .adapt import summary_entry

        out["ssd_adapt"] = summary_entry(cfg.ssd.adapt_dir, started_at)
    return out
