"""The output folder's commit protocol (pipeline.output) and the storage helpers
(pipeline.storage), on real files: parts, lock, quarantine, job commit, URI redaction."""
from __future__ import annotations

import json
import socket
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset  # noqa: F401
import pyarrow.parquet as pq
import pytest

from conftest import corrupt_page_of
from shardscribe.pipeline import output
from shardscribe.pipeline.config import ConfigError, load_config
from shardscribe.pipeline.records import OUTPUT_SCHEMA, table
from shardscribe.pipeline.storage import StorageError, redact_uri, url_to_fs, utf8_name


def _rows(ids, words: int = 3):
    rng = np.random.default_rng(len(ids))
    return table([{"id": i, "audio": f"/a/{i}.wav", "stage": "ar", "segments": [],
                   "text": " ".join(f"w{rng.integers(1 << 30)}" for _ in range(words))} for i in ids], OUTPUT_SCHEMA)


def _resume(dst: str, job_id: str) -> set[str]:
    """The ids a job's start finds done in ``dst``, its unreadable parts quarantined."""
    scan = output.scan_output(dst)
    output.quarantine_unreadable(dst, scan, job_id)
    return set(scan.done_ids().to_pylist())


def test_part_name_is_a_function_of_the_ids_alone(tmp_path):
    a = output.write_part(_rows(["x", "y", "z"]), str(tmp_path), "job1")
    b = output.write_part(_rows(["z", "x", "y"]), str(tmp_path), "job2")   # a retry, other order
    c = output.write_part(_rows(["x", "y"]), str(tmp_path), "job2")
    assert a == b != c and a.startswith("part-")
    # The retry replaced its own part: one copy of each row, and no temporary file left.
    assert sorted(os.listdir(tmp_path)) == sorted({a, c})
    assert _resume(str(tmp_path), "job3") == {"x", "y", "z"}


def test_part_committer_commits_by_count_or_by_time_since_the_last_commit(tmp_path):
    """The one commit policy of both runners: rows_per_part rows, or interval_s since the
    last commit (not since a batch arrived), whichever comes first; flush commits the rest."""
    now = [0.0]
    parts = output.PartCommitter(str(tmp_path), "job", rows_per_part=4, interval_s=10.0, clock=lambda: now[0])

    def add(committer, ids):
        committer.add(_rows(ids))
        committer.commit_if_due()

    def committed():
        return sorted(pq.read_table(p).column("id").to_pylist() for p in tmp_path.glob("part-*.parquet"))

    add(parts, ["a", "b"])
    assert committed() == []
    add(parts, ["c", "d"])                     # by count, at t=0
    assert committed() == [["a", "b", "c", "d"]]
    now[0] = 9.0
    add(parts, ["e"])
    assert len(committed()) == 1
    now[0] = 10.0                                     # 10 s since the last commit, 1 s since "e"
    add(parts, ["f"])
    assert committed() == [["a", "b", "c", "d"], ["e", "f"]]
    add(parts, ["g"])
    parts.flush()
    parts.flush()                                     # nothing pending: no empty part
    assert len(committed()) == 3 and (parts.committed_rows, parts.committed_parts) == (7, 3)

    by_count = output.PartCommitter(str(tmp_path / "count"), "job", rows_per_part=4, interval_s=None,
                                    clock=lambda: now[0])
    now[0] = 1e9
    add(by_count, ["x"])
    assert not (tmp_path / "count").exists()


def test_ids_holding_nul_do_not_share_a_part_name(tmp_path):
    """Ids are free text: two sets that a separator join makes alike must name two parts,
    or one part replaces the other and its rows are lost."""
    one = output.write_part(_rows(["a", "b"]), str(tmp_path), "job1")
    two = output.write_part(_rows(["a\0b"]), str(tmp_path), "job1")
    assert one != two and output.part_name(["a\0", "b"]) != output.part_name(["a", "\0b"])
    assert _resume(str(tmp_path), "job2") == {"a", "b", "a\0b"}


def test_resume_reads_whole_parts_and_quarantines_a_page_corrupt_one(tmp_path):
    good = output.write_part(_rows(["a", "b"]), str(tmp_path), "j")
    # Enough text that the middle of its column chunk is page data, not a page header.
    bad = output.write_part(_rows([f"c{i}" for i in range(50)], words=40), str(tmp_path), "j")
    corrupt_page_of(tmp_path / bad, "text")
    # The footer and the id column still read: a check on `id` alone would keep this part.
    assert pq.read_table(tmp_path / bad, columns=["id"]).num_rows == 50
    ids = _resume(str(tmp_path), "resume1")
    assert ids == {"a", "b"}
    assert sorted(os.listdir(tmp_path)) == [output.SIDECAR_DIR, good]
    assert os.listdir(tmp_path / output.QUARANTINE_DIR) == [f"{bad}.resume1"]


