"""pipeline.regroup: consecutive prepared blocks joined into model-stage batches until
their segments fill the token budget or they hold N rows, the slow start's pieces alone,
input order and every row kept; and through the in-process runner, a job whose blocks are
joined gives each recording the text it gets in a block of its own."""
from __future__ import annotations

import pyarrow as pa
import pytest

from shardscribe.pipeline.regroup import joined_blocks, segments_cost


def _blocks(sizes: list[int]) -> list[tuple[int, pa.Table]]:
    out, start = [], 0
    for n in sizes:
        out.append((n, pa.table({"id": [f"r{i}" for i in range(start, start + n)]})))
        start += n
    return out


def _ids(pairs) -> list[str]:
    return [i for _, t in pairs for i in t.column("id").to_pylist()]


def test_blocks_join_up_to_the_rows_and_keep_order():
    blocks = _blocks([4, 4, 4, 4, 3])
    out = list(joined_blocks(iter(blocks), rows=8))
    assert [t.num_rows for _, t in out] == [8, 8, 3]
    assert [n for n, _ in out] == [8, 8, 3]
    assert _ids(out) == _ids(blocks)


def _segmented(sizes: list[list[int]]) -> pa.Table:
    """A prepared-like table: one row per entry, a segment of n samples per number."""
    audio = pa.array([[[0.0] * n for n in row] for row in sizes], pa.list_(pa.list_(pa.float32())))
    return pa.table({"id": [f"s{i}" for i in range(len(sizes))], "seg_audio": audio})


def test_segments_cost_prices_each_segment_by_its_length():
    t = _segmented([[3, 5], [], [7]])
    assert segments_cost(t, lambda a: 10 * len(a)) == 150
    assert segments_cost(t, lambda a: 1) == 3
    assert segments_cost(t.slice(1, 1), lambda a: 1) == 0


def test_blocks_join_until_their_segments_fill_the_budget():
    """Rows of one segment each at a cost of 10: a budget of 30 is filled by three rows,
    whatever the blocks' sizes; a block whose segments fill it alone is not joined."""
    blocks = [(n, _segmented([[1]] * n)) for n in (1, 1, 2, 4, 1, 1)]
    cost = lambda t: segments_cost(t, lambda a: 10)   # noqa: E731
    out = list(joined_blocks(iter(blocks), rows=100, budget=30, cost=cost))
    assert [t.num_rows for _, t in out] == [4, 4, 2]
    # The row bound still ends a join whose segments are cheap.
    out = list(joined_blocks(iter(blocks), rows=3, budget=10 ** 6, cost=cost))
    assert [t.num_rows for _, t in out] == [4, 4, 2]
    out = list(joined_blocks(iter(blocks), rows=2, budget=10 ** 6, cost=cost))
    assert [t.num_rows for _, t in out] == [2, 2, 4, 2]


def test_the_slow_start_passes_piece_by_piece():
    blocks = _blocks([1, 2, 4, 9, 16, 16, 16, 5])   # slow_start(1, 16), then blocks of 16
    out = list(joined_blocks(iter(blocks), rows=32, slow_start_rows=16))
    assert [t.num_rows for _, t in out] == [1, 2, 4, 9, 32, 21]
    assert _ids(out) == _ids(blocks)


def test_rows_read_are_counted_even_where_a_block_lost_rows():
    """A block may prepare fewer rows than it read (ids skipped): the read counts add up."""
    pairs = [(4, pa.table({"id": ["a", "b"]})), (4, pa.table({"id": ["c", "d", "e", "f"]})),
             (4, pa.table({"id": ["g", "h", "i", "j"]}))]
    out = list(joined_blocks(iter(pairs), rows=5))
    assert [(n, t.num_rows) for n, t in out] == [(8, 6), (4, 4)]


def test_a_long_recordings_piece_is_not_held_for_company():
    """A piece before a recording's last (pieces null) goes to the model with what is held
    already, at once: joined with later blocks, hours of speech would wait in memory."""
    def block(ids, pieces):
        return pa.table({"id": ids, "pieces": pa.array(pieces, pa.int32())})

    pairs = [(1, block(["a"], [1])), (0, block(["L"], [None])), (0, block(["L"], [None])),
             (2, block(["L", "b"], [3, 1])), (1, block(["c"], [1]))]
    out = list(joined_blocks(iter(pairs), rows=8))
    assert [(n, t.column("id").to_pylist()) for n, t in out] == [(1, ["a", "L"]), (0, ["L"]), (3, ["L", "b", "c"])]


@pytest.mark.slow
def test_joined_blocks_keep_each_recordings_text(tmp_path, samples_dir, sample_manifest, model_cache):
    """Blocks of one recording: a budget of one segment (a Whisper window) joins none, a
    large one batching.max_joined_blocks (4) a call; every recording gets the same text
    either way."""
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.output import read_output
    from shardscribe.pipeline.sources import read_source

    rows = read_source(str(samples_dir / "samples.jsonl"))[:5]
    texts, calls = {}, {}
    for budget in (1500, 10 ** 7):
        cfg = load_config("ctc_greedy", [f"model.cache_dir={model_cache}", "batching.recordings_per_batch=1",
                                         "batching.first_batch=1", "model.encoder_dtype=float32",
                                         "model.quantize=none", f"batching.max_tokens={budget}"])
        dst = tmp_path / f"out{budget}"
        seen = []
        assert run_local(rows, cfg, str(dst), progress=False, on_batch=lambda t: seen.append(t.num_rows)) == len(rows)
        texts[budget] = {r["id"]: r["text"] for r in read_output(str(dst), ["id", "text"]).to_pylist()}
        calls[budget] = seen
    assert calls[1500] == [1] * 5
    assert calls[10 ** 7] == [4, 1]
    assert len(texts[1500]) == len(rows) and all(texts[1500].values())
    assert texts[10 ** 7] == texts[1500]
