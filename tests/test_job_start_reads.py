"""What a job's start does with the output folder, in process (``jobs.transcribe.run`` with
the worker part replaced by a stub): each committed part is read once per start, and the
judgements made from that read are today's: which parts are quarantined and when, the
config refusal, --retry-errors removing exactly the input's error rows, a dry run that
moves nothing."""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from conftest import corrupt_page_of
from shardscribe.actors.job import run as job_run
from shardscribe.jobs import transcribe
from shardscribe.pipeline import output
from shardscribe.pipeline.config import config_hash, load_config
from shardscribe.pipeline.records import OUTPUT_SCHEMA, table

OVERRIDES = ["decoder.kind=audit", "model.device=cpu"]


def _rows(spec, config: str | None = None):
    """Output rows from (id, error) pairs, made by ``config`` (default: the job's)."""
    config = config or config_hash(load_config(None, OVERRIDES))
    # Text of its own per row: enough page data that a corrupted page is not one of a few
    # dictionary entries.
    rng = np.random.default_rng(len(spec))
    return table([{"id": i, "audio": f"/a/{i}.wav", "stage": "audit", "segments": [], "error": e, "config_hash": config,
                   "text": None if e else " ".join(f"w{rng.integers(1 << 30)}" for _ in range(40))} for i, e in spec],
                 OUTPUT_SCHEMA)


@pytest.fixture
def start(tmp_path, monkeypatch):
    """Run a job's start on ``tmp_path/out`` for the given input ids and flags; returns
    (exit code, the ids left to transcribe or None, stdout + stderr, part opens by name)."""
    opens: dict[str, int] = {}
    real_open = LocalFileSystem.open

    def counting_open(self, path, mode="rb", *args, **kwargs):
        name = os.path.basename(str(path))
        if name.startswith(output.PART_PREFIX) and "r" in mode:
            opens[name] = opens.get(name, 0) + 1
        return real_open(self, path, mode, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "open", counting_open)

    def run(ids, *flags, dst=tmp_path / "out"):
        manifest = tmp_path / "in.jsonl"
        manifest.write_text("".join(json.dumps({"id": i, "audio": f"/a/{i}.wav"}) + "\n" for i in ids))
        parser = argparse.ArgumentParser()
        transcribe.add_arguments(parser)
        # --quiet: a small job's closing transcripts are read after the job, not at its start
        args = parser.parse_args(["--input", str(manifest), "--output", str(dst), "--runner", "local", "--quiet",
                                  *flags]
                                 + [a for o in OVERRIDES for a in ("--set", o)])
        todo = []
        monkeypatch.setattr(job_run, "_transcribe", lambda *a: todo.append(_todo(a[2], a[3])) or {"rows_in": 0,
                                                                                                  "rows_out": 0})
        opens.clear()
        code = transcribe.run(args)
        return code, (todo[0] if todo else None), dict(opens)

    return run


def _todo(scanned, plan):
    """The ids a job's resume plan leaves to transcribe, in source order."""
    from shardscribe.pipeline.resume import RENAMED, TODO

    return [i for i, act in zip(scanned.ids.to_pylist(), plan.actions) if act in (TODO, RENAMED)]


def _folder(dst):
    return sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file())


def test_a_job_start_reads_each_part_once(tmp_path, start, capsys):
    """The config check, the ids done, the quarantine judgement and the dry run's counts
    come from one read of each part; --retry-errors reads again only the parts it rewrites."""
    dst = tmp_path / "out"
    clean = [output.write_part(_rows([(f"c{p}{i}", None) for i in range(3)]), str(dst), "j") for p in range(3)]
    mixed = output.write_part(_rows([("m0", None), ("m1", "file not found: m1")]), str(dst), "j")
    bad = output.write_part(_rows([(f"b{i}", None) for i in range(50)]), str(dst), "j")
    corrupt_page_of(dst / bad, "text")
    ids = [f"c{p}{i}" for p in range(3) for i in range(3)] + ["m0", "m1"] + [f"b{i}" for i in range(50)] + ["new"]
    parts = [*clean, mixed, bad]

    code, todo, opens = start(ids, "--dry-run")
    assert code == 0 and todo is None and opens == {p: 1 for p in parts}
    said = capsys.readouterr().out
    assert "11 already in" in said and "(1 with an error)" in said and "1 unreadable parts" in said, said

    code, todo, opens = start(ids)
    assert code == 0 and opens == {p: 1 for p in parts}
    assert todo == [f"b{i}" for i in range(50)] + ["new"]
    assert [n.rpartition(".")[0] for n in os.listdir(dst / output.QUARANTINE_DIR)] == [bad]

    code, todo, opens = start(ids, "--retry-errors")
    assert code == 0 and opens == {**{p: 1 for p in clean}, mixed: 2}
    assert todo == ["m1"] + [f"b{i}" for i in range(50)] + ["new"]


