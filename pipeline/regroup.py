"""Prepared blocks joined into larger model-stage batches: the segment runner sorts a
batch's segments by length and packs them under the token budget (pipeline.batching), so
the more rows one call of the model stage sees, the better its buckets fill (a GPU's
budget holds far more segments than one input block of ``batching.recordings_per_batch``
rows brings). The rows joined are those the pipeline holds anyway: the block the model
would run now and the blocks already read ahead of it (pipeline.prefetch).

A long recording's pieces (pipeline.prepare_stream) are not held for company: the block
that brings one goes to the model at once, so the recording's speech waits for no more
than one piece and its progress moves piece by piece.

A job's slow start (its first ``recordings_per_batch`` rows cut into growing pieces, for
early progress: pipeline.batching.slow_start) is passed through piece by piece.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import pyarrow as pa


def joined_blocks(prepared: Iterable[tuple[int, pa.Table]], rows: int,
                  slow_start_rows: int = 0) -> Iterator[tuple[int, pa.Table]]:
    """(rows read, prepared table) pairs, consecutive ones joined until a table holds at
    least ``rows`` rows (the input's end flushes what is left); the pairs that bring the
    rows read up to ``slow_start_rows`` pass through alone, and a table holding a long
    recording's piece before its last ends the join. Input order is kept, every row once."""
    read = 0
    pending: list[tuple[int, pa.Table]] = []
    held = 0
    for n, t in prepared:
        if read < slow_start_rows and not pending:
            read += n
            yield n, t
            continue
        read += n
        pending.append((n, t))
        held += t.num_rows
        if held >= rows or _holds_piece(t):
            yield _join(pending)
            pending, held = [], 0
    if pending:
        yield _join(pending)


def _holds_piece(t: pa.Table) -> bool:
    # A piece before a recording's last has no count of pieces yet (records.PREPARED_SCHEMA).
    return "pieces" in t.column_names and t.column("pieces").null_count > 0


def _join(pairs: list[tuple[int, pa.Table]]) -> tuple[int, pa.Table]:
    if len(pairs) == 1:
        return pairs[0]
    return sum(n for n, _ in pairs), pa.concat_tables([t for _, t in pairs]).combine_chunks()
