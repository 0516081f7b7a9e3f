"""Golden transcripts: every shipped decoder config, on the bundled samples and 40 held-out
clips (20 held-out voices, 20 held-out texts of the synthetic corpus, rendered by
`shardscribe make-bench-sets --heldout 20`), must give the text committed in
tests/golden/transcripts.json. The file was written by this module's ``--write`` before the
architecture change (model families and decoder kinds as registries), so any behaviour
change in the restructured code shows here.

    .venv/bin/python tests/test_golden_transcripts.py --write   # regenerate (on purpose only)
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
KEY_PHRASES = ["tripped breaker", "forklift", "warehouse", "pressure", "kilograms"]

# (name, config, overrides); "{lm}" is replaced by an LM built from tests/golden/lm_text.txt.
CONFIGS = [
    ("ar", "ar", []),
    ("ctc_greedy", "ctc_greedy", []),
    ("ssd_high_accuracy", "ssd", []),
    ("ssd_high_rtfx", "ssd", ["ssd.preset=high_rtfx"]),
    ("ctc_beam", "ctc_beam", []),
    ("ctc_beam_lm_boost", "ctc_beam", ["beam.lm_path={lm}", f"beam.key_phrases={json.dumps(KEY_PHRASES)}"]),
]


def manifest_rows() -> list[dict]:
    from pipeline.sources import read_source

    rows = []
    for path in (ROOT / "pipeline" / "assets" / "samples" / "samples.jsonl", GOLDEN / "heldout.jsonl"):
        rows += read_source(str(path))
    return rows


def build_lm(out_dir: Path) -> Path:
    subprocess.run([sys.executable, "-m", "jobs.cli", "build-lm", "--text", str(GOLDEN / "lm_text.txt"),
                    "--order", "4", "--output", str(out_dir)], cwd=ROOT, check=True, capture_output=True)
    return out_dir


def transcribe(config: str, overrides: list[str], rows: list[dict], dst: Path, cache: Path) -> dict[str, str]:
    from pipeline.config import load_config
    from actors.local_runner import run_local

    # The float32 encoder: model.encoder_dtype=auto would make the texts depend on the CPU.
    cfg = load_config(config, overrides + [f"model.cache_dir={cache}", "model.encoder_dtype=float32"])
    run_local(rows, cfg, str(dst), progress=False)
    table = pq.read_table(sorted(str(p) for p in dst.glob("*.parquet")), columns=["id", "text", "error"])
    out = {}
    for r in table.to_pylist():
        assert r["error"] is None, (config, r)
        out[r["id"]] = r["text"]
    return out


def golden_run(tmp: Path) -> dict[str, dict[str, str]]:
    rows = manifest_rows()
    lm = build_lm(tmp / "lm")
    results = {}
    for name, config, overrides in CONFIGS:
        sets = [o.replace("{lm}", str(lm)) for o in overrides]
        results[name] = transcribe(config, sets, rows, tmp / name, tmp / "cache")
    return results


@pytest.fixture(scope="module")
def golden_results(tmp_path_factory):
    return golden_run(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("name", [c[0] for c in CONFIGS])
def test_transcripts_match_golden(golden_results, name):
    expected = json.loads((GOLDEN / "transcripts.json").read_text())[name]
    got = golden_results[name]
    assert len(expected) == 47
    assert got == expected


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        results = golden_run(Path(tmp))
    (GOLDEN / "transcripts.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
