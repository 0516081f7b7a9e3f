"""`shardscribe train-draft-head` end to end on a tiny random Whisper of another width than
tiny.en (d_model 64): the head directory, its card's figures, the head drafting in
`--config ssd` on both runners with the transcripts of `--config ar`, and the one-line
refusals (a family that takes no head, an output folder of another model, a bad input)."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import SAMPLES

# The random checkpoint's greedy text is word salad that every hallucination filter flags;
# the head must learn it anyway (it is what this model writes), so the filters are off.
# Few tokens keep each job short.
SETS = {"decoder.max_new_tokens": 8, "filters.max_compression_ratio": None, "filters.min_unique_word_share": None,
        "filters.max_ngram_repeats": None, "filters.max_word_chars": None, "filters.min_chars_per_second": None,
        "filters.max_chars_per_second": None, "filters.english_only_logprob": None}
SET_FLAGS = [a for k, v in SETS.items() for a in ("--set", f"{k}={'null' if v is None else v}")]
ROWS = len((SAMPLES / "samples.jsonl").read_text().splitlines())


def _cli(*args: str) -> int:
    from shardscribe.jobs.cli import main

    return main(["train-draft-head", *args])


def _rows(dst: Path) -> dict[str, dict]:
    return {r["id"]: r for r in pq.read_table(sorted(str(p) for p in dst.glob("*.parquet"))).to_pylist()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint, head directory): train-draft-head on the bundled samples, two epochs."""
    from whisper_tiny import build_tiny_whisper

    root = tmp_path_factory.mktemp("draft-head")
    ckpt = build_tiny_whisper(root / "tiny-d64", multilingual=False, decoder_layers=1)
    head = root / "head"
    code = _cli("--input", str(SAMPLES / "samples.jsonl"), "--output", str(head), "--model", str(ckpt),
                "--epochs", "2", "--heldout-share", "0.3", "--min-confidence", "0", *SET_FLAGS)
    assert code == 0
    return ckpt, head


def test_the_head_directory_and_its_card(trained):
    from shardscribe.pipeline.models.whisper.ctc_head import load_ctc_head

    ckpt, head = trained
    assert {p.name for p in head.iterdir()} >= {"head.safetensors", "config.json", "metrics.json", "MODEL_CARD.md"}
    config = json.loads((head / "config.json").read_text())
    assert config["d_model"] == 64 and config["num_classes"] == 96
    assert load_ctc_head(head).config.d_model == 64
    m = json.loads((head / "metrics.json").read_text())
    assert m["model"]["d_model"] == 64 and m["model"]["source"] == str(ckpt)
    assert m["selection"]["rows"] == m["selection"]["kept"] == ROWS
    assert m["heldout"]["rows"] == round(0.3 * ROWS)
    assert m["train_segments"] + m["heldout"]["segments"] == m["segments"]["segments"] == ROWS
    assert len(m["curve"]) == 2 and m["heldout"]["after"]["wer"] is not None
    # Another width: only the tensors that do not depend on it come from the tiny.en head.
    assert 0 < m["init"]["tensors"] < m["init"]["of"]
    card = (head / "MODEL_CARD.md").read_text()
    assert f"Rows: {ROWS}; used {ROWS}; dropped 0" in card
    assert f"{m['train_segments']} segments, {m['train_hours']} h" in card
    wer = m["heldout"]["after"]["wer"]
    assert f"| after training | {100 * wer:.1f}% |" in card
    assert m["command"] in card


def _ssd_matches_ar(trained, tmp_path, runner: str) -> None:
    """--config ssd with the head: rows in = rows out, no error, every segment drafted
    (it has a max entropy), and the texts of --config ar on the same checkpoint (the AR
    pass train-draft-head made, same keys)."""
    from shardscribe.jobs.api import transcribe

    ckpt, head = trained
    dst = tmp_path / f"ssd-{runner}"
    summary = transcribe(str(SAMPLES / "samples.jsonl"), str(dst), config="ssd", runner=runner, model=str(ckpt),
                         set={**SETS, "model.ctc_head": str(head)})
    assert summary["rows_in"] == summary["rows_out"] == ROWS
    rows, ar = _rows(dst), _rows(head / "transcripts")
    assert not [r["id"] for r in rows.values() if r["error"]]
    assert all(sg["max_entropy"] is not None for r in rows.values() for sg in r["segments"])
    assert {i: r["text"] for i, r in rows.items()} == {i: r["text"] for i, r in ar.items()}


def test_ssd_drafts_with_the_head_on_the_local_runner(trained, tmp_path):
    _ssd_matches_ar(trained, tmp_path, "local")


@pytest.mark.slow
def test_ssd_drafts_with_the_head_on_ray(trained, tmp_path):
    _ssd_matches_ar(trained, tmp_path, "ray")


def test_from_output_learns_from_an_earlier_job_of_the_same_model(trained, tmp_path):
    """--from-output reads the rows another job wrote with this checkpoint: no transcription."""
    ckpt, head = trained
    again = tmp_path / "again"
    assert _cli("--from-output", str(head / "transcripts"), "--model", str(ckpt), "--output", str(again),
                "--epochs", "1", "--heldout-share", "0", "--min-confidence", "0") == 0
    m = json.loads((again / "metrics.json").read_text())
    assert m["transcripts"]["folder"] == str(head / "transcripts") and not (again / "transcripts").exists()
    assert m["train_segments"] == ROWS and m["heldout"]["rows"] == 0 and m["minutes"]["transcribe"] < 1


def _one_line_refusal(capsys, *args: str) -> str:
    assert _cli(*args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("shardscribe: error: ") and "\n" not in err, err
    return err


def test_refusals_are_one_line_before_any_work(trained, tmp_path, capsys):
    ckpt, head = trained
    wav2vec = tmp_path / "w2v"
    wav2vec.mkdir()
    (wav2vec / "config.json").write_text(json.dumps({"architectures": ["Wav2Vec2ForCTC"], "model_type": "wav2vec2"}))
    out = tmp_path / "never"
    err = _one_line_refusal(capsys, "--input", str(SAMPLES), "--output", str(out), "--model", str(wav2vec))
    assert "ctc model" in err and "Whisper" in err
    # The transcripts of the d64 checkpoint are not tiny.en's.
    err = _one_line_refusal(capsys, "--from-output", str(head / "transcripts"), "--output", str(out))
    assert str(ckpt) in err and "model.source=embedded" in err
    err = _one_line_refusal(capsys, "--input", str(tmp_path / "missing.jsonl"), "--output", str(out))
    assert "missing.jsonl" in err
    assert not out.exists()
