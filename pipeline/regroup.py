"""Prepared blocks joined into larger model-stage batches: the segment runner sorts a
batch's segments by length and packs them under the token budget (pipeline.batching), so
the more rows one call of the model stage sees, the better its buckets fill (a GPU's
budget holds far more segments than one input block of ``batching.recordings_per_batch``
rows brings). The rows joined are those the pipeline holds anyway: the block the model
would run now and the blocks already read ahead of it (pipeline.prefetch).

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
    rows read up to ``slow_start_rows`` pass through alone. Input order is kept, every
    row once."""
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
        if held >= rows:
            yield _join(pending)
            pending, held = [], 0
    if pending:
        yield _join(pending)


def _join(pairs: list[tuple[int, pa.Table]]) -> tuple[int, pa.Table]:
    if len(pairs) == 1:
        return pairs[0]
    return sum(n for n, _ in pairs), pa.concat_tables([t for _, t in pairs]).combine_chunks()
