"""The job console: the log redirect catches what child processes write to fds 1 and 2
(as Ray's workers and C++ core do), progress lines off a terminal, the closing table, and
the one-line refusals before any worker starts (exit code 2)."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT
from shardscribe.jobs.console import Progress, summary_table


def test_job_log_takes_child_output_and_leaves_the_console_clean(tmp_path):
    script = textwrap.dedent(f"""
        import subprocess, sys
        from shardscribe.jobs.console import JobLog
        with JobLog({str(tmp_path / "out")!r}, "job.log") as log:
            print("python stdout"); print("python stderr", file=sys.stderr)
            subprocess.run(["sh", "-c", "echo child stdout; echo child stderr >&2"])
            print("for the console", file=log.console)
        print("after")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "after\n" and proc.stderr == "for the console\n"
    log = (tmp_path / "out" / "__shardscribe__" / "job.log").read_text()
    for line in ("python stdout", "python stderr", "child stdout", "child stderr"):
        assert line in log


def test_progress_lines_off_a_terminal():
    out = io.StringIO()
    p = Progress(10, out, interval_s=0.0, tty=False)
    p.update(0, 0.0, 0)  # nothing finished yet: no line before the heartbeat
    p.update(4, 7200.0, 1)
    p.close(10, 18000.0, 2)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("transcribe: 4/10 rec (40%)") and "2.00 h audio" in lines[0] and "1 errors" in lines[0]
    assert "ETA" in lines[0] and "RTFx" in lines[0]
    assert lines[1].startswith("transcribe: 10/10 rec (100%)") and "5.00 h audio" in lines[1]
    # A last update that already showed the final counts is not repeated by close().
    again = io.StringIO()
    p = Progress(3, again, interval_s=0.0, tty=False)
    p.update(3, 60.0, 0)
    p.close(3, 60.0, 0)
    assert len(again.getvalue().splitlines()) == 1


def test_a_piped_console_shows_the_first_finished_rows_at_once(monkeypatch):
    """Off a terminal the first line with finished rows is written as they finish, not an
    interval later; the lines after it keep the interval."""
    import shardscribe.jobs.console as console

    now = [100.0]
    monkeypatch.setattr(console.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    p = Progress(16, out, interval_s=10.0, tty=False)
    now[0] += 0.5
    p.update(0, 0.0, 0)
    assert out.getvalue() == ""
    now[0] += 1.0
    p.update(1, 4.5, 0)
    assert out.getvalue().splitlines() == [out.getvalue().strip()] and "transcribe: 1/16 rec" in out.getvalue()
    for step, rows in ((2.0, 3), (3.0, 7)):     # within the interval of that line: none
        now[0] += step
        p.update(rows, rows * 4.5, 0)
    assert len(out.getvalue().splitlines()) == 1
    now[0] += 6.0                               # 11 s after the first line
    p.update(9, 40.5, 0)
    p.close(16, 72.0, 0)
    lines = out.getvalue().splitlines()
    assert [line.split(" rec ")[0] for line in lines] == ["transcribe: 1/16", "transcribe: 9/16", "transcribe: 16/16"]
    # The final counts summed from the written rows may differ from the running sum of
    # the batches' in the last digits: the line already written is not repeated.
    again = io.StringIO()
    p = Progress(3, again, interval_s=0.0, tty=False)
    p.update(3, 0.1 + 0.2, 0)
    p.close(3, 0.3, 0)
    assert len(again.getvalue().splitlines()) == 1


def test_summary_table_shows_what_was_measured():
    summary = {"rows_in": 12, "rows_out": 12, "run_rows": 10, "skipped_existing": 2, "errors": 3,
               "errors_by_kind": {"file not found": 2, "cannot decode audio": 1},
               "stages": {"ctc_gate": 6, "mixed": 3, "error": 3}, "audio_seconds": 5400.0,
               "wall_seconds": 75.0, "rtfx": 72.0, "wer": 0.0234, "wer_rows": 9}
    text = "\n".join(summary_table(summary))
    for part in ("12 of 12 (10 this run, 2 already there)", "3: file not found 2, cannot decode audio 1",
                 "ctc_gate 6, mixed 3, error 3", "1.50 h", "1:15", "RTFx       72.0", "WER        2.3 %"):
        assert part in text, (part, text)
    rerun = dict(summary, run_rows=0, rtfx=None, wer=None)
    assert "RTFx" not in "\n".join(summary_table(rerun)) and "WER" not in "\n".join(summary_table(rerun))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("override, message", [
    ("model.source=/nonexistent", "model.source=/nonexistent: no such directory"),
    ("model.device=cuda", "model.device=cuda: no CUDA device is usable here"),
    ("model.source=someone/not-cached-model", "not in the local Hugging Face cache"),
])
def test_model_and_device_problems_are_one_line(tmp_path, samples_dir, override, message):
    proc = _cli("transcribe", "--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "o"),
                "--config", "ar", "--set", override)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()  # nothing started


def test_a_head_the_model_cannot_feed_is_one_line(tmp_path, samples_dir):
    model = tmp_path / "whisper-small-ish"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "whisper", "d_model": 768}))
    proc = _cli("transcribe", "--input", str(samples_dir / "samples.jsonl"), "--output", str(tmp_path / "o"),
                "--config", "ssd", "--set", f"model.source={model}")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "model.ctc_head=embedded: the head reads 384-wide encoder states" in proc.stderr
    assert "has 768" in proc.stderr


def test_the_log_of_a_remote_output_is_uploaded(monkeypatch, s3_endpoint):
    import fsspec

    from shardscribe.jobs.console import JobLog

    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": s3_endpoint})
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fs.mkdir("bucket")
    with JobLog("s3://bucket/out", "job.log", verbose=True) as log:
        assert not log.local
        log.write("a line of the job")
        local = Path(log.path)
        assert local.exists()
    assert fs.cat("bucket/out/__shardscribe__/job.log").decode() == "a line of the job\n"
    assert not local.parent.exists()     # the local copy of an uploaded log is gone
