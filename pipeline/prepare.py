"""Read, decode and segment recordings (the CPU stage before the model).

Each manifest row becomes one prepared row: 16-kHz mono segments (<= 30 s, cut at pauses
by silero-vad) or an `error`. Exceptions are caught per row, so rows in = rows out. The
audio is decoded from a file object block by block (pipeline.audio.decode_stream), only
the row's span where the manifest gives one (NeMo's offset/duration), at most
``audio.max_seconds`` of it, and no longer than ``audio.read_timeout_s``: the decode checks
its deadline between blocks, so a row that times out costs no thread or memory after it.

Every `error` starts with a phrase that pipeline.output.error_kind maps to one word of a
fixed vocabulary (``file not found``, ``cannot read``, ``read timeout``, ...); the path and
the detail follow it, never precede it.
"""
from __future__ import annotations

import os
import queue
import stat
import threading
import time

from .audio import MAX_SECONDS, SAMPLE_RATE, AudioError, decode_stream
from .segment import VadSegmenter
from .sources import open_audio
from .storage import redact_text, redact_uri


def prepare_row(row: dict, segmenter: VadSegmenter, quality: str = "HQ", max_seconds: float = MAX_SECONDS,
                deadline: float | None = None, stream: int = 0) -> dict:
    """One prepared row (segments, or an ``error``) of the manifest row ``row``; at most
    ``max_seconds`` of audio of its audio stream ``stream`` (audio.stream), decoding stopped
    past ``deadline`` (time.monotonic())."""
    start = time.perf_counter()
    out = {"id": row["id"], "audio": row["audio"], "reference": row.get("reference"),
           "key_phrases": row.get("key_phrases"), "offset_s": row.get("offset_s"), "duration_s": None,
           "seg_start": [], "seg_end": [], "seg_audio": [], "error": None, "audio_stamp": row.get("audio_stamp")}
    try:
        fh = open_row_audio(row)
        try:
            samples, _, _ = decode_stream(fh, quality, row.get("offset_s"), row.get("duration_s"),
                                          max_seconds, deadline, stream)
        except OSError as exc:
            raise AudioError(f"cannot read {row['audio']}: {exc}", "unreadable") from None
        finally:
            fh.close()
        if deadline is not None and time.monotonic() > deadline:    # no VAD for a row already given up
            raise AudioError(f"{TIMEOUT_ERROR}: decoded, but past its deadline", "timeout")
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


def open_row_audio(row: dict):
    """The row's audio as a file object; AudioError (missing, unreadable) where it cannot be opened."""
    try:
        return open_audio(row)
    except FileNotFoundError:
        raise AudioError(f"file not found: {row['audio']}", "missing") from None
    except IsADirectoryError:
        raise AudioError(f"cannot read {row['audio']}: it is a directory", "unreadable") from None
    except OSError as exc:
        raise AudioError(f"cannot read {row['audio']}: {exc}", "unreadable") from None


TIMEOUT_ERROR = "read timeout"
# How long a timed-out row waits for its reader to stop at its deadline (it checks between
# blocks of at most pipeline.audio.BLOCK_VALUES samples, so it normally stops within this).
CANCEL_GRACE_S = 1.0


def prepare_row_within(row: dict, segmenter: VadSegmenter, quality: str, timeout_s: float,
                       max_seconds: float = MAX_SECONDS, stream: int = 0) -> dict:
    """``prepare_row`` with the row's isolation around it: an error the source found (a
    file name that is not UTF-8) or a path that is not a regular file (a FIFO would block
    its reader forever) becomes the row's error at once, and a read or decode still
    running after ``timeout_s`` becomes the row's error while the job goes on.

    The reader runs in a thread with that deadline and stops at it (between blocks), so a
    timed-out row leaves no thread or memory behind; only a call blocked inside one read
    (a hung open() or network read, which Python cannot cancel) outlives it, as a daemon
    thread. Such a row carries ``reader_alive=True`` (not a column: its segmenter may still
    be in use)."""
    start = time.perf_counter()
    error = row.get("error") or _not_a_regular_file(row)
    alive = False
    if error is None:
        done: queue.SimpleQueue = queue.SimpleQueue()
        deadline = time.monotonic() + timeout_s

        def read() -> None:
            try:
                done.put(prepare_row(row, segmenter, quality, max_seconds, deadline, stream))
            except BaseException as exc:    # prepare_row catches its own; this is a last resort
                done.put({**row, "duration_s": None, "seg_start": [], "seg_end": [], "seg_audio": [],
                          "error": f"{type(exc).__name__} while preparing audio: {exc}",
                          "t_prepare_s": time.perf_counter() - start})

        reader = threading.Thread(target=read, name=f"prepare-{row['id'][:40]}", daemon=True)
        reader.start()
        try:
            out = done.get(timeout=timeout_s)
        except queue.Empty:
            out = None
        reader.join(CANCEL_GRACE_S)     # at once where it gave its row; else it stops at its deadline
        alive = reader.is_alive()
        if out is None or (out["error"] or "").startswith(TIMEOUT_ERROR):   # the reader may stop first
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
            "seg_audio": [], "error": error, "t_prepare_s": time.perf_counter() - start, "reader_alive": alive,
            "audio_stamp": row.get("audio_stamp")}


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
