"""Input sources, read through fsspec in bounded pieces: a folder or glob of audio files, a
JSONL manifest (keys `audio` or NeMo's `audio_filepath`, optional `id`, `text`,
`key_phrases`, NeMo's `offset`/`duration` in seconds), or a Parquet table with an audio
column (bytes or path; the Hugging Face datasets layout `{bytes, path}` included).

A source is opened (`open_source`: its kind and files, no rows read), scanned once on
the driver (`scan`: ids only, never audio, validated for duplicates; plus the work items
that split it into pieces of a few thousand rows), and its rows are read piece by piece
(`read_item`) where they are used: in Ray tasks for the Ray plan, in the process for the
local runner. Every piece yields tables of the INPUT schema of at most
`rows_per_batch` rows, so the model stages get blocks of that size without a shuffle.

Ids must be unique: output rows are matched to input rows by id and source (the audio
URI, a span's offset, and for a listed file its size and modification time), which is
what makes reruns resumable (pipeline.resume). A manifest line with an `offset` is one
span of its file, with the id `<audio>#<offset>`, so two spans of one file are two
recordings. The scan spills each row's id and source to disk in hash buckets
(pipeline.id_buckets): the driver never holds every id.
"""
from __future__ import annotations

import dataclasses
import json
import math
import posixpath
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.compute as pc

from .audio_formats import AUDIO_EXTENSIONS
from .batching import slow_start
from .id_buckets import IdBuckets
from .records import INPUT_SCHEMA, table
from .storage import redact_uri, utf8_name

MANIFEST_EXTENSIONS = (".jsonl", ".json", ".ndjson")
# Column (or manifest key) names recognised without --audio-column / --text-column, in
# order of preference: ours and NeMo's, then those of common Hugging Face speech datasets.
AUDIO_NAMES = ("audio", "audio_filepath", "file", "path")
TEXT_NAMES = ("text", "sentence", "transcription", "transcript", "normalized_text")
# Rows per work item: a Ray task reads one item (bounded by this many rows' bytes).
ROWS_PER_ITEM = 4096


class SourceError(ValueError):
    """The input location or manifest is unusable (before any worker starts)."""


@dataclass(frozen=True)
class Source:
    uri: str
    kind: str                          # "files" | "manifest" | "table"
    files: tuple[str, ...]             # audio files ("files") or manifest/table files, fsspec URIs
    root: str = ""                     # "files", a folder of tables: ids are paths relative to this
    audio_column: str | None = None    # None: the first of AUDIO_NAMES present
    text_column: str | None = None     # None: the first of TEXT_NAMES present
    # Ids to leave out (already in the output), applied as each piece is read; a job's
    # resume puts its plan in the work items instead (pipeline.resume).
    exclude: pa.Array | None = dataclasses.field(default=None, compare=False)
    # "files": each file's "<size>:<mtime>" as the listing showed it (None: not listed)
    stamps: tuple[str | None, ...] | None = dataclasses.field(default=None, compare=False)
    # "files": the listed files left out for their type, by extension (".txt", "" for none)
    skipped: tuple[tuple[str, int], ...] = dataclasses.field(default=(), compare=False)

    @property
    def skipped_files(self) -> int:
        return sum(n for _, n in self.skipped)

    def excluding(self, ids: Iterable[str] | pa.Array) -> "Source":
        arr = ids if isinstance(ids, (pa.Array, pa.ChunkedArray)) else pa.array(sorted(ids), pa.string())
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        return dataclasses.replace(self, exclude=arr if len(arr) else None)


# What the scan spills per row: its id and source, and ``seq``, its place in source order.
INDEX_SCHEMA = pa.schema([("id", pa.string()), ("audio", pa.string()), ("stamp", pa.string()),
                          ("offset_s", pa.float64()), ("seq", pa.int64())])


