"""What a config's file references hold, for ``config_hash``: a rerun whose LM, phrase
list, token map, calibration or checkpoint changed on disk under the same path is another
config, and its resume must be refused rather than mix rows of both.

A file's fingerprint is SHA-256 over its size and its first and last MiB: a rebuilt
n-gram, a retrained head or an edited phrase list differs there (their headers hold sizes
and counts), and a multi-GB checkpoint costs two reads, not a full hash. A folder's is
over its top-level files by name. A path that does not resolve (an HF id, a missing file
preflight reports) has none.
"""
from __future__ import annotations

import hashlib
import posixpath

EDGE_BYTES = 1 << 20
MAX_FOLDER_FILES = 256     # a folder that holds more is not a checkpoint or an LM folder


def _file_digest(fs, path: str, size: int) -> bytes:
    h = hashlib.sha256(str(size).encode())
    with fs.open(path, "rb") as fh:
        h.update(fh.read(EDGE_BYTES))
        if size > 2 * EDGE_BYTES:
            fh.seek(size - EDGE_BYTES)
            h.update(fh.read(EDGE_BYTES))
        elif size > EDGE_BYTES:
            h.update(fh.read())
    return h.digest()


def fingerprint(uri: str, options: dict | None = None) -> str | None:
    """The fingerprint of a file or folder at ``uri`` (any fsspec URL); None where there is
    nothing to read."""
    from .storage import url_to_fs

    try:
        fs, path = url_to_fs(uri, options)
        info = fs.info(path)
        if info.get("type") == "directory":
            entries = sorted((e for e in fs.ls(path, detail=True) if e.get("type") == "file"
                              and not posixpath.basename(e["name"]).startswith(".")), key=lambda e: e["name"])
            if len(entries) > MAX_FOLDER_FILES:
                return None
            h = hashlib.sha256()
            for e in entries:
                h.update(posixpath.basename(e["name"]).encode() + b"\0")
                h.update(_file_digest(fs, e["name"], int(e.get("size") or 0)))
            return h.hexdigest()[:16]
        return _file_digest(fs, path, int(info.get("size") or 0)).hex()[:16]
    except (OSError, ValueError, ImportError):
        return None
