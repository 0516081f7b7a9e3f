"""Input sources, read through fsspec: a folder or glob of audio files, a JSONL manifest
(keys `audio` or NeMo's `audio_filepath`, optional `id`, `text`, `key_phrases`), or a
Parquet table with an audio column (bytes or path; the Hugging Face datasets layout
`{bytes, path}` included).

The result is the job's manifest: one dict per recording with `id`, `audio` (a URI),
`audio_bytes` (inline bytes or None), `reference` and `key_phrases`. Ids must be unique:
output rows are matched to input rows by id, which is what makes reruns resumable.
"""
from __future__ import annotations

import json
import posixpath
import re
from collections import Counter

import fsspec

from pipeline.storage import utf8_name

AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".mp3", ".opus", ".aiff", ".aif", ".au")
MANIFEST_EXTENSIONS = (".jsonl", ".json", ".ndjson")


class SourceError(ValueError):
    """The input location or manifest is unusable (before any worker starts)."""


def _row(id_, audio, audio_bytes=None, reference=None, key_phrases=None) -> dict:
    if key_phrases is not None and not (isinstance(key_phrases, list)
                                        and all(isinstance(k, str) for k in key_phrases)):
        raise SourceError(f"{id_}: key_phrases must be a list of strings")
    return {"id": str(id_), "audio": audio, "audio_bytes": audio_bytes,
            "reference": None if reference is None else str(reference),
            "key_phrases": key_phrases}


def _join(base: str, path: str, protocol: str) -> str:
    if "://" in path or path.startswith("/"):
        return path
    joined = posixpath.normpath(posixpath.join(base, path))
    return joined if protocol in ("file", "local") else f"{protocol}://{joined}"


def read_jsonl_manifest(uri: str, keep_item: bool = False) -> list[dict]:
    """One row per non-empty line. ``keep_item``: each row also carries the line's own dict
    as ``item``, for readers that need keys beyond the data contract (a training corpus's
    ``split``, ``voice``, ...)."""
    fs, path = fsspec.core.url_to_fs(uri)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    base = posixpath.dirname(path)
    rows = []
    with fs.open(path, "rt") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SourceError(f"{uri}:{lineno}: not valid JSON ({exc.msg})") from None
            audio = item.get("audio", item.get("audio_filepath"))
            if not isinstance(audio, str) or not audio:
                raise SourceError(f"{uri}:{lineno}: needs an 'audio' (or 'audio_filepath') path")
            rows.append(_row(item.get("id", audio), _join(base, audio, protocol),
                             reference=item.get("text"), key_phrases=item.get("key_phrases")))
            if keep_item:
                rows[-1]["item"] = item
    return rows


def read_parquet_table(uri: str, audio_column: str = "audio") -> list[dict]:
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(uri)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    files = sorted(fs.glob(posixpath.join(path, "**/*.parquet"))) if fs.isdir(path) else [path]
    rows = []
    for file in files:
        table = pq.read_table(file, filesystem=fs)
        if audio_column not in table.column_names:
            raise SourceError(f"{file}: no {audio_column!r} column (columns: {table.column_names})")
        base = posixpath.dirname(file)
        for i, item in enumerate(table.to_pylist()):
            audio = item[audio_column]
            default_id = f"{posixpath.basename(file)}:{i}"
            if isinstance(audio, dict):      # HF datasets Audio feature: {bytes, path}
                data, apath = audio.get("bytes"), audio.get("path")
            elif isinstance(audio, (bytes, bytearray)):
                data, apath = bytes(audio), None
            else:
                data, apath = None, audio
            uri_ = _join(base, apath, protocol) if (apath and data is None) else f"{file}#{i}"
            rows.append(_row(item.get("id", default_id), uri_, audio_bytes=data,
                             reference=item.get("text"), key_phrases=item.get("key_phrases")))
    return rows


def list_audio_files(uri: str) -> list[dict]:
    fs, path = fsspec.core.url_to_fs(uri)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if any(ch in path for ch in "*?["):
        root = posixpath.dirname(re.split(r"[*?\[]", path, maxsplit=1)[0])
        files = fs.glob(path)
    elif fs.isfile(path):
        # One file: its name is its id (relative to itself it would be ".", the same id for
        # every single-file job into one output folder).
        files, root = [path], posixpath.dirname(path)
    else:
        files, root = fs.find(path), path
    files = sorted(f for f in files if f.lower().endswith(AUDIO_EXTENSIONS))
    prefix = "" if protocol in ("file", "local") else f"{protocol}://"
    rows = []
    for f in files:
        (id_, bad), (uri, _) = utf8_name(posixpath.relpath(f, root)), utf8_name(prefix + f)
        rows.append(_row(id_, uri))
        rows[-1]["error"] = bad     # a name that is not UTF-8: an error row, not a crash
    return rows


def read_source(uri: str) -> list[dict]:
    """Manifest rows for ``uri``; raises SourceError when nothing usable is there."""
    fs, path = fsspec.core.url_to_fs(uri)
    is_glob = any(ch in path for ch in "*?[")
    if not (fs.glob(path) if is_glob else fs.exists(path)):
        raise SourceError(f"input {uri!r} does not exist")
    lower = path.lower()
    if lower.endswith(MANIFEST_EXTENSIONS):
        rows = read_jsonl_manifest(uri)
    elif lower.endswith(".parquet"):
        rows = read_parquet_table(uri)
    else:
        rows = list_audio_files(uri)
        if not rows and fs.isdir(path) and fs.glob(posixpath.join(path, "**/*.parquet")):
            rows = read_parquet_table(uri)
    if not rows:
        raise SourceError(f"input {uri!r}: no audio files, manifest rows or Parquet rows found")
    dupes = [k for k, c in Counter(r["id"] for r in rows).items() if c > 1]
    if dupes:
        raise SourceError(f"input {uri!r}: duplicate ids {dupes[:5]} (ids must be unique)")
    return rows


def read_bytes(row: dict) -> bytes | None:
    """The audio bytes of a manifest row (inline, or fetched through fsspec)."""
    if row.get("audio_bytes") is not None:
        return row["audio_bytes"]
    with fsspec.open(row["audio"], "rb") as fh:
        return fh.read()
