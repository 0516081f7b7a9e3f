"""Resume keyed by content: look-alike inputs from two folders into one output (same ids,
other files) are refused by default, added under distinct ids with --resume, replaced
with --overwrite; rows of older versions (no audio_stamp) still resume; and the driver's
id sets live on disk, not its heap. In process, local runner, the no-model audit kind."""
from __future__ import annotations

import io
import json
import resource

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from shardscribe.actors.job import JobSpec
from shardscribe.jobs import transcribe
from shardscribe.pipeline import output
from shardscribe.pipeline.resume import distinct_id

AUDIT = ["decoder.kind=audit", "model.device=cpu"]


def _wav(path, seed: int) -> None:
    t = np.arange(8000) / 16000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * (200 + 40 * seed) * t)).astype(np.float32), 16000, format="WAV")
    path.write_bytes(buf.getvalue())


@pytest.fixture
def days(tmp_path):
    (tmp_path / "day1").mkdir()
    (tmp_path / "day2").mkdir()
    _wav(tmp_path / "day1" / "clip001.wav", 1)
    _wav(tmp_path / "day2" / "clip001.wav", 2)
    _wav(tmp_path / "day2" / "clip002.wav", 3)
    return tmp_path


def _job(src, dst, capsys, **flags) -> tuple[int, str]:
    code = transcribe.execute(JobSpec(input=str(src), output=str(dst), runner="local", overrides=AUDIT, **flags))
    return code, capsys.readouterr().err


def _rows(dst) -> list[dict]:
    parts = sorted(str(p) for p in dst.glob("part-*.parquet"))
    return pq.read_table(parts, columns=["id", "audio", "audio_stamp"]).to_pylist() if parts else []


def test_look_alike_inputs_refused_then_resumed_then_overwritten(days, capsys):
    dst = days / "out"
    assert _job(days / "day1", dst, capsys)[0] == 0
    (first,) = _rows(dst)
    assert first["id"] == "clip001.wav" and first["audio_stamp"]    # size:mtime of the listing

    # Tuesday's folder: clip001.wav is another recording under the same id.
    code, err = _job(days / "day2", dst, capsys)
    refusal = [ln for ln in err.splitlines() if ln.startswith("shardscribe: error:")]
    assert code == 2 and len(refusal) == 1, err
    assert "1 of this input's ids from another source" in refusal[0] and "'clip001.wav'" in refusal[0], err
    assert "day1/clip001.wav" in refusal[0] and "day2/clip001.wav" in refusal[0]
    assert _rows(dst) == [first]                             # nothing written
    dry = _job(days / "day2", dst, capsys, dry_run=True)
    assert dry[0] == 2 and "from another source" in dry[1]

    code, err = _job(days / "day2", dst, capsys, resume=True)
    assert code == 0, err
    rows = {r["id"]: r for r in _rows(dst)}
    renamed = distinct_id("clip001.wav", str(days / "day2" / "clip001.wav"),
                          rows[next(i for i in rows if i.startswith("clip001.wav~"))]["audio_stamp"], None)
    assert set(rows) == {"clip001.wav", renamed, "clip002.wav"}
    assert rows["clip001.wav"]["audio"].endswith("day1/clip001.wav")
    assert rows[renamed]["audio"].endswith("day2/clip001.wav")
    summary = json.loads((dst / output.SUMMARY_NAME).read_text())
    assert summary["rows_in"] == summary["rows_out"] == 2 and summary["duplicate_rows"] == 0, summary
    assert summary["extra_rows"] == 1

    # The same command again, with or without --resume: everything is done, no conflict.
    for flags in ({}, {"resume": True}):
        code, err = _job(days / "day2", dst, capsys, **flags)
        assert code == 0 and "resuming: 2 of 2" in err, err
        assert len(_rows(dst)) == 3

    code, err = _job(days / "day2", dst, capsys, overwrite=True)
    assert code == 0, err
    assert sorted(r["id"] for r in _rows(dst)) == ["clip001.wav", "clip002.wav"]
    assert all("/day2/" in r["audio"] for r in _rows(dst))


def test_a_changed_file_at_the_same_path_is_a_conflict(days, capsys):
    dst = days / "out"
    assert _job(days / "day2", dst, capsys)[0] == 0
    _wav(days / "day2" / "clip002.wav", 9)         # re-recorded: another size or mtime
    wav = days / "day2" / "clip002.wav"
    wav.write_bytes(wav.read_bytes() + b"\0" * 64)
    code, err = _job(days / "day2", dst, capsys)
    assert code == 2 and "'clip002.wav'" in err, err


def test_rows_of_an_older_version_without_a_stamp_still_resume(days, capsys):
    dst = days / "out"
    assert _job(days / "day2", dst, capsys)[0] == 0
    for part in dst.glob("part-*.parquet"):
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["audio_stamp"]), part)
    code, err = _job(days / "day2", dst, capsys)
    assert code == 0 and "resuming: 2 of 2" in err, err


def test_resume_plan_holds_one_bucket_at_a_time(tmp_path):
    """The plan over 200k input rows and 200k stored rows: the driver's peak grows by a
    fraction of what Python sets of those ids took (~30 MB here)."""
    from shardscribe.pipeline.id_buckets import IdBuckets
    from shardscribe.pipeline.resume import DONE, plan_resume
    from shardscribe.pipeline.sources import INDEX_SCHEMA, Scan

    n = 200_000
    ids = pa.array([f"rec-{i:07d}" for i in range(n)])
    audio = pa.array([f"/corpus/{i:07d}.wav" for i in range(n)])
    index = IdBuckets(INDEX_SCHEMA)
    index.add(pa.table({"id": ids, "audio": audio, "stamp": pa.nulls(n, pa.string()),
                        "offset_s": pa.nulls(n, pa.float64()), "seq": pa.array(np.arange(n))}))
    stored = IdBuckets(output._SCAN_SCHEMA)
    half = n // 2
    stored.add(pa.table({"id": ids[:half], "audio": audio[:half], "stamp": pa.nulls(half, pa.string()),
                         "offset_s": pa.nulls(half, pa.float64()), "error": pa.array(np.zeros(half, bool)),
                         "part": pa.array(np.zeros(half, np.int32))}))
    del ids, audio
    scan = Scan(n, [], index.finish())
    found = output.OutputScan([], stored.finish(), {}, {})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    plan = plan_resume(scan, found)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert plan.done == half and plan.todo == n - half and not plan.conflicts
    assert int((plan.actions == DONE).sum()) == half
    assert grown_mb < 15, grown_mb
    scan.close()
    found.close()
