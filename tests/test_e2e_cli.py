"""End to end: the CLI on a real local Ray instance over real audio, broken files mixed in."""
from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from conftest import ROOT, espeak
from shardscribe.pipeline.output import SUMMARY_NAME


def _wav(samples, rate=16000):
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def mixed_input(tmp_path_factory, samples_dir, sample_manifest):
    root = tmp_path_factory.mktemp("mixed")
    lines = [{"id": m["id"], "audio": str(samples_dir / m["audio"]), "text": m["text"]} for m in sample_manifest]
    good = _wav(0.3 * np.sin(np.arange(32000) / 5.0))
    broken = {
        "empty.wav": b"",
        "random.wav": bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8)),
        "text_renamed.flac": b"just some text, not audio\n" * 10,
        "truncated.wav": good[: len(good) // 3],
        "zero_samples.wav": _wav(np.zeros(0, dtype=np.float32)),
        "silence.wav": _wav(np.zeros(48000, dtype=np.float32)),
    }
    for name, data in broken.items():
        (root / name).write_bytes(data)
        lines.append({"id": name, "audio": str(root / name)})
    lines.append({"id": "missing.wav", "audio": str(root / "missing.wav")})
    manifest = root / "manifest.jsonl"
    manifest.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return manifest, len(lines)


def _run_cli(*args):
    return subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


def _cli_here(capsys, *args):
    """``_run_cli`` in this process (jobs.cli.main, its output captured): for the audit
    kind's jobs, where the subject is the job's rule, not a new interpreter's imports."""
    from types import SimpleNamespace

    from shardscribe.jobs.cli import main

    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


def _rows(dst):
    return pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()


def test_ray_job_end_to_end_with_broken_files(mixed_input, tmp_path, sample_manifest):
    manifest, n = mixed_input
    dst = tmp_path / "out"
    proc = _run_cli("transcribe", "--input", str(manifest), "--output", str(dst), "--config", "ar")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((dst / SUMMARY_NAME).read_text())
    assert summary["rows_in"] == summary["rows_out"] == n
    rows = {r["id"]: r for r in _rows(dst)}
    assert len(rows) == n
    for bad, message in [("empty.wav", "empty file"), ("random.wav", "cannot decode"),
                         ("text_renamed.flac", "cannot decode"), ("zero_samples.wav", "zero samples"),
                         ("missing.wav", "file not found"), ("truncated.wav", "truncated or corrupt")]:
        assert rows[bad]["stage"] == "error" and message in rows[bad]["error"], rows[bad]
        assert rows[bad]["text"] is None
    assert rows["silence.wav"]["error"] is None
    assert summary["errors"] == sum(1 for r in rows.values() if r["error"])
    for m in sample_manifest:
        row = rows[m["id"]]
        assert row["error"] is None and row["stage"] == "ar" and row["text"]
        assert row["segments"][0]["start"] == 0.0 and row["duration_s"] > 1.0
    # Whisper tiny.en on clean TTS: a few words wrong at most.
    assert summary["wer"] is not None and summary["wer"] < 0.15
    assert summary["rtfx"] > 0

    # A rerun resumes: nothing is decoded again and no row is duplicated.
    again = _run_cli("transcribe", "--input", str(manifest), "--output", str(dst), "--config", "ar")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming" in again.stderr
    assert len(_rows(dst)) == n
    assert json.loads((dst / SUMMARY_NAME).read_text())["rows_out"] == n

    # The in-process runner gives the same transcripts.
    local = tmp_path / "local"
    proc = _run_cli("transcribe", "--input", str(manifest), "--output", str(local), "--runner", "local",
                    "--config", "ar")
    assert proc.returncode == 0, proc.stderr[-3000:]
    local_rows = {r["id"]: r for r in _rows(local)}
    assert {k: (r["text"], r["error"]) for k, r in local_rows.items()} == \
           {k: (r["text"], r["error"]) for k, r in rows.items()}


BROKEN = [("empty.wav", "empty file"), ("random.wav", "cannot decode"), ("text_renamed.flac", "cannot decode"),
          ("zero_samples.wav", "zero samples"), ("missing.wav", "file not found")]