@dataclass
class Scan:
    """A source's rows as the driver knows them: ``rows`` (their count), ``items`` (work
    items for read_item, in source order; each with ``first_row``, the ``seq`` of its first
    row, and ``rows``) and ``index``, every row's id and source spilled by bucket."""
    rows: int
    items: list[dict]
    index: IdBuckets

    @property
    def ids(self) -> pa.Array:
        """Every id in source order, in memory: for small sources (tests, tools)."""
        tables = [t for t in self.index if t.num_rows]
        if not tables:
            return pa.array([], pa.string())
        table = pa.concat_tables(tables)
        return table.column("id").take(pc.sort_indices(table.column("seq"))).combine_chunks()

    def close(self) -> None:
        self.index.close()


def _protocol(fs) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def _uri(fs, path: str) -> str:
    protocol = _protocol(fs)
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


def _stamp(info: dict) -> str | None:
    """A listed file's "<size>:<mtime>" (whichever the filesystem reports), or None."""
    if info.get("type") == "directory":
        return None
    size = info.get("size")
    mtime = next((info[k] for k in ("mtime", "LastModified", "updated", "last_modified", "modified")
                  if info.get(k) is not None), None)
    if size is None and mtime is None:
        return None
    return f"{size}:{mtime.isoformat() if hasattr(mtime, 'isoformat') else mtime}"


def _file_id(source: Source, file: str) -> str:
    """A listed file's id (its path under the folder, or its name); a name that is not
    UTF-8 is written with ``\\xNN`` escapes (its row is an error row, see read_item)."""
    path = fsspec.core.url_to_fs(file)[1]
    return utf8_name(posixpath.relpath(path, source.root) if source.root else posixpath.basename(path))[0]


def _join(base: str, path: str, protocol: str) -> str:
    if "://" in path or path.startswith("/"):
        return path
    joined = posixpath.normpath(posixpath.join(base, path))
    return joined if protocol in ("file", "local") else f"{protocol}://{joined}"


def open_source(uri: str, audio_column: str | None = None, text_column: str | None = None) -> Source:
    """What ``uri`` is and which files make it up; lists, reads no rows. Raises SourceError
    when nothing usable is there."""
    try:
        fs, path = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise SourceError(f"input {redact_uri(uri)!r}: {exc}") from None
    # A real name may hold '[' ("take [1]"): a pattern only where no such path exists.
    is_glob = any(ch in path for ch in "*?[") and not fs.exists(path)
    if not (fs.glob(path) if is_glob else fs.exists(path)):
        raise SourceError(f"input {redact_uri(uri)!r} does not exist")
    lower = path.lower()
    cols = {"audio_column": audio_column, "text_column": text_column}
    if lower.endswith(MANIFEST_EXTENSIONS) and not is_glob:
        return Source(uri, "manifest", (_uri(fs, path),), **cols)
    if lower.endswith(".parquet") and not is_glob:
        return Source(uri, "table", (_uri(fs, path),), **cols)
    if is_glob:
        root = posixpath.dirname(re.split(r"[*?\[]", path, maxsplit=1)[0])
        found = fs.glob(path, detail=True)
    elif fs.isfile(path):
        # One file: its name is its id (relative to itself it would be ".", the same id for
        # every single-file job into one output folder).
        found, root = {path: fs.info(path)}, posixpath.dirname(path)
    else:
        # A folder named like audio ("x.wav/") is listed too: its row is an error (prepare
        # says it is a directory), never a recording that silently is not there.
        listed = fs.find(path, withdirs=True, detail=True)
        found = {f: info for f, info in listed.items() if info.get("type") != "directory"
                 or (f.rstrip("/") != path.rstrip("/") and f.rstrip("/").lower().endswith(AUDIO_EXTENSIONS))}
        root = path
    info = {f.rstrip("/"): (i if isinstance(i, dict) else {}) for f, i in
            (found.items() if isinstance(found, dict) else ((f, None) for f in found))}
    audio = sorted(f for f in info if f.lower().endswith(AUDIO_EXTENSIONS))
    if audio:
        return Source(uri, "files", tuple(_uri(fs, f) for f in audio), root=root,
                      stamps=tuple(_stamp(info[f]) for f in audio), skipped=_by_extension(set(info) - set(audio)),
                      **cols)
    tables = sorted(f for f in found if f.lower().endswith(".parquet"))
    if tables:
        return Source(uri, "table", tuple(_uri(fs, f) for f in tables), root=root, **cols)
    other = _by_extension(f for f in info if info[f].get("type") != "directory")
    raise SourceError(f"input {redact_uri(uri)!r}: no audio files, manifest rows or Parquet rows found"
                      + (f" ({_described(other)} of other types)" if other else ""))


