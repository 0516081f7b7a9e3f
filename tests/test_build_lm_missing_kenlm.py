"""`shardscribe build-lm` on a runtime install (`bash scripts/setup.sh`, without --dev):
KenLM's lmplz and the toolchain to compile it are missing, and the job says in one line
what to install, exits 2 and leaves nothing behind."""
from __future__ import annotations

import shutil

from shardscribe.jobs.cli import main


def test_missing_lmplz_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SHARDSCRIBE_KENLM_DIR", str(tmp_path / "no_kenlm"))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)   # no lmplz, no cmake
    text = tmp_path / "text.txt"
    text.write_text("hello world\n")
    out = tmp_path / "lm"
    assert main(["build-lm", "--text", str(text), "--order", "3", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bash scripts/setup.sh --dev" in err[0], err
    assert not out.exists()
