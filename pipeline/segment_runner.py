"""Turn prepared recordings into output rows with a decoder kind's stages.

Segments of all recordings in a batch are pooled, sorted by cost and packed under the
padded-token budget (pipeline.batching; "sort by length, batch by a token budget" of
"Self-Speculative Decoding for LLM-based ASR with CTC Encoder Drafts", §3), decoded, then
put back per recording. A sub-batch whose decode raises is decoded again in halves, down
to the segment that really fails, so only that segment's recording gets an `error`; the
second stage isolates its failures the same way. A failure that leaves the device unusable
(a CUDA device-side assert) is not isolated: it stops the job (pipeline.device.DeviceFault).

A first stage may leave segments pending with its own state; ``complete_pending`` hands
them to the kind's second stage, re-batched across rows by that stage's cost
(``pending_costs`` prices a row's pending segments for the runners' pool across batches,
pipeline.pending_pool). None of these functions knows any decoder's fields
(pipeline.kinds.base).
"""
from __future__ import annotations

import time

import numpy as np

from .batching import pack_by_budget
from .kinds.base import PENDING, PendingState, SegmentResult
from .device import device_fault, is_device_fault
from .records import clear_pending, finalize_row, segment_dict, shift_words


def decode_segments(decoder, audios: list[np.ndarray], max_tokens: int, languages=None) -> list[SegmentResult]:
    """``languages``: per segment, what the decoder's ``detect_recordings`` found for its
    recording (None: the decoder detects nothing ahead, or that recording has no result)."""
    results: list[SegmentResult | None] = [None] * len(audios)
    for batch in pack_by_budget([decoder.segment_cost(a) for a in audios], max_tokens):
        for i, res in zip(batch, _decode_isolating(decoder, audios, batch, languages)):
            results[i] = res
    return results


def _recording_languages(decoder, rows: list[dict], flat: list[tuple[int, int]]) -> tuple[list | None, dict]:
    """Per segment of ``flat``: its recording's language as the decoder detects it once per
    recording (Whisper, model.language=auto), or None for all where the decoder does not;
    and per row detected, its share of the detection's seconds (an encoder pass over the
    recording's first window, which belongs in the row's ``t_encode_s``). A detection that
    raises leaves each segment to be detected as it is decoded, where a bad segment's error
    is isolated to its own row."""
    detect = getattr(decoder, "detect_recordings", None)
    if detect is None:
        return None, {}
    per_row: dict[int, list[np.ndarray]] = {}
    for r, s in flat:
        per_row.setdefault(r, []).append(np.asarray(rows[r]["seg_audio"][s], dtype=np.float32))
    order = sorted(per_row)
    start = time.perf_counter()
    try:
        found = dict(zip(order, detect([per_row[r] for r in order])))
    except Exception as exc:
        if is_device_fault(exc):
            raise device_fault(exc, "while detecting languages") from exc
        return None, {}
    detected = [r for r in order if found.get(r) is not None]
    spent = {r: (time.perf_counter() - start) / len(detected) for r in detected}
    languages = [found.get(r) for r, _ in flat]
    return (languages if detected else None), spent


def _decode_isolating(decoder, audios: list[np.ndarray], batch: list[int], languages=None) -> list[SegmentResult]:
    """Decode ``batch``; when the model raises, decode each half again, down to the one
    segment that fails: one bad segment in a batch of n costs about 2 log2(n) extra calls
    instead of n, and only that segment's recording gets the error."""
    try:
        outs = (decoder.decode([audios[i] for i in batch]) if languages is None
                else decoder.decode([audios[i] for i in batch], languages=[languages[i] for i in batch]))
        if len(outs) != len(batch):
            raise RuntimeError(f"decoder returned {len(outs)} results for {len(batch)} segments")
        return outs
    except Exception as exc:
        if is_device_fault(exc):
            raise device_fault(exc, "while decoding") from exc
        if len(batch) == 1:
            return [SegmentResult("", "error", error=f"{type(exc).__name__} while decoding: {exc}")]
    half = len(batch) // 2
    return (_decode_isolating(decoder, audios, batch[:half], languages)
            + _decode_isolating(decoder, audios, batch[half:], languages))


def _score(confidence, results) -> None:
    """Confidence of the final results among ``results`` (pipeline.confidence.apply)."""
    if confidence is None:
        return
    for res in results:
        if res.stage not in (PENDING, "error"):
            confidence.fill_result(res)


def _finish_row(row: dict, confidence) -> dict:
    finalize_row(row)
    if confidence is not None and not row.get("pending_index"):
        confidence.fill_row(row)
    return row