def _by_extension(paths: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """How many of ``paths`` have each extension, most first."""
    counts: dict[str, int] = {}
    for p in paths:
        ext = posixpath.splitext(posixpath.basename(p))[1].lower()
        counts[ext] = counts.get(ext, 0) + 1
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def skipped_line(source: Source) -> str | None:
    """The console's one line on the files a folder input left out for their type; None
    where it left none out."""
    if not source.skipped_files:
        return None
    return (f"shardscribe: skipped {source.skipped_files} file{'s' if source.skipped_files > 1 else ''} "
            f"of a type no decoder reads ({_described(source.skipped)}); the audio types: docs/sources.md")


def _described(counts: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{n} {ext or '(no extension)'}" for ext, n in counts[:5]) + (", ..." if len(counts) > 5 else "")


# --- rows ----------------------------------------------------------------------------

def _offset_id(audio: str, offset: float) -> str:
    return f"{audio}#{f'{offset:.6f}'.rstrip('0').rstrip('.')}"


def _seconds(where: str, item: dict, key: str) -> float | None:
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SourceError(f"{where}: {key!r} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _pick(names: tuple[str, ...], present, given: str | None, what: str, where: str,
          required: bool) -> str | None:
    if given is not None:
        if given not in present:
            if required:
                raise SourceError(f"{where}: no {what} column {given!r} (columns: {sorted(present)})")
            return None
        return given
    found = next((n for n in names if n in present), None)
    if found is None and required:
        raise SourceError(f"{where}: needs an audio column/key (one of {', '.join(names)}, "
                          f"or --audio-column; found: {sorted(present)})")
    return found


def _manifest_row(source: Source, item: dict, base: str, protocol: str, where: str) -> dict:
    if not isinstance(item, dict):
        raise SourceError(f"{where}: expected a JSON object")
    key = _pick(AUDIO_NAMES, item, source.audio_column, "audio", where, required=True)
    audio = item[key]
    if not isinstance(audio, str) or not audio:
        raise SourceError(f"{where}: needs an 'audio' (or 'audio_filepath') path")
    text_key = _pick(TEXT_NAMES, item, source.text_column, "text", where, required=False)
    offset, duration = _seconds(where, item, "offset"), _seconds(where, item, "duration")
    # An id is written to every output: never the credentials or signature in a URI.
    default_id = redact_uri(audio) if offset is None else _offset_id(redact_uri(audio), offset)
    key_phrases = item.get("key_phrases")
    if key_phrases is not None and not (isinstance(key_phrases, list)
                                        and all(isinstance(k, str) for k in key_phrases)):
        raise SourceError(f"{where}: key_phrases must be a list of strings")
    reference = item.get(text_key) if text_key else None
    rid = item.get("id")
    for name, value in ((key, audio), ("id", rid), (text_key, reference), ("key_phrases", key_phrases)):
        _check_encodable(where, name, value)
    return {"id": default_id if rid is None else str(rid), "audio": _join(base, audio, protocol),
            "audio_bytes": None, "reference": None if reference is None else str(reference),
            "key_phrases": key_phrases, "offset_s": offset, "duration_s": duration}


def _check_encodable(where: str, key: str, value) -> None:
    """JSON's \\uXXXX escapes can spell a lone UTF-16 surrogate, which no UTF-8 text (an
    Arrow string, the Parquet output) can hold: refuse the line instead of failing later."""
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise SourceError(f"{where}: {key!r} holds a lone surrogate "
                                  f"({text[exc.start]!r} at character {exc.start}), not UTF-8 text") from None


def _manifest_lines(file: str, start: int = 0, stop: int | None = None, first_line: int = 1):
    """(line number, byte offset, parsed JSON) of the non-empty lines in [start, stop)."""
    with fsspec.open(file, "rb") as fh:
        fh.seek(start)
        pos, lineno = start, first_line
        for raw in fh:
            if stop is not None and pos >= stop:
                break
            here, pos = pos, pos + len(raw)
            if raw.strip():
                try:
                    yield lineno, here, json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    msg = getattr(exc, "msg", None) or str(exc)
                    raise SourceError(f"{redact_uri(file)}:{lineno}: not valid JSON ({msg})") from None
            lineno += 1


def _table_columns(source: Source, schema_names, where: str) -> tuple[str, str | None, str | None]:
    audio = _pick(AUDIO_NAMES, schema_names, source.audio_column, "audio", where, required=True)
    # A table has one schema: a --text-column it lacks is a typo, not rows without text.
    text = _pick(TEXT_NAMES, schema_names, source.text_column, "text", where, required=source.text_column is not None)
    return audio, text, ("id" if "id" in schema_names else None)


def _table_rows(source: Source, file: str, batch: pa.RecordBatch, first_index: int,
                audio_col: str, text_col: str | None, id_col: str | None) -> list[dict]:
    base = posixpath.dirname(fsspec.core.url_to_fs(file)[1])
    protocol = _protocol(fsspec.core.url_to_fs(file)[0])
    # A row without an id is "<file>:<row>", the file named as a listed audio file is (its
    # path under the folder), so two splits' 0000.parquet are two files.
    prefix = _file_id(source, file)
    audios = batch.column(audio_col).to_pylist()
    ids = batch.column(id_col).to_pylist() if id_col else None
    texts = batch.column(text_col).to_pylist() if text_col else None
    phrases = batch.column("key_phrases").to_pylist() if "key_phrases" in batch.schema.names else None
    rows = []
    for j, audio in enumerate(audios):
        i = first_index + j
        if isinstance(audio, dict):      # HF datasets Audio feature: {bytes, path}
            data, apath = audio.get("bytes"), audio.get("path")
        elif isinstance(audio, (bytes, bytearray)):
            data, apath = bytes(audio), None
        else:
            data, apath = None, audio
        uri = _join(base, apath, protocol) if (apath and data is None) else f"{file}#{i}"
        rid = ids[j] if ids is not None and ids[j] is not None else f"{prefix}:{i}"
        rows.append({"id": str(rid), "audio": uri, "audio_bytes": data,
                     "reference": None if texts is None or texts[j] is None else str(texts[j]),
                     "key_phrases": phrases[j] if phrases else None,
                     "error": None if data is not None or apath else f"no audio in {audio_col!r} (null)"})
    return rows


# --- scan (driver) -------------------------------------------------------------------

def scan(source: Source, rows_per_item: int = ROWS_PER_ITEM) -> Scan:
    """Every row's id and source of ``source`` (validated: present, unique), spilled by
    bucket, and its work items, reading no audio: a folder's listing, a manifest's lines one
    at a time, a table's id (and audio path) columns and footers. Raises SourceError naming
    the first problem. The caller closes the Scan (its spill folder)."""
    index = IdBuckets(INDEX_SCHEMA)
    try:
        items = _scan_into(source, rows_per_item, index)
        if not index.rows:
            raise SourceError(f"input {redact_uri(source.uri)!r}: no audio files, manifest rows or Parquet rows found")
        _check_unique(source, index)
    except BaseException:
        index.close()
        raise
    return Scan(index.rows, items, index)


def _check_unique(source: Source, index: IdBuckets) -> None:
    dupes: list[str] = []
    for bucket in index:
        counts = pc.value_counts(bucket.column("id"))
        dupes += pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1)).to_pylist()[:5]
        if len(dupes) >= 5:
            break
    if dupes:
        raise SourceError(f"input {redact_uri(source.uri)!r}: duplicate ids {sorted(dupes)[:5]} (ids must be unique)")