def test_a_part_from_before_a_column_was_added_is_kept_and_reads(tmp_path):
    """Resume keeps a part that lacks a column added later (offset_s), and the readers give
    null there; a Parquet file that is not one of ours (no text or segments) is set aside."""
    old = _rows(["a", "b"]).drop_columns(["offset_s", "confidence"])
    pq.write_table(old, tmp_path / "part-old.parquet")
    output.write_part(_rows(["c"]), str(tmp_path), "j")
    pq.write_table(pa.table({"id": ["z"]}), tmp_path / "part-foreign.parquet")
    assert _resume(str(tmp_path), "r") == {"a", "b", "c"}
    assert os.listdir(tmp_path / output.QUARANTINE_DIR) == ["part-foreign.parquet.r"]
    got = output.read_output(str(tmp_path), ["id", "offset_s", "confidence"])
    assert sorted(got.to_pylist(), key=lambda r: r["id"]) == \
        [{"id": i, "offset_s": None, "confidence": None} for i in "abc"]
    assert sorted(r["id"] for rows in output.iter_output(str(tmp_path), ["id", "offset_s"]) for r in rows) == \
        ["a", "b", "c"]


def test_drop_error_rows_removes_only_the_inputs_error_rows(tmp_path):
    """--retry-errors: the error rows of the given ids leave their parts; a part keeps its
    name and its other rows, a part of nothing but such rows is removed, and the error rows
    of ids outside the input (an earlier job's) stay."""
    def rows(spec):
        t = _rows([i for i, _ in spec])
        return t.set_column(t.schema.get_field_index("error"), "error",
                            pa.array([e for _, e in spec], pa.string()))

    mixed = output.write_part(rows([("a", None), ("b", "file not found: b"), ("c", None),
                                    ("other", "cannot decode: other")]), str(tmp_path), "j1")
    output.write_part(rows([("d", "read timeout: d")]), str(tmp_path), "j1")
    clean = output.write_part(rows([("e", None)]), str(tmp_path), "j1")
    before = {r["id"]: r for r in pq.read_table(tmp_path / mixed).to_pylist()}
    clean_bytes = (tmp_path / clean).read_bytes()

    scan = output.scan_output(str(tmp_path))
    after = output.drop_error_rows(str(tmp_path), scan, pa.array(list("abcde")), "j2")

    assert scan.rows.num_rows - after.rows.num_rows == 2
    assert sorted(os.listdir(tmp_path)) == sorted([mixed, clean])   # no temporary file left
    after_rows = pq.read_table(tmp_path / mixed).to_pylist()
    assert [r["id"] for r in after_rows] == ["a", "c", "other"]
    assert after_rows == [before[i] for i in ("a", "c", "other")]
    assert (tmp_path / clean).read_bytes() == clean_bytes            # untouched
    # what the job then finds done: what a fresh start finds in the folder
    assert set(after.done_ids().to_pylist()) == _resume(str(tmp_path), "j3") == {"a", "c", "e", "other"}
    again = output.scan_output(str(tmp_path))
    assert output.drop_error_rows(str(tmp_path), again, pa.array(list("abcde")), "j3") is again


