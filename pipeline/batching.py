"""Length-sorted, padded-token-budget batching, as in "Self-Speculative Decoding for
LLM-based ASR with CTC Encoder Drafts" (§3.2: sort by length, batch by a token budget, 50K
there, so padding waste stays small and memory stays bounded).
"""
from __future__ import annotations


def pack_by_budget(costs: list[int], budget: int) -> list[list[int]]:
    """Group item indices into batches, longest first, so that for each batch
    ``len(batch) * max(cost in batch) <= budget`` (a single over-budget item gets its own batch).
    """
    order = sorted(range(len(costs)), key=lambda i: -costs[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted descending, so the first item of a batch sets its padded width.
        width = costs[current[0]] if current else costs[i]
        if current and (len(current) + 1) * width > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def equal_length_buckets(lengths: list[int]) -> list[list[int]]:
    """Item indices grouped by exact length, in first-seen order: batches that need no
    padding, for a model whose padding leaks into the valid frames (a norm or convolution
    that reads the whole time axis before any mask applies)."""
    buckets: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        buckets.setdefault(n, []).append(i)
    return list(buckets.values())


def slow_start(first: int, full: int) -> list[int]:
    """The sizes a job's first ``full`` rows are cut into: ``first``, twice that, and so
    on, while what is left is at least the next size; the last piece takes the rest (16
    from 1: 1, 2, 4, 9). ``[full]`` where ``first >= full``.

    A job's first rows then finish within seconds instead of after a whole batch, for at
    most log2(full) extra batches a job; every later batch is whole."""
    first, full = max(1, first), max(1, full)
    if first >= full:
        return [full]
    sizes, size, left = [], first, full
    while left:
        take = left if left - size < size else size
        sizes.append(take)
        left -= take
        size *= 2
    return sizes


def in_slow_start(rows_read: int, first: int, full: int) -> bool:
    """Whether the batch that brought the rows read to ``rows_read`` is one of the slow
    start's pieces (:func:`slow_start`) but its last: its pending rows are finished at once
    (pipeline.pending_pool's ``start``), the last piece's pool with the next batches'."""
    return first < full and rows_read < full