class _Rows:
    """Spills (id, audio, stamp, offset) rows in chunks; ``seq`` counts them."""

    def __init__(self, index: IdBuckets):
        self.index, self.seq = index, 0
        self.columns: dict[str, list] = {n: [] for n in ("id", "audio", "stamp", "offset_s")}

    def add(self, rid: str, audio: str | None, stamp: str | None = None, offset: float | None = None) -> None:
        for name, value in zip(self.columns, (rid, audio, stamp, offset)):
            self.columns[name].append(value)
        if len(self.columns["id"]) >= 65536:
            self.flush()

    def flush(self) -> None:
        n = len(self.columns["id"])
        if n:
            self.columns["seq"] = list(range(self.seq, self.seq + n))
            self.index.add_rows(self.columns)
            self.seq += n
            self.columns = {k: [] for k in ("id", "audio", "stamp", "offset_s")}

    @property
    def count(self) -> int:
        return self.seq + len(self.columns["id"])


def _scan_into(source: Source, rows_per_item: int, index: IdBuckets) -> list[dict]:
    out = _Rows(index)
    items: list[dict] = []
    if source.kind == "files":
        for start in range(0, len(source.files), rows_per_item):
            stop = min(len(source.files), start + rows_per_item)
            items.append({"kind": "files", "start": start, "stop": stop, "first_row": start, "rows": stop - start})
            for k in range(start, stop):
                f = source.files[k]
                out.add(_file_id(source, f), redact_uri(utf8_name(f)[0]), source.stamps[k] if source.stamps else None)
    elif source.kind == "manifest":
        # a --text-column no line holds is a typo, not rows without references
        text_seen, first_keys = source.text_column is None, None
        for file in source.files:
            fs, path = fsspec.core.url_to_fs(file)
            base, protocol = posixpath.dirname(path), _protocol(fs)
            count, item_start, item_line, first_row = 0, 0, 1, out.count
            for lineno, offset, obj in _manifest_lines(file):
                if count == rows_per_item:
                    items.append({"kind": "manifest", "file": file, "start": item_start,
                                  "stop": offset, "line": item_line, "first_row": first_row, "rows": count})
                    count, item_start, item_line, first_row = 0, offset, lineno, out.count
                row = _manifest_row(source, obj, base, protocol, f"{redact_uri(file)}:{lineno}")
                out.add(row["id"], redact_uri(row["audio"]), None, row["offset_s"])
                count += 1
                text_seen = text_seen or source.text_column in obj
                first_keys = first_keys if first_keys is not None else sorted(obj)
            if count:
                items.append({"kind": "manifest", "file": file, "start": item_start, "stop": None,
                              "line": item_line, "first_row": first_row, "rows": count})
        if out.count and not text_seen:
            raise SourceError(f"input {redact_uri(source.uri)!r}: no manifest line has the text key "
                              f"{source.text_column!r} (--text-column; the first line's keys: {first_keys})")
    else:
        import pyarrow.parquet as pq

        for file in source.files:
            fs, path = fsspec.core.url_to_fs(file)
            prefix = _file_id(source, file)    # as in _table_rows
            base, protocol = posixpath.dirname(path), _protocol(fs)
            with fs.open(path, "rb") as fh:
                pf = pq.ParquetFile(fh)
                audio_col, _, id_col = _table_columns(source, pf.schema_arrow.names, file)
                # A path column is read to compare sources; inline audio is "<file>#<row>"
                # (as _table_rows names it), and a {bytes, path} struct is not read at all.
                audio_type = pf.schema_arrow.field(audio_col).type
                paths = pa.types.is_string(audio_type) or pa.types.is_large_string(audio_type)
                inline = pa.types.is_binary(audio_type) or pa.types.is_large_binary(audio_type)
                first = 0
                for rg in range(pf.metadata.num_row_groups):
                    n = pf.metadata.row_group(rg).num_rows
                    cols = [c for c in (id_col, audio_col if paths else None) if c]
                    got = pf.read_row_group(rg, columns=cols) if cols else None
                    rids = got.column(id_col).to_pylist() if id_col else [None] * n
                    audios = got.column(audio_col).to_pylist() if paths else [None] * n
                    if n:
                        items.append({"kind": "table", "file": file, "row_group": rg, "first": first,
                                      "first_row": out.count, "rows": n})
                    for k in range(n):
                        i = first + k
                        rid = str(rids[k]) if rids[k] is not None else f"{prefix}:{i}"
                        audio = (redact_uri(_join(base, audios[k], protocol)) if audios[k] else
                                 redact_uri(f"{file}#{i}") if inline else None)
                        out.add(rid, audio)
                    first += n
    out.flush()
    return items


