"""Input sources through fsspec: folders, globs, JSONL manifests and Parquet tables."""
from __future__ import annotations

import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardscribe.pipeline.sources import SourceError, read_bytes, read_source


def test_folder_and_glob(samples_dir):
    rows = read_source(str(samples_dir))
    assert len(rows) == 7 and all(r["audio"].endswith(".flac") for r in rows)
    assert read_bytes(rows[0])[:4] == b"fLaC"
    globbed = read_source(str(samples_dir / "*_flite_*.flac"))
    assert {r["id"] for r in globbed} < {r["id"] for r in rows} and len(globbed) == 4


def test_jsonl_manifest_with_nemo_keys(tmp_path, samples_dir):
    man = tmp_path / "m.jsonl"
    lines = [{"audio_filepath": str(samples_dir / "fox_flite_slt.flac"), "text": "fox"},
             {"audio": "rel.flac", "id": "r1", "key_phrases": ["pump filter"]}]
    man.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    rows = read_source(str(man))
    assert rows[0]["reference"] == "fox" and rows[0]["id"].endswith("fox_flite_slt.flac")
    assert rows[1]["audio"] == str(tmp_path / "rel.flac") and rows[1]["key_phrases"] == ["pump filter"]


def test_manifest_errors_name_the_line(tmp_path):
    man = tmp_path / "bad.jsonl"
    man.write_text('{"audio": "a.wav"}\n{"text": "no audio"}\n')
    with pytest.raises(SourceError, match=r"bad.jsonl:2"):
        read_source(str(man))
    man.write_text('{"audio": "a.wav", "id": "x"}\n{"audio": "b.wav", "id": "x"}\n')
    with pytest.raises(SourceError, match="duplicate ids"):
        read_source(str(man))


def test_parquet_hf_layout_bytes_and_paths(tmp_path, samples_dir):
    data = (samples_dir / "fox_flite_slt.flac").read_bytes()
    table = pa.table({
        "id": ["a", "b", "c"],
        "audio": [{"bytes": data, "path": "fox.flac"}, {"bytes": None, "path": "x/y.flac"},
                  {"bytes": data, "path": None}],
        "text": ["fox", None, "fox again"],
    })
    pq.write_table(table, tmp_path / "t.parquet")
    rows = read_source(str(tmp_path / "t.parquet"))
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["audio_bytes"] == data and rows[1]["audio"] == str(tmp_path / "x/y.flac")
    assert rows[2]["reference"] == "fox again"
    # A row with no audio at all is one error row naming why, not "file not found".
    pq.write_table(pa.table({"audio": [{"bytes": None, "path": None}, None]}, ), tmp_path / "n.parquet")
    assert [r["error"] for r in read_source(str(tmp_path / "n.parquet"))] == ["no audio in 'audio' (null)"] * 2


def test_memory_filesystem(samples_dir):
    fs = fsspec.filesystem("memory")
    fs.pipe("/corpus/a.flac", (samples_dir / "fox_flite_slt.flac").read_bytes())
    fs.pipe("/corpus/notes.txt", b"not audio")
    rows = read_source("memory://corpus")
    assert [r["id"] for r in rows] == ["a.flac"] and rows[0]["audio"].startswith("memory://")
    assert read_bytes(rows[0])[:4] == b"fLaC"


