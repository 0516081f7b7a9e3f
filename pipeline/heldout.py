"""Recordings with references, read as a job reads them: a manifest's rows decoded and
segmented exactly as the job does it (pipeline.prepare.prepare_row with the config's VAD
segmenter), kept per recording with each row's reference.

`shardscribe calibrate` fits its maps on these, and the benchmarks (jobs/bench/) score
decoders on them; the default manifest is the bundled samples.
"""
from __future__ import annotations

from pathlib import Path

DEFAULT_MANIFEST = Path(__file__).resolve().parent / "assets/samples/samples.jsonl"


def load_recordings(manifest: str | None, limit: int = 0, cfg=None):
    """Returns ``(recordings, references)``: per recording its list of 16-kHz segments."""
    from .config import load_config
    from .prepare import prepare_row
    from .segment import VadSegmenter
    from .sources import read_source

    cfg = cfg or load_config()
    rows = read_source(manifest or str(DEFAULT_MANIFEST))
    if limit:
        rows = rows[:limit]
    seg = VadSegmenter(cfg.audio.max_segment_s, cfg.audio.vad_threshold, cfg.audio.vad_pad_s)
    recordings, refs = [], []
    for row in rows:
        prepared = prepare_row(row, seg)
        if prepared["error"] or not prepared["seg_audio"]:
            continue
        # References are per recording: score recordings, so keep their segments together.
        recordings.append(prepared["seg_audio"])
        refs.append(row.get("reference") or "")
    return recordings, refs
