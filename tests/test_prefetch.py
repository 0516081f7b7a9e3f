"""pipeline.prefetch: items produced in a thread ahead of the consumer arrive in order and
once each; a producer's exception reaches the consumer after the items before it; at most
``depth`` items wait; closing the consumer stops the producer. And the in-process runner,
which prepares its batches that way, writes every row once, a bad file as one error row."""
from __future__ import annotations

import json
import threading
import time

import pytest

from shardscribe.pipeline.prefetch import prefetched


def test_order_and_exactly_once():
    assert list(prefetched(iter(range(200)), depth=2)) == list(range(200))
    assert list(prefetched(iter(range(5)), depth=0)) == list(range(5))
    assert list(prefetched(iter([]), depth=1)) == []


def test_runs_ahead_in_another_thread_by_at_most_depth():
    produced, threads = [], set()

    def items():
        for i in range(10):
            threads.add(threading.get_ident())
            produced.append(i)
            yield i

    it = prefetched(items(), depth=2)
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while len(produced) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    # 0 consumed, 1 and 2 queued, 3 produced and waiting for room: never further.
    assert produced == [0, 1, 2, 3]
    assert threads and threading.get_ident() not in threads
    assert list(it) == list(range(1, 10))


def test_an_exception_arrives_after_the_items_before_it():
    def items():
        yield 1
        yield 2
        raise ValueError("bad batch")

    got = []
    with pytest.raises(ValueError, match="bad batch"):
        for x in prefetched(items(), depth=2):
            got.append(x)
    assert got == [1, 2]


def test_closing_the_consumer_stops_the_producer():
    produced = []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    it = prefetched(items(), depth=1)
    assert next(it) == 0
    it.close()
    time.sleep(0.5)
    count = len(produced)
    time.sleep(0.3)
    assert count == len(produced) and count < 5


@pytest.mark.slow
def test_local_runner_writes_each_row_once_with_a_bad_file(tmp_path, samples_dir, sample_manifest, model_cache):
    """Batches of 2 prepared ahead: 7 rows in, 7 out, the unreadable one an error row."""
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.config import load_config
    from shardscribe.pipeline.output import read_output
    from shardscribe.pipeline.sources import read_source

    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF not audio at all")
    lines = [{"id": f"s{i}", "audio": str(samples_dir / m["audio"])} for i, m in enumerate(sample_manifest[:3])]
    lines.insert(1, {"id": "bad", "audio": str(bad)})
    lines += [{"id": f"again{i}", "audio": str(samples_dir / m["audio"])} for i, m in enumerate(sample_manifest[:3])]
    manifest = tmp_path / "in.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = load_config("ctc_greedy", [f"model.cache_dir={model_cache}", "batching.recordings_per_batch=2"])
    written = run_local(read_source(str(manifest)), cfg, str(tmp_path / "out"), progress=False)
    out = read_output(str(tmp_path / "out"), ["id", "text", "error"]).to_pylist()
    assert written == len(lines) == len(out)
    assert sorted(r["id"] for r in out) == sorted(x["id"] for x in lines)
    by_id = {r["id"]: r for r in out}
    assert by_id["bad"]["error"] and not by_id["bad"]["text"]
    assert all(not r["error"] and r["text"] for i, r in by_id.items() if i != "bad")
    assert [by_id[f"s{i}"]["text"] for i in range(3)] == [by_id[f"again{i}"]["text"] for i in range(3)]
