"""Held-out audio for the benchmarks: a manifest's recordings, decoded and segmented
exactly as the job does it, with their references (default: the bundled samples)."""
from __future__ import annotations

from pathlib import Path

DEFAULT_MANIFEST = Path(__file__).resolve().parent.parent / "pipeline/assets/samples/samples.jsonl"


def load_recordings(manifest: str | None, limit: int = 0, cfg=None):
    """Returns ``(recordings, references)``: per recording its list of 16-kHz segments."""
    from pipeline.config import load_config
    from pipeline.prepare import prepare_row
    from pipeline.segment import VadSegmenter
    from pipeline.sources import read_source

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


def join_by_recording(flat_index: list[tuple[int, object]], seg_texts: list[str], n_recordings: int) -> list[str]:
    """Segment texts (in ``flat_index`` order of (recording, segment)) joined per recording."""
    out: list[list[str]] = [[] for _ in range(n_recordings)]
    for (r, _), text in zip(flat_index, seg_texts):
        if text:
            out[r].append(text)
    return [" ".join(x) for x in out]