def transcribe_prepared(rows: list[dict], decoder, max_tokens: int, confidence=None,
                        pending_as_bytes: bool = True) -> list[dict]:
    """Output rows, one per input row; pending segments keep their state in the
    ``pending_*`` fields (records.INTERMEDIATE_SCHEMA). ``confidence``: a
    pipeline.confidence.apply.ConfidenceScorer, or None for none. ``pending_as_bytes=False``
    leaves each pending state as its object, for a second stage in this same process: the
    rows then never become a table between the stages."""
    flat: list[tuple[int, int]] = []
    audios: list[np.ndarray] = []
    for r, row in enumerate(rows):
        if row.get("error"):
            continue
        for s, audio in enumerate(row["seg_audio"]):
            flat.append((r, s))
            audios.append(np.asarray(audio, dtype=np.float32))
    languages, detection_s = _recording_languages(decoder, rows, flat) if audios else (None, {})
    results = decode_segments(decoder, audios, max_tokens, languages) if audios else []
    _score(confidence, results)
    per_row: dict[int, list[tuple[int, SegmentResult]]] = {}
    for (r, s), res in zip(flat, results):
        per_row.setdefault(r, []).append((s, res))
    out = []
    for r, row in enumerate(rows):
        segs = sorted(per_row.get(r, []), key=lambda x: x[0])
        pending = [(s, res) for s, res in segs if res.stage == PENDING]
        out_row = {
            "id": row["id"], "audio": row["audio"], "offset_s": row.get("offset_s"),
            "duration_s": row.get("duration_s"), "audio_stamp": row.get("audio_stamp"),
            "reference": row.get("reference"), "key_phrases": row.get("key_phrases"),
            "prepare_error": row.get("error"),
            "segments": [segment_dict(row["seg_start"][s], row["seg_end"][s], res) for s, res in segs],
            "decoder": decoder.name, "t_prepare_s": row.get("t_prepare_s"),
            "t_encode_s": sum(res.t_encode_s for _, res in segs) + detection_s.get(r, 0.0),
            "t_decode_s": sum(res.t_decode_s for _, res in segs), "t_fallback_s": 0.0,
            "pending_index": [s for s, _ in pending],
            "pending_state": [res.pending.to_bytes() if pending_as_bytes else res.pending for _, res in pending],
        }
        out.append(_finish_row(out_row, confidence))
    return out


def _finish_isolating(finisher, items: list[SegmentResult], batch: list[int]):
    """(indices, seconds) of ``items`` finished together; a batch that raises is finished
    again in halves, so only the item that fails gets the error."""
    try:
        return [(batch, finisher.finish(items))]
    except Exception as exc:
        if is_device_fault(exc):
            raise device_fault(exc, f"in {finisher.name}") from exc
        if len(items) == 1:
            items[0].stage, items[0].error = "error", f"{type(exc).__name__} in {finisher.name}: {exc}"
            return [(batch, 0.0)]
    half = len(items) // 2
    return (_finish_isolating(finisher, items[:half], batch[:half])
            + _finish_isolating(finisher, items[half:], batch[half:]))


def _pending_results(row: dict, finisher) -> list[tuple[int, SegmentResult]]:
    """(segment index, pending result) of ``row``'s pending segments, states rebuilt from
    their packed bytes (or taken as they are, in-process)."""
    out = []
    for s, state in zip(row.get("pending_index") or [], row.get("pending_state") or []):
        seg = row["segments"][s]
        if not isinstance(state, PendingState):
            state = finisher.pending_type.from_bytes(state)
        out.append((s, SegmentResult("", PENDING, max_entropy=seg["max_entropy"], min_prob=seg["min_prob"],
                                     drafted=seg["drafted"], pending=state, key_phrases=row.get("key_phrases"),
                                     language=seg.get("language"), language_prob=seg.get("language_prob"))))
    return out


def pending_costs(row: dict, finisher) -> list[int]:
    """The second stage's cost of each pending segment of ``row`` (its price in the token
    budget), for a pool that batches rows before they are finished
    (pipeline.pending_pool)."""
    return [int(finisher.cost(res)) for _, res in _pending_results(row, finisher)]


def complete_pending(rows: list[dict], finisher, max_tokens: int, confidence=None, stats=None,
                     trigger: str | None = None) -> list[dict]:
    """Finish every pending segment of ``rows`` with ``finisher`` (a second stage),
    re-batched across rows under the token budget; other segments and rows pass through
    untouched. A pending state is its packed bytes, or the object itself in-process.
    ``stats``: a pipeline.pending_pool.SecondStageStats that records each call of the
    second stage (its segments, widest cost and ``trigger``: what dispatched the rows)."""
    work: list[tuple[int, int, SegmentResult]] = []
    for r, row in enumerate(rows):
        work += [(r, s, res) for s, res in _pending_results(row, finisher)]
    costs = [finisher.cost(w[2]) for w in work]
    for batch in pack_by_budget(costs, max_tokens):
        if stats is not None:
            stats.record_call(len(batch), max(costs[i] for i in batch), trigger)
        for part, seconds in _finish_isolating(finisher, [work[i][2] for i in batch], batch):
            _score(confidence, [work[i][2] for i in part])
            for i in part:
                r, s, res = work[i]
                seg = rows[r]["segments"][s]
                seg.update(text=res.text, stage=res.stage, tokens=res.tokens, prefix_len=res.prefix_len,
                           generated=res.generated, error=res.error, language=res.language,
                           words=shift_words(res.words, seg["start"], seg["end"]), confidence=res.confidence)
                rows[r]["t_fallback_s"] = (rows[r].get("t_fallback_s") or 0.0) + seconds / len(part)
    for row in rows:
        clear_pending(row)
        _finish_row(row, confidence)
    return rows