def test_missing_or_empty_input(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        read_source(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no audio files"):
        read_source(str(tmp_path / "empty"))


def test_a_single_file_is_named_by_its_file_name(samples_dir, tmp_path):
    """Not '.', which every single-file job would share (a resume would then skip the new
    file as already done)."""
    rows = read_source(str(samples_dir / "fox_flite_slt.flac"))
    assert [r["id"] for r in rows] == ["fox_flite_slt.flac"]
    assert rows[0]["audio"] == str(samples_dir / "fox_flite_slt.flac")
    other = tmp_path / "other.flac"
    other.write_bytes((samples_dir / "pump_flite_rms.flac").read_bytes())
    assert [r["id"] for r in read_source(str(other))] == ["other.flac"]


def test_ids_and_errors_never_carry_credentials(tmp_path):
    """A manifest of URIs with a password or a pre-signed query: the ids (written to every
    output) and the errors keep the recording's name and drop the secret."""
    man = tmp_path / "m.jsonl"
    lines = [{"audio": "s3://AKIA:se/cret@bucket/x.wav"},
             {"audio": "https://h.example/y.wav?X-Amz-Signature=abc&X-Amz-Security-Token=tok"},
             {"audio": "https://h.example/z.wav?sig=qq", "offset": 2.5}]
    man.write_text("".join(json.dumps(x) + "\n" for x in lines))
    ids = [r["id"] for r in read_source(str(man))]
    assert ids == ["s3://bucket/x.wav", "https://h.example/y.wav", "https://h.example/z.wav#2.5"]
    with pytest.raises(SourceError) as err:
        read_source("memory://AKIA:SECRET@bucket/nothere.wav")
    assert "SECRET" not in str(err.value) and "nothere.wav" in str(err.value)


def test_manifest_values_that_are_not_usable(tmp_path):
    """A null id takes the default id; NaN or infinite seconds are refused at the scan,
    naming the line, instead of failing the row later."""
    man = tmp_path / "m.jsonl"
    man.write_text('{"audio": "a.wav", "id": null}\n{"audio": "b.wav", "id": null}\n')
    assert [r["id"] for r in read_source(str(man))] == ["a.wav", "b.wav"]
    for bad in ('{"audio": "a.wav", "offset": NaN}', '{"audio": "a.wav", "duration": Infinity}'):
        man.write_text(bad + "\n")
        with pytest.raises(SourceError, match=r"m.jsonl:1: '(offset|duration)' must be a number"):
            read_source(str(man))


def test_a_name_with_brackets_is_a_path_not_a_pattern(tmp_path, samples_dir):
    take = tmp_path / "take [1]"
    take.mkdir()
    data = (samples_dir / "fox_flite_slt.flac").read_bytes()
    (take / "rec[2].flac").write_bytes(data)
    assert [r["id"] for r in read_source(str(take))] == ["rec[2].flac"]
    assert [r["id"] for r in read_source(str(take / "rec[2].flac"))] == ["rec[2].flac"]


def test_tables_in_split_folders_get_distinct_ids(tmp_path, samples_dir):
    """A folder of tables laid out as splits (train/0000.parquet, test/0000.parquet) with no
    id column: ids are paths under the folder, so the two files' rows do not collide; a
    flat folder keeps the file names as before."""
    data = (samples_dir / "fox_flite_slt.flac").read_bytes()
    for split in ("train", "test"):
        (tmp_path / "ds" / split).mkdir(parents=True)
        pq.write_table(pa.table({"audio": [{"bytes": data, "path": None}] * 2}), tmp_path / "ds" / split / "0000.parquet")
    ids = [r["id"] for r in read_source(str(tmp_path / "ds"))]
    assert ids == ["test/0000.parquet:0", "test/0000.parquet:1", "train/0000.parquet:0", "train/0000.parquet:1"]
    assert [r["id"] for r in read_source(str(tmp_path / "ds" / "train"))] == ["0000.parquet:0", "0000.parquet:1"]
    assert [r["id"] for r in read_source(str(tmp_path / "ds" / "train" / "0000.parquet"))] == \
        ["0000.parquet:0", "0000.parquet:1"]


def test_a_lone_surrogate_in_a_manifest_is_refused_naming_the_line(tmp_path):
    """JSON can escape a lone UTF-16 surrogate, which no Arrow string or Parquet output can
    hold: the scan refuses the line instead of raising UnicodeEncodeError."""
    from shardscribe.pipeline.sources import open_source, scan

    man = tmp_path / "m.jsonl"
    for line in ('{"id": "x\\ud800", "audio": "a.wav"}', '{"audio": "a.wav", "text": "t\\udcff"}',
                 '{"audio": "a.wav", "key_phrases": ["ok", "\\ud800"]}'):
        man.write_text('{"audio": "b.wav"}\n' + line + "\n")
        with pytest.raises(SourceError, match=r"m.jsonl:2: '(id|text|key_phrases)' holds a lone surrogate") as exc:
            scan(open_source(str(man)))
        assert len(str(exc.value).splitlines()) == 1