def test_a_corrupt_part_is_quarantined_on_resume_but_not_when_the_job_is_refused(tmp_path, start):
    """A job refused for another config changes nothing in the folder, its unreadable parts
    included; the same job with --resume quarantines them and redoes their rows. A part
    that resume rejects still counts for the config check where it reads."""
    dst = tmp_path / "out"
    output.write_part(_rows([("a", None), ("b", None)], config="other"), str(dst), "j")
    bad = output.write_part(_rows([(f"c{i}", None) for i in range(50)]), str(dst), "j")
    corrupt_page_of(dst / bad, "text")
    output.commit_job(str(dst), {"rows_in": 52}, True)
    before = _folder(dst)
    ids = ["a", "b"] + [f"c{i}" for i in range(50)]

    code, todo, _ = start(ids)
    assert code == 2 and todo is None
    assert _folder(dst) == before                      # the part, the success marker: all kept

    code, todo, _ = start(ids, "--resume")
    assert code == 0 and todo == [f"c{i}" for i in range(50)]
    assert [n.rpartition(".")[0] for n in os.listdir(dst / output.QUARANTINE_DIR)] == [bad]

    # A part without a column resume needs is quarantined by a job that runs, but its rows
    # are another config's all the same: a job without --resume is refused for them.
    fresh = tmp_path / "fresh"
    output.write_part(_rows([("y", None)]), str(fresh), "j")
    pq.write_table(_rows([("z", None)], config="older").drop_columns(["stage"]), fresh / "part-nostage.parquet")
    assert start(["y", "z"], dst=fresh)[0] == 2 and (fresh / "part-nostage.parquet").exists()
    assert start(["y", "z"], "--resume", dst=fresh)[:2] == (0, ["z"])
    assert not (fresh / "part-nostage.parquet").exists()


def test_retry_errors_removes_the_inputs_error_rows_and_finds_done_what_the_folder_holds(tmp_path, start):
    """--retry-errors removes the error rows of the input's ids, wherever they are, and
    only those; what the job then finds done is what the folder holds after the removal
    (a recording with an error row in one part and a good row in another stays done)."""
    dst = tmp_path / "out"
    first = output.write_part(_rows([("a", None), ("b", "read timeout: b"), ("x", "file not found: x")]),
                              str(dst), "j")
    second = output.write_part(_rows([("b", "read timeout: b"), ("c", "cannot decode: c"), ("a", "oops: a")]),
                               str(dst), "j")
    theirs = output.write_part(_rows([("other", "file not found: other")]), str(dst), "j")
    only_errors = output.write_part(_rows([("d", "read timeout: d")]), str(dst), "j")
    ids = ["a", "b", "c", "d", "e"]

    code, todo, _ = start(ids, "--retry-errors")
    assert code == 0
    held = pq.read_table(sorted(str(p) for p in dst.glob("part-*.parquet"))).to_pylist()
    assert sorted((r["id"], r["error"]) for r in held) == [("a", None), ("other", "file not found: other"),
                                                           ("x", "file not found: x")]
    assert sorted(p.name for p in dst.glob("part-*.parquet")) == sorted([first, theirs])
    assert not (dst / second).exists() and not (dst / only_errors).exists()
    # done is what a fresh read of the folder finds, not the start's ids less the retried
    assert todo == [i for i in ids if i not in {r["id"] for r in held}] == ["b", "c", "d", "e"]