def unfinished_ids(ids: pa.Array, done) -> list[str]:
    """The ids of ``ids`` not in ``done`` (a set or an Arrow array), in source order."""
    if not done:
        return ids.to_pylist()
    value_set = done if isinstance(done, pa.Array) else pa.array(list(done), pa.string())
    return pc.filter(ids, pc.invert(pc.is_in(ids, value_set=value_set))).to_pylist()


# --- read (workers, or the local runner) ---------------------------------------------

def _batches(rows: list[dict], rows_per_batch: int, exclude, item: dict | None = None,
             position: int = 0) -> Iterator[pa.Table]:
    """``rows`` (the item's from ``position`` on) as INPUT tables, less what the item's
    resume plan skips and with its distinct ids, less ``exclude``."""
    if item is not None and ("skip" in item or "rename" in item):
        from .resume import apply_plan

        rows = apply_plan(rows, item, position)
    if exclude is not None and rows:
        keep = pc.invert(pc.is_in(pa.array([r["id"] for r in rows], pa.string()), value_set=exclude))
        rows = [r for r, k in zip(rows, keep.to_pylist()) if k]
    for i in range(0, len(rows), rows_per_batch):
        yield table(rows[i:i + rows_per_batch], INPUT_SCHEMA)


def read_item(source: Source, item: dict, rows_per_batch: int) -> Iterator[pa.Table]:
    """The rows of one work item as INPUT tables of at most ``rows_per_batch`` rows, less
    ``source.exclude``; only this item's rows (and their inline audio) are in memory."""
    exclude = source.exclude
    if item["kind"] == "files":
        # a name that is not UTF-8 is an error row, never a crash: no reader can open it by text
        start, stamps = item["start"], source.stamps
        rows = [{"id": _file_id(source, f), "audio": utf8_name(f)[0], "error": utf8_name(f)[1],
                 "audio_stamp": stamps[start + k] if stamps else None}
                for k, f in enumerate(source.files[start:item["stop"]])]
        yield from _batches(rows, rows_per_batch, exclude, item)
    elif item["kind"] == "manifest":
        file = item["file"]
        fs, path = fsspec.core.url_to_fs(file)
        base, protocol = posixpath.dirname(path), _protocol(fs)
        rows = [_manifest_row(source, obj, base, protocol, f"{redact_uri(file)}:{lineno}")
                for lineno, _, obj in _manifest_lines(file, item["start"], item["stop"], item["line"])]
        yield from _batches(rows, rows_per_batch, exclude, item)
    else:
        import pyarrow.parquet as pq

        file = item["file"]
        fs, path = fsspec.core.url_to_fs(file)
        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            audio_col, text_col, id_col = _table_columns(source, pf.schema_arrow.names, file)
            columns = [c for c in (audio_col, text_col, id_col) if c]
            if "key_phrases" in pf.schema_arrow.names:
                columns.append("key_phrases")
            first = item["first"]
            # Parquet batches of rows_per_batch: inline audio is decoded one batch at a time.
            for batch in pf.iter_batches(batch_size=rows_per_batch, row_groups=[item["row_group"]],
                                         columns=columns):
                rows = _table_rows(source, file, batch, first, audio_col, text_col, id_col)
                yield from _batches(rows, rows_per_batch, exclude, item, first - item["first"])
                first += batch.num_rows


