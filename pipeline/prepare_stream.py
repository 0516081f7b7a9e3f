"""Read, decode and segment one recording as a stream of pieces, in bounded memory.

A recording is decoded block by block (pipeline.audio.iter_blocks, either backend) and cut
into segments by the VAD over windows (pipeline.stream_segment); the segments leave as
*pieces*: prepared rows (records.PREPARED_SCHEMA) of the same id, each holding the segments
cut since the last one, handed on once ``piece_s`` seconds of the recording are decided.
A recording no longer than one window (the common case) is one piece, segmented exactly
as the whole-recording path does. Each piece carries its place (``piece``; the last one
also ``pieces``, their count) and ``share``: the part of the recording it covers (its
seconds over the seconds the header declares), which the model stage turns into progress
before the recording is done (pipeline.pieces joins the pieces' output rows into one).

The time limit (``audio.read_timeout_s``) is per piece: what the reader spends producing
the next piece, not the time the model spends on the ones before it.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

from .audio import MAX_SECONDS, SAMPLE_RATE, AudioError, StreamInfo, iter_blocks, peak_scale
from .prepare import CANCEL_GRACE_S, TIMEOUT_ERROR, _not_a_regular_file, open_row_audio
from .segment import VadSegmenter
from .storage import redact_text, redact_uri
from .stream_segment import WindowedSegmenter


class MovingDeadline:
    """A deadline (``time.monotonic() > deadline``, as the decoders test it) that the
    reader moves on each time it hands a piece over."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def renew(self) -> None:
        self.at = time.monotonic() + self.seconds

    def __lt__(self, now: float) -> bool:     # ``now > deadline``
        return self.at < now

    def __gt__(self, now: float) -> bool:     # ``now < deadline``
        return self.at > now


def _base_row(row: dict) -> dict:
    return {"id": row["id"], "audio": row["audio"], "reference": row.get("reference"),
            "key_phrases": row.get("key_phrases"), "offset_s": row.get("offset_s"), "duration_s": None,
            "seg_start": [], "seg_end": [], "seg_audio": [], "error": None, "audio_stamp": row.get("audio_stamp")}


def prepare_pieces(row: dict, segmenter: VadSegmenter, quality: str = "HQ", max_seconds: float = MAX_SECONDS,
                   deadline=None, stream: int = 0, window_s: float = 60.0, overlap_s: float = 5.0,
                   piece_s: float = 300.0) -> Iterator[dict]:
    """The pieces of the manifest row ``row``: prepared rows with ``piece``, ``pieces``
    (on the last) and ``share``. An error ends the row: its last piece carries the
    ``error`` and no segments (the model stage then drops the segments of the pieces
    before it, so an error row has none, as before)."""
    windows = WindowedSegmenter(segmenter, window_s, overlap_s, SAMPLE_RATE)
    info = StreamInfo()
    index, done_to = 0, 0
    current = _base_row(row)
    start = time.perf_counter()

    def piece(to: int, last: bool) -> dict:
        nonlocal current, index, done_to, start
        out = current
        expected = info.expected or to
        out.update(piece=index, pieces=index + 1 if last else None, duration_s=(to - done_to) / SAMPLE_RATE,
                   share=1.0 if last else min((to - done_to) / max(expected, 1), 1.0),
                   t_prepare_s=time.perf_counter() - start)
        index, done_to, current, start = index + 1, to, _base_row(row), time.perf_counter()
        return out

    try:
        fh = open_row_audio(row)
        try:
            blocks = iter_blocks(fh, quality, row.get("offset_s"), row.get("duration_s"), max_seconds, deadline,
                                 info, stream)
            end = 0
            for seg, audio, decided in windows.segments(blocks, lambda: peak_scale(info.peak)):
                current["seg_start"].append(seg.start / SAMPLE_RATE)
                current["seg_end"].append(seg.end / SAMPLE_RATE)
                current["seg_audio"].append(audio)
                end = max(end, decided)
                if (end - done_to) >= piece_s * SAMPLE_RATE:
                    yield piece(end, False)
            total = windows.length
        except OSError as exc:
            raise AudioError(f"cannot read {row['audio']}: {exc}", "unreadable") from None
        finally:
            fh.close()
        if total == 0:
            raise AudioError("audio has zero samples", "empty")
        yield piece(total, True)
    except AudioError as exc:
        yield _error_piece(current, index, str(exc), start)
    except Exception as exc:  # a bad row must never take the job down
        yield _error_piece(current, index, f"{type(exc).__name__} while preparing audio: {exc}", start)


