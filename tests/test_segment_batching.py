"""Segment packing and token-budget batching, checked as invariants with hypothesis."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardscribe.pipeline.batching import pack_by_budget
from shardscribe.pipeline.segment import Segment, pack_spans


@st.composite
def spans(draw):
    gaps = draw(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 120)), min_size=0, max_size=30))
    out, pos = [], 0
    for gap, length in gaps:
        pos += gap
        out.append(Segment(pos, pos + length))
        pos += length
    return out


@given(spans(), st.integers(20, 200))
@settings(max_examples=300, deadline=None)
def test_packed_segments_cover_every_span_within_the_limit(speech, max_len):
    segs = pack_spans(speech, max_len)
    assert all(0 < s.end - s.start <= max_len for s in segs)
    assert all(a.end <= b.start for a, b in zip(segs, segs[1:]))
    covered = lambda x: any(s.start <= x < s.end for s in segs)
    for span in speech:
        assert covered(span.start) and covered(span.end - 1)
        assert all(covered(x) for x in range(span.start, span.end, 7))
    # Packing is greedy: no two neighbours could have been one segment.
    assert all(b.end - a.start > max_len for a, b in zip(segs, segs[1:]))


@given(st.lists(st.integers(1, 100), max_size=60), st.integers(100, 1000))
@settings(max_examples=300, deadline=None)
def test_budget_batches_partition_and_respect_budget(costs, budget):
    batches = pack_by_budget(costs, budget)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(costs)))
    for b in batches:
        assert len(b) * max(costs[i] for i in b) <= budget or len(b) == 1
        assert [costs[i] for i in b] == sorted((costs[i] for i in b), reverse=True)