def iter_input_batches(source: Source, rows_per_batch: int, items: list[dict] | None = None) -> Iterator[pa.Table]:
    """Every row of ``source`` (less its exclusions), streamed: one work item at a time."""
    for item in (scan(source).items if items is None else items):
        yield from read_item(source, item, rows_per_batch)


def input_batches(rows, rows_per_batch: int, items: list[dict] | None = None,
                  first_batch: int | None = None) -> Iterator[pa.Table]:
    """INPUT tables of at most ``rows_per_batch`` rows from a list of row dicts or a Source
    (streamed; ``items``: its scan's work items, if already made); with ``first_batch``
    the first ``rows_per_batch`` rows come in growing pieces (:func:`slow_start_tables`)."""
    tables = (table(rows[i:i + rows_per_batch], INPUT_SCHEMA) for i in range(0, len(rows), rows_per_batch)) \
        if isinstance(rows, list) else iter_input_batches(rows, rows_per_batch, items)
    yield from slow_start_tables(tables, rows_per_batch, first_batch or rows_per_batch)


def slow_start_tables(tables: Iterable[pa.Table], rows_per_batch: int, first_batch: int) -> Iterator[pa.Table]:
    """``tables`` (of at most ``rows_per_batch`` rows each) with the stream's first
    ``rows_per_batch`` rows cut into pipeline.batching.slow_start's growing pieces, so the
    first rows of a job finish within seconds; the tables after them pass whole."""
    sizes = iter(slow_start(first_batch, rows_per_batch))
    size = next(sizes)
    if size >= rows_per_batch:
        yield from tables
        return
    for t in tables:
        offset = 0
        # A table shorter than the next piece (the end of a work item) counts as that piece.
        while size is not None and offset < t.num_rows:
            piece = t.slice(offset, size)
            yield piece
            offset += piece.num_rows
            size = next(sizes, None)
        if offset < t.num_rows:
            yield t.slice(offset) if offset else t


