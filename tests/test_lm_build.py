"""`shardscribe build-lm` end to end: lmplz from scripts/build_kenlm.sh, ARPA + tensors,
an existing token ARPA recompiled, and a word-level ARPA refused with a clear message."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardscribe.pipeline.lm.build import find_lmplz
from shardscribe.pipeline.lm.ngpu_lm import NGramLM
from shardscribe.pipeline.training.sample_text import pydoc_sentences

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lmplz():
    # Compiles KenLM once through the project's script when the cache is empty (CI).
    try:
        return find_lmplz(build=True)
    except (FileNotFoundError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"KenLM binaries could not be built here: {exc}")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shardscribe.jobs.cli", "build-lm", *args], cwd=ROOT,
                          capture_output=True, text=True)


def test_build_script_is_idempotent(lmplz):
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build_kenlm.sh")], capture_output=True,
                         text=True, check=True)
    assert Path(out.stdout.strip()) == lmplz.parent


def test_build_lm_cli_chars_then_recompile_arpa(lmplz, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(pydoc_sentences()[:400]) + "\n")
    done = cli("--text", str(text), "--order", "4", "--tokenizer", "chars", "--output", str(tmp_path / "lm"))
    assert done.returncode == 0, done.stderr
    info = json.loads((tmp_path / "lm" / "lm.json").read_text())
    assert info["order"] == 4 and info["vocab_size"] == 95 and info["sentences"] == 400
    arpa = (tmp_path / "lm" / "lm.arpa").read_text(encoding="utf-8")
    assert "\\4-grams:" in arpa
    lm = NGramLM.load(str(tmp_path / "lm" / "lm.ngpu.safetensors"))
    scores, _ = lm.advance(lm.init_states(1, bos=True))
    # Seen tokens + <unk> (once) + </s> form a distribution after <s>.
    from shardscribe.pipeline.text import charset

    seen = sorted({c - 1 for c in charset.encode(text.read_text())})
    unseen = sorted(set(range(95)) - set(seen))
    parts = [scores[0, seen], lm.final(lm.init_states(1, True))] + ([scores[0, unseen[:1]]] if unseen else [])
    total = torch.logsumexp(torch.cat(parts), 0)
    assert abs(total.item()) < 1e-3

    again = cli("--arpa", str(tmp_path / "lm" / "lm.arpa"), "--tokenizer", "chars", "--output", str(tmp_path / "re"))
    assert again.returncode == 0, again.stderr
    back = NGramLM.load(str(tmp_path / "re" / "lm.ngpu.safetensors"))
    assert torch.equal(back.advance(back.init_states(1))[0], scores)

    # A wider decoder vocabulary: the extra tokens are unknown words (<unk> probability).
    wide = cli("--arpa", str(tmp_path / "lm" / "lm.arpa"), "--tokenizer", "chars", "--vocab-size", "100",
               "--output", str(tmp_path / "wide"))
    assert wide.returncode == 0, wide.stderr
    wide_lm = NGramLM.load(str(tmp_path / "wide" / "lm.ngpu.safetensors"))
    wide_scores, wide_next = wide_lm.advance(wide_lm.init_states(1))
    assert wide_scores.shape == (1, 100) and torch.equal(wide_scores[:, :95], scores)
    assert (wide_next[0, 95:] == wide_lm.start_state).all()


def test_word_level_arpa_is_refused_clearly(tmp_path):
    arpa = tmp_path / "words.arpa"
    arpa.write_text("\\data\\\nngram 1=4\nngram 2=1\n\n\\1-grams:\n-1.0\t<s>\t-0.3\n-0.5\t</s>\n"
                    "-0.7\thello\t-0.2\n-1.2\t<unk>\n\n\\2-grams:\n-0.3\t<s> hello\n\n\\end\\\n")
    done = cli("--arpa", str(arpa), "--tokenizer", "chars", "--output", str(tmp_path / "out"))
    assert done.returncode == 1
    assert "word-level ARPA" in done.stderr and "'hello'" in done.stderr and "build-lm --text" in done.stderr


def test_bad_arguments_fail_before_work(tmp_path):
    done = cli("--order", "3", "--output", str(tmp_path))
    assert done.returncode == 2 and "--text" in done.stderr
    text = tmp_path / "t.txt"
    text.write_text("a b c\n")
    (tmp_path / "afile").write_text("x")
    cases = [(["--output", str(tmp_path / "afile")], "not a directory"),
             (["--output", str(tmp_path / "o1"), "--prune", "-1"], "--prune"),
             (["--output", str(tmp_path / "o2"), "--prune", "0", "2", "1"], "--prune"),
             (["--output", str(tmp_path / "o3"), "--memory", "bogus"], "--memory"),
             (["--output", str(tmp_path / "o4"), "--text", str(tmp_path / "none.txt")], "no such file")]
    for extra, says in cases:
        args = ["--order", "3", "--text", str(text), *extra]
        if extra[-2] == "--text":
            args = ["--order", "3", *extra]
        done = cli(*args)
        assert done.returncode == 2 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
            (extra, done.stderr)
    # nothing was written for the refused runs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "t.txt"]
