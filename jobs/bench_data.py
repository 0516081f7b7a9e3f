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


def concat_long_form(recordings: list[list], refs: list[str], target_s: float, gap_s: float = 0.4):
    """Long-form inputs from short ones: consecutive single-segment recordings joined with
    short silences into segments of up to ``target_s`` (references joined likewise), so the
    decoder's share of the work is what it is on near-30-s segments."""
    import numpy as np

    gap = np.zeros(int(gap_s * 16000), dtype=np.float32)
    limit = int(target_s * 16000)
    out_audio, out_refs, cur, cur_refs = [], [], [], []
    for segs, ref in zip(recordings, refs):
        for seg in segs:
            size = sum(len(c) + len(gap) for c in cur)
            if cur and size + len(seg) > limit:
                out_audio.append([np.concatenate([x for c in cur for x in (c, gap)])[:-len(gap)]])
                out_refs.append(" ".join(cur_refs))
                cur, cur_refs = [], []
            cur.append(np.asarray(seg, dtype=np.float32))
        cur_refs.append(ref)
    if cur:
        out_audio.append([np.concatenate([x for c in cur for x in (c, gap)])[:-len(gap)]])
        out_refs.append(" ".join(cur_refs))
    return out_audio, out_refs
