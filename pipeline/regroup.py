"""Prepared blocks joined into larger model-stage batches: the segment runner sorts a
batch's segments by length and packs them under the token budget ("Self-Speculative
Decoding for LLM-based ASR with CTC Encoder Drafts" §3.2: sort by length, batch by a token
budget; pipeline.batching), so one call of the model stage should bring at least a full
budget of segments. One input block of ``batching.recordings_per_batch`` rows brings far
fewer than a GPU's budget holds (16 short clips against hundreds of segments), so blocks
are joined, in order, until their segments fill the budget or the join holds
``batching.max_joined_blocks`` blocks' rows (a bound on the audio held in memory). On the CPU a
default block of short clips fills its budget alone (16 Whisper windows of 24000), and
nothing is joined.

A long recording's pieces (pipeline.prepare_stream) are not held for company: the block
that brings one goes to the model at once, so the recording's speech waits for no more
than one piece and its progress moves piece by piece.

A job's slow start (its first ``recordings_per_batch`` rows cut into growing pieces, for
early progress: pipeline.batching.slow_start) is passed through piece by piece.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_SAMPLE = np.zeros((), np.float32)


def joined_blocks(prepared: Iterable[tuple[int, pa.Table]], rows: int, slow_start_rows: int = 0,
                  budget: int = 0, cost: Callable[[pa.Table], int] | None = None
                  ) -> Iterator[tuple[int, pa.Table]]:
    """(rows read, prepared table) pairs, consecutive ones joined until a table holds at
    least ``rows`` rows or, with ``cost`` (a table's segments' price under the token
    budget), segments that cost ``budget`` or more; the input's end flushes what is left.
    The pairs that bring the rows read up to ``slow_start_rows`` pass through alone, and a
    table holding a long recording's piece before its last ends the join. Input order is
    kept, every row once."""
    read = 0
    pending: list[tuple[int, pa.Table]] = []
    held = spent = 0
    for n, t in prepared:
        if read < slow_start_rows and not pending:
            read += n
            yield n, t
            continue
        read += n
        pending.append((n, t))
        held += t.num_rows
        if cost is not None:
            spent += cost(t)
        if held >= rows or (cost is not None and spent >= budget) or _holds_piece(t):
            yield _join(pending)
            pending, held, spent = [], 0, 0
    if pending:
        yield _join(pending)


def model_batches(prepared: Iterable[tuple[int, pa.Table]], batching, cost: Callable[[pa.Table], int],
                  slow_start: bool) -> Iterator[tuple[int, pa.Table]]:
    """:func:`joined_blocks` as a runner's model stage takes them under ``batching`` (the
    job's BatchingConfig, its max_tokens sized where the model loaded): up to
    ``max_joined_blocks`` blocks of ``recordings_per_batch`` rows, until ``cost`` reaches
    ``max_tokens``; with ``slow_start`` (the job's, or a Ray actor's, first rows) the slow
    start's pieces pass alone."""
    step = batching.recordings_per_batch
    slow_rows = step if slow_start and batching.first_batch < step else 0
    return joined_blocks(prepared, step * batching.max_joined_blocks, slow_rows, batching.max_tokens, cost)


def segments_cost(t: pa.Table, segment_cost: Callable[[np.ndarray], int]) -> int:
    """What prepared table ``t``'s segments cost under the token budget, each priced by
    ``segment_cost`` (a decoder stage's: it prices a segment by its length, so each is
    given a zero-stride view of as many samples instead of its audio)."""
    if "seg_audio" not in t.column_names or not t.num_rows:
        return 0
    lengths = pc.list_value_length(pc.list_flatten(t.column("seg_audio"))).to_numpy(zero_copy_only=False)
    return sum(segment_cost(np.broadcast_to(_SAMPLE, (int(n),))) for n in lengths)


def _holds_piece(t: pa.Table) -> bool:
    # A piece before a recording's last has no count of pieces yet (records.PREPARED_SCHEMA).
    return "pieces" in t.column_names and t.column("pieces").null_count > 0


def _join(pairs: list[tuple[int, pa.Table]]) -> tuple[int, pa.Table]:
    if len(pairs) == 1:
        return pairs[0]
    return sum(n for n, _ in pairs), pa.concat_tables([t for _, t in pairs]).combine_chunks()
