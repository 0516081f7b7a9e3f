"""Read, decode and segment recordings (the CPU stage before the model).

Each manifest row becomes one prepared row: 16-kHz mono segments (<= 30 s, cut at pauses
by silero-vad) or an `error`. Exceptions are caught per row, so rows in = rows out. The
audio is decoded from a file object block by block (pipeline.audio.decode_stream), only
the row's span where the manifest gives one (NeMo's offset/duration).
"""
from __future__ import annotations

import os
import queue
import stat
import threading
import time

from pipeline.audio import SAMPLE_RATE, AudioError, decode_stream
from pipeline.segment import VadSegmenter
from pipeline.sources import open_audio
from pipeline.storage import redact_text, redact_uri


def prepare_row(row: dict, segmenter: VadSegmenter, quality: str = "HQ") -> dict:
    start = time.perf_counter()
    out = {"id": row["id"], "audio": row["audio"], "reference": row.get("reference"),
           "key_phrases": row.get("key_phrases"), "offset_s": row.get("offset_s"), "duration_s": None,
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


TIMEOUT_ERROR = "read timeout"


def prepare_row_within(row: dict, segmenter: VadSegmenter, quality: str, timeout_s: float) -> dict:
    """``prepare_row`` with the row's isolation around it: an error the source found (a
    file name that is not UTF-8) or a path that is not a regular file (a FIFO would block
    its reader forever) becomes the row's error at once, and a read or decode still
    running after ``timeout_s`` becomes the row's error while the job goes on. The stuck
    call keeps its daemon thread (a blocked open() cannot be cancelled from Python)."""
    start = time.perf_counter()
    error = row.get("error") or _not_a_regular_file(row)
    if error is None:
        done: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=lambda: done.put(prepare_row(row, segmenter, quality)),
                         name=f"prepare-{row['id'][:40]}", daemon=True).start()
        try:
            out = done.get(timeout=timeout_s)
        except queue.Empty:
            error = f"{TIMEOUT_ERROR}: {redact_uri(row['audio'])} not read and decoded within {timeout_s:g} s " \
                    "(audio.read_timeout_s)"
        else:
            # Outputs and logs name the recording, never its credentials or signed query.
            clean = redact_uri(row["audio"])
            out["audio"] = clean
            if out["error"]:
                out["error"] = redact_text(out["error"].replace(row["audio"], clean))
            return out
    return {"id": row["id"], "audio": redact_uri(row["audio"]), "reference": row.get("reference"),
            "key_phrases": row.get("key_phrases"), "offset_s": row.get("offset_s"), "duration_s": None,
            "seg_start": [], "seg_end": [],
            "seg_audio": [], "error": error, "t_prepare_s": time.perf_counter() - start}


def _not_a_regular_file(row: dict) -> str | None:
    audio = row.get("audio") or ""
    if row.get("audio_bytes") is not None or ("://" in audio and not audio.startswith("file://")):
        return None
    path = audio[len("file://"):] if audio.startswith("file://") else audio
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None    # prepare_row names the cause (not found, permission denied)
    if stat.S_ISREG(mode):
        return None
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "not a regular file"
    return f"cannot read {audio}: it is {kind}"