def _error_piece(current: dict, index: int, error: str, start: float) -> dict:
    current.update(seg_start=[], seg_end=[], seg_audio=[], error=error, piece=index, pieces=index + 1,
                   share=1.0, duration_s=None, t_prepare_s=time.perf_counter() - start)
    return current


# How many pieces a reader may have ready before the model stage takes them: one waiting
# while the next is cut, so a recording's pieces never pile up in memory.
PIECES_AHEAD = 1


def prepare_pieces_within(row: dict, segmenter: VadSegmenter, quality: str, timeout_s: float,
                          max_seconds: float = MAX_SECONDS, stream: int = 0, window_s: float = 60.0,
                          overlap_s: float = 5.0, piece_s: float = 300.0) -> Iterator[dict]:
    """``prepare_pieces`` with the row's isolation around it (pipeline.prepare's
    ``prepare_row_within``): the reader runs in a thread that may take ``timeout_s`` for
    each piece (its deadline moves on as it hands one over); one that does not deliver
    in time ends the row with a ``read timeout`` error piece. The last piece may carry
    ``reader_alive=True`` (a reader blocked in a read Python cannot cancel)."""
    error = row.get("error") or _not_a_regular_file(row)
    if error is not None:
        yield _error_piece(_base_row({**row, "audio": redact_uri(row["audio"])}), 0, error, time.perf_counter())
        return
    ready: queue.Queue = queue.Queue(maxsize=PIECES_AHEAD)
    deadline = MovingDeadline(timeout_s)
    stop = threading.Event()

    def read() -> None:
        try:
            for p in prepare_pieces(row, segmenter, quality, max_seconds, deadline, stream, window_s, overlap_s,
                                    piece_s):
                while not stop.is_set():
                    try:
                        ready.put(p, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
                deadline.renew()
        except BaseException as exc:    # prepare_pieces catches its own; this is a last resort
            ready.put_nowait(_error_piece(_base_row(row), 0, f"{type(exc).__name__} while preparing audio: {exc}",
                                   time.perf_counter()))

    reader = threading.Thread(target=read, name=f"prepare-{row['id'][:40]}", daemon=True)
    reader.start()
    clean = redact_uri(row["audio"])
    index = 0
    try:
        while True:
            waited = time.perf_counter()
            try:
                p = ready.get(timeout=timeout_s)
            except queue.Empty:
                p = None
            if p is None or (p["error"] or "").startswith(TIMEOUT_ERROR):
                stop.set()
                reader.join(CANCEL_GRACE_S)
                out = _error_piece(_base_row({**row, "audio": clean}), index,
                                   f"{TIMEOUT_ERROR}: {clean} not read and decoded within {timeout_s:g} s "
                                   "(audio.read_timeout_s)", waited)
                out["reader_alive"] = reader.is_alive()
                yield out
                return
            p["audio"] = clean
            if p["error"]:
                p["error"] = redact_text(p["error"].replace(row["audio"], clean))
            index = p["piece"] + 1
            if p["pieces"] is not None:     # the last: its reader ends as soon as it handed it over
                reader.join(CANCEL_GRACE_S)
                yield p
                return
            yield p
    finally:
        stop.set()    # a consumer that stops early (an interrupted job) lets its reader go