def test_a_half_written_part_is_quarantined(tmp_path):
    part = output.write_part(_rows(["a", "b", "c"]), str(tmp_path), "j")
    data = (tmp_path / part).read_bytes()
    (tmp_path / part).write_bytes(data[: len(data) // 2])
    assert _resume(str(tmp_path), "r") == set()
    assert not (tmp_path / part).exists() and (tmp_path / output.QUARANTINE_DIR).is_dir()


def test_a_second_job_is_refused_while_the_first_holds_the_folder(tmp_path):
    first = output.OutputLock(str(tmp_path), "first").acquire()
    try:
        with pytest.raises(output.OutputBusy, match="in use by job first"):
            output.OutputLock(str(tmp_path), "second").acquire()
    finally:
        first.release()
    assert not (tmp_path / output.LOCK_NAME).exists()
    output.OutputLock(str(tmp_path), "second").acquire().release()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(proc.stdout)
    # The dead pid is one of this PID namespace's (same host, boot id and namespace).
    info = {"job": "dead", **output._identity(), "pid": dead_pid, "heartbeat": time.time()}
    (tmp_path / output.SIDECAR_DIR).mkdir()
    (tmp_path / output.LOCK_NAME).write_text(json.dumps(info))
    assert output.lock_is_stale(info)
    lock = output.OutputLock(str(tmp_path), "alive").acquire()
    held = json.loads((tmp_path / output.LOCK_NAME).read_text())
    assert (held["job"], held["epoch"]) == ("alive", 1)
    lock.release()
    assert not list((tmp_path / output.SIDECAR_DIR).iterdir())     # LOCK and its claim gone
    # The same host name but another PID namespace (a container with the host's network),
    # or a lock that records none (an older version): its pid means nothing here, so only
    # its heartbeat counts.
    for other in ({**info, "pid_ns": "pid:[1]"}, {**info, "boot_id": "another-boot"},
                  {k: v for k, v in info.items() if k not in ("boot_id", "pid_ns")}):
        assert not output.lock_is_stale(other)
        assert output.lock_is_stale(other, now=time.time() + output.STALE_AFTER_S + 1)
    # Another host's lock is stale only once its heartbeat stops.
    remote = {"job": "r", "host": "elsewhere", "pid": 1, "heartbeat": time.time()}
    assert not output.lock_is_stale(remote)
    assert output.lock_is_stale(remote, now=time.time() + output.STALE_AFTER_S + 1)


def test_job_begin_and_commit(tmp_path):
    (tmp_path / output.SIDECAR_DIR).mkdir()
    (tmp_path / output.SUCCESS_NAME).write_text("")
    (tmp_path / ".tmp-deadjob-part-1.parquet").write_bytes(b"half")
    (tmp_path / ".tmp-me-part-2.parquet").write_bytes(b"mine")
    output.begin_job(str(tmp_path), "me")
    assert sorted(os.listdir(tmp_path)) == [".tmp-me-part-2.parquet", output.SIDECAR_DIR]
    output.commit_job(str(tmp_path), {"rows_in": 1}, success=False)
    assert not (tmp_path / output.SUCCESS_NAME).exists()
    output.commit_job(str(tmp_path), {"rows_in": 1}, success=True)
    assert json.loads((tmp_path / output.SUMMARY_NAME).read_text()) == {"rows_in": 1}
    assert (tmp_path / output.SUCCESS_NAME).exists()
    # Every name beside the parts is one that dataset readers skip.
    part = output.write_part(_rows(["q"]), str(tmp_path), "me")
    (tmp_path / ".tmp-me-part-2.parquet").unlink()
    assert all(n.startswith(("_", ".")) or n == part for n in os.listdir(tmp_path))
    assert pa.dataset.dataset(str(tmp_path)).to_table().column("id").to_pylist() == ["q"]


def test_summary_read_a_batch_at_a_time_equals_one_over_all_rows(tmp_path, monkeypatch):
    """The summary reads the output in small batches across parts; its corpus WER, counts
    and duplicates must equal jiwer and plain counting over all rows at once."""
    import jiwer

    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    rows = []
    for i in range(23):
        ref = " ".join(rng.choice(words, size=int(rng.integers(1, 7))))
        hyp = " ".join(w for w in ref.split() if rng.random() > 0.3) + (" beta" if i % 4 == 0 else "")
        rows.append({"id": f"u{i}", "audio": f"/a/{i}.wav", "stage": "ar", "segments": [],
                     "text": hyp.strip(), "reference": ref, "duration_s": 1.0 + i,
                     "error": "DecodeError: bad bytes" if i % 7 == 3 else None})
    dup = dict(rows[5])  # u5 written twice: a duplicate the summary must count
    for chunk in (rows[:9], rows[9:17], rows[17:] + [dup]):
        output.write_part(table(chunk, OUTPUT_SCHEMA), str(tmp_path), "job")
    # An earlier job's rows of other ids in the same folder: counted apart, described nowhere.
    other = [{"id": f"old{i}", "audio": "/o.wav", "stage": "ctc_greedy", "segments": [], "text": "zzz",
              "reference": "alpha", "duration_s": 100.0, "error": "DecodeError: x" if i else None} for i in range(2)]
    output.write_part(table(other, OUTPUT_SCHEMA), str(tmp_path), "old")
    iter_output = output.iter_output
    monkeypatch.setattr(output, "iter_output", lambda *a, **k: iter_output(*a, **{**k, "batch_rows": 4}))
    ids = [f"u{i}" for i in range(24)]  # u23 never written
    s = output.summarize(str(tmp_path), ids, {"wall_seconds": 2.0}, run_ids={"u1", "u2", "u3"})
    ok = [r for r in rows if not r["error"]]
    ok.append(dup)
    assert s["wer"] == pytest.approx(jiwer.wer([r["reference"] for r in ok], [r["text"] for r in ok]))
    assert s["wer_rows"] == len(ok)
    assert (s["rows_in"], s["rows_out"], s["duplicate_rows"], s["missing_ids"]) == (24, 24, 1, ["u23"])
    assert s["extra_rows"] == 2 and s["stages"] == {"ar": 24}
    assert (s["errors"], s["errors_by_kind"]) == (3, {"other": 3})   # a kind of pipeline.output.ERROR_KINDS
    assert s["audio_seconds"] == pytest.approx(sum(r["duration_s"] for r in rows) + dup["duration_s"])
    assert (s["run_rows_out"], s["run_errors"], s["run_audio_seconds"], s["rtfx"]) == (3, 1, 9.0, 4.5)


@pytest.mark.parametrize("uri, clean", [
    ("s3://bucket/a/b.wav", "s3://bucket/a/b.wav"),
    ("https://user:secret@host.example/x.flac?X-Amz-Signature=abc&X-Amz-Security-Token=t",
     "https://host.example/x.flac"),
    ("http://host.example:8080/x.wav?token=zzz#3", "http://host.example:8080/x.wav#3"),
    ("gs://b/k.parquet#12", "gs://b/k.parquet#12"),
    ("/local/path/with?mark.wav", "/local/path/with?mark.wav"),
    ("s3://AKIA:sk@bucket/k.wav", "s3://bucket/k.wav"),
    # secrets with '/', '#' or '?' in them, which urlsplit reads as the end of the host
    ("s3://AKIA:abc/def+ghi@bucket/x.wav", "s3://bucket/x.wav"),
    ("s3://AKIA:a#b@bucket/x.wav", "s3://bucket/x.wav"),
    ("s3://AKIA:a?b@bucket/x.wav", "s3://bucket/x.wav"),
    ("s3://bucket/take@2:00.wav", "s3://bucket/take@2:00.wav"),     # an '@' in the path stays
    ("https://host.example:8080/x@y.wav", "https://host.example:8080/x@y.wav"),   # after a port too
    ("s3://AKIA:12/ab@bucket/x.wav", "s3://bucket/x.wav"),          # a bucket URL has no port
    (None, None),
])
def test_redact_uri(uri, clean):
    assert redact_uri(uri) == clean
    if uri:
        for secret in ("secret", "abc", "def+ghi", "a#b", "a?b", "12/ab", "zzz", "AKIA", "sk@", "token="):
            assert secret not in (redact_uri(uri) or "") or secret in clean


def test_utf8_name():
    assert utf8_name("ok.wav") == ("ok.wav", None)
    raw = b"bad\xff\xfe.wav".decode("utf-8", "surrogateescape")
    text, error = utf8_name(raw)
    assert text == "bad\\xff\\xfe.wav" and "not valid UTF-8" in error
    pa.array([text])  # Arrow accepts it


def test_storage_options_refuse_credentials_and_a_missing_backend_is_one_line():
    with pytest.raises(ConfigError, match="storage.options.secret: credentials"):
        load_config("ar", ["storage.options={secret: x}"])
    with pytest.raises(ConfigError, match="client_kwargs.aws_secret_access_key"):
        load_config("ar", ["storage.options={client_kwargs: {aws_secret_access_key: x}}"])
    cfg = load_config("ar", ["storage.options={endpoint_url: 'http://127.0.0.1:1', anon: true}", "output.rows_per_part=5"])
    assert cfg.storage.options["anon"] is True and cfg.output.rows_per_part == 5
    with pytest.raises(StorageError, match=r"pip install 'shardscribe\[gcs\]'"):
        try:
            import gcsfs  # noqa: F401
        except ImportError:
            url_to_fs("gs://bucket/x")
        else:
            raise StorageError("pip install 'shardscribe[gcs]' (gcsfs present: nothing to check)")


def test_an_unreachable_endpoint_is_one_line(monkeypatch):
    from shardscribe.pipeline.storage import check_reachable

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with socket.socket() as s:   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "config_kwargs": {"retries": {"max_attempts": 1}}}
    with pytest.raises(StorageError) as exc:
        check_reachable("s3://user:pw@bucket/out?sig=1", options)
    message = str(exc.value)
    assert message.startswith("s3://bucket/out: storage not reachable") and "\n" not in message
    assert "pw" not in message and "sig" not in message


def test_storage_options_reach_this_process_and_the_processes_it_starts(monkeypatch):
    import fsspec

    from shardscribe.pipeline.storage import options_environment, use_options

    monkeypatch.setattr(fsspec.config, "conf", {})
    monkeypatch.delenv("FSSPEC_S3", raising=False)
    options = {"endpoint_url": "http://127.0.0.1:9", "client_kwargs": {"region_name": "eu-west-3"}}
    use_options(options, ["s3://bucket/in/", "/local/out", None])
    assert fsspec.config.conf == {"s3": options}
    assert options_environment() == {"FSSPEC_S3": json.dumps(options)}
    child = subprocess.run([sys.executable, "-c", "import fsspec, json; print(json.dumps(fsspec.config.conf['s3']))"],
                           capture_output=True, text=True, check=True)
    assert json.loads(child.stdout) == options


def test_only_our_parts_are_read_or_removed(tmp_path):
    """A Parquet file of the user's in the output folder (an input table, say) is not a
    part: resume does not read or quarantine it, and --overwrite does not remove it."""
    theirs = tmp_path / "data.parquet"
    pq.write_table(pa.table({"audio": ["x.wav"]}), theirs)
    output.write_part(_rows(["a"]), str(tmp_path), "j")
    assert _resume(str(tmp_path), "r") == {"a"}
    assert output.clear_output(str(tmp_path)) == 1
    assert theirs.exists() and pq.read_table(theirs).num_rows == 1


def test_a_parquet_input_and_the_output_may_not_hold_one_another(tmp_path, samples_dir):
    import argparse

    from shardscribe.jobs.transcribe import add_arguments, run

    folder = tmp_path / "pq"
    folder.mkdir()
    data = (samples_dir / "fox_flite_slt.flac").read_bytes()
    pq.write_table(pa.table({"audio": [{"bytes": data, "path": None}]}), folder / "data.parquet")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for out in (folder, folder / "out"):
        for extra in ([], ["--overwrite"]):
            args = parser.parse_args(["--input", str(folder), "--output", str(out), "--runner", "local",
                                      "--config", "ctc_greedy", *extra])
            assert run(args) == 2
            assert sorted(os.listdir(folder)) == ["data.parquet"]


def test_no_credentials_in_errors_logs_or_the_report(monkeypatch):
    """An HTTP client's error names the URL it fetched, decoded differently from the one
    given (%2F as /); the job log's printed location and the report name the output
    without its password; options that carry secrets are refused."""
    from shardscribe.jobs.console import JobLog
    from shardscribe.pipeline import prepare
    from shardscribe.pipeline.report import render_html, report_data
    from shardscribe.pipeline.storage import redact_text

    url = "https://h.example/rec.wav?X-Amz-Credential=AKIA%2F2024%2Fus&X-Amz-Signature=deadbeef"
    decoded = url.replace("%2F", "/")
    message = f"ClientResponseError while preparing audio: 403, message='Forbidden', url='{decoded}'"
    assert redact_text(message) == ("ClientResponseError while preparing audio: 403, message='Forbidden', "
                                    "url='https://h.example/rec.wav'")
    monkeypatch.setattr(prepare, "prepare_row", lambda row, seg, q, *limits: {**row, "error": message, "seg_start": []})
    monkeypatch.setattr(prepare, "_not_a_regular_file", lambda row: None)
    out = prepare.prepare_row_within({"id": "r", "audio": url}, None, "HQ", 5.0)
    assert "deadbeef" not in out["error"] and "AKIA" not in out["error"] and "rec.wav" in out["error"]
    dst = "s3://AKIAEXAMPLE:wJalr/K7MDENG@bucket/out"
    log = JobLog(dst, "transcribe.log")
    assert "wJalr" not in log.url and log.url.startswith("s3://bucket/out/")
    page = render_html(dst, report_data([]), None, [])
    assert "wJalr" not in page and "AKIAEXAMPLE" not in page
    for key in ("account_key", "sas_token", "client_secret", "connection_string"):
        with pytest.raises(ConfigError, match=key):
            load_config("ar", [f"storage.options.{key}=x"])
    with pytest.raises(ConfigError, match="Authorization"):
        load_config("ar", ["storage.options.client_kwargs.headers.Authorization=Bearer x"])