def test_a_two_stage_kind_keeps_the_prepare_errors_in_process(mixed_input, tmp_path, model_cache):
    """ctc_beam through the in-process runner: a file that cannot be read keeps its error
    through the second stage (it used to come out as no_speech with no error). On Ray, every
    shipped config, the two-pool ones included, is checked the same way in
    test_broken_inputs.py."""
    manifest, n = mixed_input
    dst = tmp_path / "out"
    args = ["transcribe", "--input", str(manifest), "--output", str(dst), "--runner", "local",
            "--set", f"model.cache_dir={model_cache}", "--config", "ctc_beam"]
    proc = _run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((dst / SUMMARY_NAME).read_text())
    rows = {r["id"]: r for r in _rows(dst)}
    assert summary["rows_in"] == summary["rows_out"] == len(rows) == n
    for bad, message in BROKEN:
        assert rows[bad]["stage"] == "error" and message in (rows[bad]["error"] or ""), rows[bad]
    assert summary["errors"] == sum(1 for r in rows.values() if r["error"]) >= len(BROKEN)


def test_three_minute_recording_keeps_all_its_words(tmp_path, model_cache):
    from shardscribe.pipeline.config import load_config
    from shardscribe.actors.local_runner import run_local
    from shardscribe.pipeline.metrics import corpus_wer, normalize

    sentences = [
        "The inspection started at the north gate of the plant.",
        "Every valve on the main line was checked for leaks.",
        "Two of the pumps showed signs of wear on their seals.",
        "The team replaced the worn seals before lunch.",
        "After lunch they tested the pressure in each tank.",
        "The readings were normal except for the last tank.",
        "That tank was drained and cleaned in the afternoon.",
        "A new sensor was fitted to the outlet pipe.",
        "The control room confirmed the new readings.",
        "The report was sent to the manager in the evening.",
    ]
    text = " ".join(sentences * 5)
    wav = espeak(text, tmp_path / "long.wav", speed=130)
    duration = sf.info(str(wav)).duration
    assert duration > 180, duration
    cfg = load_config("ar", [f"model.cache_dir={model_cache}"])
    out = tmp_path / "out"
    run_local([{"id": "long", "audio": str(wav), "audio_bytes": None, "reference": text}], cfg, str(out),
              progress=False)
    row = _rows(out)[0]
    assert row["error"] is None and len(row["segments"]) >= 6
    assert all(s["end"] - s["start"] <= 30.0 for s in row["segments"])
    # The segments reach the end of the recording and the last sentence is there.
    assert row["segments"][-1]["end"] > duration - 3.0
    assert "manager in the evening" in normalize(row["segments"][-1]["text"])
    hyp_words, ref_words = normalize(row["text"]).split(), normalize(text).split()
    assert len(hyp_words) > 0.9 * len(ref_words)
    assert corpus_wer([text], [row["text"]]) < 0.25


