"""An output folder with everything a job writes beside its parts (every ``--format``, the
pseudo-label exports with their own Parquet dataset, the sidecar's summary, success marker
and log) reads as exactly its rows with the readers people call plainly: pandas,
pyarrow (``parquet.read_table`` and ``dataset``) and Hugging Face ``datasets``. Ids that
look like split names (``train``, ``test``) would make ``datasets`` split by file names if
it saw the format files. Also: a format an earlier version left in the sidecar folder
goes once its new copy is written, and ``--overwrite`` removes the exports with the rows.
No model, no job: parts written by hand."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from shardscribe.pipeline import pseudo_label as pl
from shardscribe.pipeline.formats import FORMATS, export_dirs, format_file, write_formats
from shardscribe.pipeline.output import SIDECAR_DIR, SUCCESS_NAME, SUMMARY_NAME, clear_output
from shardscribe.pipeline.records import OUTPUT_SCHEMA, table

IDS = ["train.wav", "test", "validation-1.wav", "dir/clip.flac", "bad.wav"]


def _row(rid: str) -> dict:
    if rid == "bad.wav":
        return {"id": rid, "audio": f"/data/{rid}", "duration_s": None, "text": None, "reference": None,
                "stage": "error", "error": "file not found: /data/bad.wav", "segments": []}
    return {"id": rid, "audio": f"/data/{rid}", "duration_s": 2.0, "text": "hello there", "reference": "hello there",
            "stage": "ar", "error": None,
            "segments": [{"start": 0.0, "end": 2.0, "text": "hello there", "stage": "ar"}]}


def _output_folder(dst) -> None:
    """Two parts, every format, the pseudo-label exports and the sidecar's files."""
    dst.mkdir()
    pq.write_table(table([_row(i) for i in IDS[:3]], OUTPUT_SCHEMA), dst / "part-a.parquet")
    pq.write_table(table([_row(i) for i in IDS[3:]], OUTPUT_SCHEMA), dst / "part-b.parquet")
    written = write_formats(str(dst), list(FORMATS))
    assert written == [format_file(f) for f in FORMATS]
    utterance = {"id": "train.wav#0", "source_id": "train.wav", "audio_filepath": "/data/train.wav", "offset": 0.0,
                 "duration": 2.0, "text": "hello there", "confidence": 0.9}
    pl.write_exports(str(dst), [utterance], {"kept": 1}, with_plot=False)
    (dst / SUMMARY_NAME).write_text(json.dumps({"rows_out": len(IDS)}))
    (dst / SUCCESS_NAME).write_text("")
    (dst / SIDECAR_DIR / "transcribe.log").write_text("a log line\n")


def test_the_standard_readers_read_exactly_the_rows(tmp_path, monkeypatch):
    import datasets

    dst = tmp_path / "out"
    _output_folder(dst)
    # Everything is beside the parts, one "__" folder each, as the closing lines say.
    assert sorted(p.name for p in dst.iterdir()) == sorted(
        ["part-a.parquet", "part-b.parquet", SIDECAR_DIR, "__pseudo_label"] + [f"__{f}" for f in FORMATS])
    assert (dst / "__srt" / "train.wav.srt").exists() and (dst / pl.DATASET_FILE).exists()

    assert sorted(pd.read_parquet(dst)["id"]) == sorted(IDS)
    assert sorted(pq.read_table(dst).column("id").to_pylist()) == sorted(IDS)
    assert sorted(ds.dataset(dst).to_table().column("id").to_pylist()) == sorted(IDS)
    assert sorted(ds.dataset(str(dst), format="parquet").to_table().column("id").to_pylist()) == sorted(IDS)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    loaded = datasets.load_dataset("parquet", data_dir=str(dst), cache_dir=str(tmp_path / "hf"))
    assert list(loaded) == ["train"], loaded          # one split: no format file was taken for data
    assert sorted(loaded["train"]["id"]) == sorted(IDS)
    assert set(loaded["train"].column_names) == set(OUTPUT_SCHEMA.names)
    # The pseudo-label dataset loads by itself.
    utts = datasets.load_dataset("parquet", data_dir=str(dst / pl.DATASET_DIR), split="train",
                                 cache_dir=str(tmp_path / "hf2"))
    assert utts["id"] == ["train.wav#0"]


def test_formats_left_in_the_sidecar_folder_go_and_overwrite_clears_the_exports(tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    pq.write_table(table([_row(i) for i in IDS], OUTPUT_SCHEMA), dst / "part-a.parquet")
    # An output folder of an earlier version: its formats and exports in the sidecar folder.
    for old in ("srt", "txt", "pseudo_label"):
        (dst / SIDECAR_DIR / old).mkdir(parents=True)
        (dst / SIDECAR_DIR / old / "stale").write_text("")
    (dst / SIDECAR_DIR / "manifest.nemo.jsonl").write_text("")
    write_formats(str(dst), ["srt", "nemo"])
    assert not (dst / SIDECAR_DIR / "srt").exists() and not (dst / SIDECAR_DIR / "manifest.nemo.jsonl").exists()
    assert (dst / SIDECAR_DIR / "txt" / "stale").exists()      # not rewritten: left as it was
    pl.write_exports(str(dst), [], {}, with_plot=False)
    assert not (dst / SIDECAR_DIR / "pseudo_label").exists() and (dst / pl.MANIFEST_NAME).exists()

    clear_output(str(dst), exports=export_dirs())
    assert sorted(p.name for p in dst.iterdir()) == [SIDECAR_DIR]
