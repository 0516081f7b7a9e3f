"""Read, decode and segment recordings (the CPU stage before the model).

Each manifest row becomes one prepared row: 16-kHz mono segments (<= 30 s, cut at pauses
by silero-vad) or an `error`. Exceptions are caught per row, so rows in = rows out. The
audio is decoded from a file object block by block (pipeline.audio.decode_stream), only
the row's span where the manifest gives one (NeMo's offset/duration).
"""
from __future__ import annotations

import time

from pipeline.audio import SAMPLE_RATE, AudioError, decode_stream
from pipeline.segment import VadSegmenter
from pipeline.sources import open_audio


def prepare_row(row: dict, segmenter: VadSegmenter, quality: str = "HQ") -> dict:
    start = time.perf_counter()
    out = {"id": row["id"], "audio": row["audio"], "reference": row.get("reference"),
           "key_phrases": row.get("key_phrases"), "duration_s": None,
           "seg_start": [], "seg_end": [], "seg_audio": [], "error": None}
    try:
        try:
            fh = open_audio(row)
        except FileNotFoundError:
            raise AudioError(f"file not found: {row['audio']}") from None
        except IsADirectoryError:
            raise AudioError(f"cannot read {row['audio']}: it is a directory") from None
        except OSError as exc:
            raise AudioError(f"cannot read {row['audio']}: {exc}") from None
        try:
            samples, _, _ = decode_stream(fh, quality, row.get("offset_s"), row.get("duration_s"))
        except OSError as exc:
            raise AudioError(f"cannot read {row['audio']}: {exc}") from None
        finally:
            fh.close()
        out["duration_s"] = len(samples) / SAMPLE_RATE
        for seg in segmenter(samples):
            out["seg_start"].append(seg.start / SAMPLE_RATE)
            out["seg_end"].append(seg.end / SAMPLE_RATE)
            out["seg_audio"].append(samples[seg.start:seg.end])
    except AudioError as exc:
        out["error"] = str(exc)
    except Exception as exc:  # a bad row must never take the job down
        out["error"] = f"{type(exc).__name__} while preparing audio: {exc}"
    if out["error"]:
        out["seg_start"], out["seg_end"], out["seg_audio"] = [], [], []
    out["t_prepare_s"] = time.perf_counter() - start
    return out