def test_a_run_where_every_recording_fails_exits_4(tmp_path, capsys):
    """A mount that is down looks like a corpus of missing files: the rows are written
    (rows in = rows out), but the exit tells a scheduler the run did nothing."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"m{i}", "audio": str(tmp_path / "gone" / f"{i}.wav")}) + "\n"
                                for i in range(3)))
    dst = tmp_path / "out"
    proc = _cli_here(capsys, "transcribe", "--input", str(manifest), "--output", str(dst), "--runner", "local",
                    "--set", "decoder.kind=audit")
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "every one of the 3 recordings" in proc.stderr and len(_rows(dst)) == 3
    assert "--retry-errors" in proc.stderr
    assert (dst / SUMMARY_NAME).exists()


def test_retry_errors_redoes_the_failed_recordings_once_the_mount_is_back(tmp_path, samples_dir, sample_manifest, capsys):
    """A mount that was down for part of a job: a plain rerun keeps the error rows (they
    are rows), --retry-errors transcribes those recordings again and replaces their rows,
    one row per recording; --overwrite with it is refused in one line."""
    import shutil

    mount = tmp_path / "mount"
    present = samples_dir / sample_manifest[0]["audio"]
    lines = [{"id": "here", "audio": str(present)}] + [
        {"id": f"m{i}", "audio": str(mount / f"{i}{present.suffix}")} for i in range(3)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    dst = tmp_path / "out"
    job = ["transcribe", "--input", str(manifest), "--output", str(dst), "--runner", "local",
           "--set", "decoder.kind=audit"]
    assert _cli_here(capsys, *job).returncode == 0
    assert sorted(r["id"] for r in _rows(dst) if r["error"]) == ["m0", "m1", "m2"]

    mount.mkdir()
    for i in range(3):
        shutil.copy(present, mount / f"{i}{present.suffix}")
    plain = _cli_here(capsys, *job)
    assert plain.returncode == 0 and "resuming: 4 of 4" in plain.stderr
    assert sum(1 for r in _rows(dst) if r["error"]) == 3

    refused = _cli_here(capsys, *job, "--retry-errors", "--overwrite")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr

    retry = _cli_here(capsys, *job, "--retry-errors")
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert "retrying 3 recordings" in retry.stderr and "resuming: 1 of 4" in retry.stderr
    rows = _rows(dst)
    assert sorted(r["id"] for r in rows) == ["here", "m0", "m1", "m2"]     # one row each
    assert all(r["error"] is None and r["duration_s"] > 0 for r in rows), rows
    summary = json.loads((dst / SUMMARY_NAME).read_text())
    assert summary["rows_in"] == summary["rows_out"] == 4 and summary["errors"] == 0


def test_the_local_runner_commits_rows_that_waited_commit_interval_s(tmp_path, samples_dir, sample_manifest, capsys):
    """Far fewer rows than output.rows_per_part: by default one part at the end; with
    output.commit_interval_s=0 every batch is committed as soon as it is finished (what a
    killed job keeps), the same rows either way."""
    lines = [{"id": f"r{i}", "audio": str(samples_dir / sample_manifest[i % len(sample_manifest)]["audio"])}
             for i in range(6)]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    parts = {}
    for name, extra in (("default", []), ("every_batch", ["--set", "output.commit_interval_s=0"])):
        dst = tmp_path / name
        proc = _cli_here(capsys, "transcribe", "--input", str(manifest), "--output", str(dst), "--runner", "local",
                        "--set", "decoder.kind=audit", "--set", "batching.recordings_per_batch=2", *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        parts[name] = sorted(dst.glob("part-*.parquet"))
        assert sorted(r["id"] for r in _rows(dst)) == [x["id"] for x in lines]
    # the slow start's pieces of 1 and 1 (batching.first_batch), then the model stage's
    # batch of the two blocks of 2 it joins (the audit kind's segments never fill the budget)
    assert len(parts["default"]) == 1 and len(parts["every_batch"]) == 3
    assert sorted(pq.read_metadata(p).num_rows for p in parts["every_batch"]) == [1, 1, 4]


def test_a_batch_slower_than_commit_interval_s_is_committed_when_it_is_finished(tmp_path, samples_dir,
                                                                               sample_manifest):
    """The interval runs from the last commit: when each batch takes longer than it, every
    batch is its own part at once, not held until the next one finishes."""
    import time

    from shardscribe.actors.local_runner import build_stages, run_local
    from shardscribe.pipeline.config import load_config

    rows = [{"id": f"r{i}", "audio": str(samples_dir / sample_manifest[i % len(sample_manifest)]["audio"]),
             "audio_bytes": None} for i in range(3 * 4)]
    cfg = load_config("ar", ["decoder.kind=audit", "batching.recordings_per_batch=1",
                             "output.commit_interval_s=0.2"])
    prep, model, second = build_stages(cfg)

    class Slow:
        cost = model.cost

        def __call__(self, batch):
            time.sleep(0.3)
            return model(batch)

    parts_when = []
    run_local(rows, cfg, str(tmp_path), progress=False, stages=(prep, Slow(), second),
              on_batch=lambda out: parts_when.append(len(list(tmp_path.glob("part-*.parquet")))))
    # blocks of one row, batching.max_joined_blocks (4) a model-stage batch (the audit
    # kind's segments never fill the budget); before each batch's own commit: the parts of the batches
    # before it, all committed
    assert parts_when == [0, 1, 2]
    assert len(list(tmp_path.glob("part-*.parquet"))) == 3


def test_dry_run_checks_everything_before_the_workers_and_writes_nothing(tmp_path, samples_dir, sample_manifest, capsys):
    """--dry-run for a scheduler: the job's own refusals (exit 2, one line) and, where it
    would run, what it would do (counts from the folder's rows), with nothing written:
    no folder, no lock, no success marker removed, no part quarantined."""
    from shardscribe.pipeline.output import OutputLock, SUCCESS_NAME

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"r{i}", "audio": str(samples_dir / m["audio"])}) + "\n"
                                for i, m in enumerate(sample_manifest[:3]))
                        + json.dumps({"id": "gone", "audio": str(tmp_path / "gone.wav")}) + "\n")
    dst = tmp_path / "out"
    job = ["transcribe", "--input", str(manifest), "--output", str(dst), "--runner", "local",
           "--set", "decoder.kind=audit"]
    first = _cli_here(capsys, *job, "--dry-run")
    assert first.returncode == 0, first.stderr
    assert "4 recordings in the input, 0 already" in first.stdout and "4 to transcribe" in first.stdout
    assert not dst.exists()

    assert _cli_here(capsys, *job).returncode == 0
    before = {p.name: p.stat().st_mtime_ns for p in dst.rglob("*") if p.is_file()}
    again = _cli_here(capsys, *job, "--dry-run", "--retry-errors")
    assert again.returncode == 0, again.stderr
    assert "4 already in" in again.stdout and "(1 with an error, retried); 1 to transcribe" in again.stdout
    other = _cli_here(capsys, *job, "--dry-run", "--set", "audio.vad_threshold=0.3")
    assert other.returncode == 2 and other.stderr.count("\n") == 1 and "another config" in other.stderr
    lock = OutputLock(str(dst), "someone").acquire()
    try:
        busy = _run_cli(*job, "--dry-run")     # a process of its own: this one holds the lock
    finally:
        lock.release()
    assert busy.returncode == 2 and "in use by job someone" in busy.stderr, busy.stderr
    assert {p.name: p.stat().st_mtime_ns for p in dst.rglob("*") if p.is_file()} == before
    assert (dst / SUCCESS_NAME).exists()


def test_dry_run_judges_the_folder_as_resume_does(tmp_path, samples_dir, sample_manifest, capsys):
    """A part resume would quarantine (a required column missing) is counted as redone,
    not done, and a recording held twice counts once, with the duplicates named."""
    import shutil

    import pyarrow.parquet as pq_

    from shardscribe.pipeline.output import write_part
    from shardscribe.pipeline.records import OUTPUT_SCHEMA, table

    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"r{i}", "audio": str(samples_dir / m["audio"])}) + "\n"
                                for i, m in enumerate(sample_manifest[:4])))
    dst = tmp_path / "out"

    audio = {f"r{i}": str(samples_dir / m["audio"]) for i, m in enumerate(sample_manifest[:4])}

    def rows(ids):     # rows of the same sources (another source's row would be a conflict)
        return table([{"id": i, "audio": audio[i], "stage": "audit", "segments": [], "text": ""} for i in ids],
                     OUTPUT_SCHEMA)

    good = write_part(rows(["r0", "r1"]), str(dst), "j")
    shutil.copy(dst / good, dst / "part-copy.parquet")
    pq_.write_table(rows(["r2", "r3"]).drop_columns(["stage"]), dst / "part-nostage.parquet")
    proc = _cli_here(capsys, "transcribe", "--input", str(manifest), "--output", str(dst), "--runner", "local",
                    "--set", "decoder.kind=audit", "--resume", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout
    assert "4 recordings in the input, 2 already in" in line and "2 to transcribe" in line, line
    assert "1 unreadable parts would be quarantined" in line and "holds 2 duplicate rows" in line, line