def read_source(uri: str, audio_column: str | None = None, text_column: str | None = None) -> list[dict]:
    """All rows of ``uri`` as dicts, for small sources (tests, benchmarks, training sets);
    jobs stream instead (open_source, scan, read_item). Raises SourceError."""
    source = open_source(uri, audio_column, text_column)
    rows = []
    for batch in iter_input_batches(source, ROWS_PER_ITEM):
        rows.extend(batch.to_pylist())
    return rows


def read_jsonl_manifest(uri: str, keep_item: bool = False) -> list[dict]:
    """One row per non-empty line. ``keep_item``: each row also carries the line's own dict
    as ``item``, for readers that need keys beyond the data contract (a training corpus's
    ``split``, ``voice``, ...)."""
    source = Source(uri, "manifest", (uri,))
    fs, path = fsspec.core.url_to_fs(uri)
    base, protocol = posixpath.dirname(path), _protocol(fs)
    rows = []
    for lineno, _, obj in _manifest_lines(uri):
        rows.append(_manifest_row(source, obj, base, protocol, f"{redact_uri(uri)}:{lineno}"))
        if keep_item:
            rows[-1]["item"] = obj
    return rows


def open_audio(row: dict):
    """A binary file object over a row's audio: its inline bytes, or the file through
    fsspec (read as it is decoded, never whole)."""
    import io

    if row.get("audio_bytes") is not None:
        return io.BytesIO(row["audio_bytes"])
    return fsspec.open(row["audio"], "rb").open()


def read_bytes(row: dict) -> bytes | None:
    """The audio bytes of a manifest row (inline, or fetched through fsspec)."""
    if row.get("audio_bytes") is not None:
        return row["audio_bytes"]
    with fsspec.open(row["audio"], "rb") as fh:
        return fh.read()
