"""pipeline.regroup: consecutive prepared blocks joined into model-stage batches of at
least N rows, the slow start's pieces alone, input order and every row kept; and through
the in-process runner, a job whose blocks are joined gives each recording the text it gets
in a block of its own."""
from __future__ import annotations

import pyarrow as pa
import pytest

from shardscribe.pipeline.regroup import joined_blocks


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
def test_joined_blocks_keep_each_recordings_text(tmp_path, samples_dir, sample_manifest, model_cache, monkeypatch):
    import shardscribe.actors.local_runner as local_runner
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.output import read_output
    from shardscribe.pipeline.sources import read_source

    rows = read_source(str(samples_dir / "samples.jsonl"))[:5]
    cfg = load_config("ctc_greedy", [f"model.cache_dir={model_cache}", "batching.recordings_per_batch=1",
                                     "batching.first_batch=1", "model.encoder_dtype=float32", "model.quantize=none"])
    texts = {}
    for joined in (1, 3):
        monkeypatch.setattr(local_runner, "JOINED_BLOCKS", joined)
        dst = tmp_path / f"out{joined}"
        assert local_runner.run_local(rows, cfg, str(dst), progress=False) == len(rows)
        texts[joined] = {r["id"]: r["text"] for r in read_output(str(dst), ["id", "text"]).to_pylist()}
    assert len(texts[1]) == len(rows) and all(texts[1].values())
    assert texts[3] == texts[1]
