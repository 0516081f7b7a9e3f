"""Checkpoints at an fsspec URL (``model.source: s3://bucket/ckpt``, ``gs://``, ``file://``,
any fsspec protocol): fetched once per node into the local model cache, then loaded from
there like any checkpoint directory.

Every process that loads the model (each model actor on a node) asks for the same cache
entry. A file lock lets one of them download, into a temporary folder renamed into place
when complete, while the others wait and then reuse it; so a node reads the checkpoint from
the store once, and no process ever loads a half-written copy. An entry is named by a hash
of the URL and of the remote files' identity (name, size, ETag or modification time), so a
checkpoint rewritten in place is fetched again under a new name rather than mixed with
the old copy. A Hugging Face id is read from each node's hub cache, which
``model.allow_download`` fills on the node that lacks it.

Only the files transformers loads a checkpoint from are fetched (configs, tokenizer and
feature-extractor files, safetensors weights); the rest of the folder is named in the log,
and a name that would leave the folder is refused. The driver's preflight fetches the same
files without the weights. Storage options are fsspec's defaults for the URL's protocol
(``pipeline.storage.use_options``: the job sets them in the driver and hands them to its
workers); credentials come only from the standard chains.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError
from ..storage import redact_text, redact_uri

log = logging.getLogger(__name__)

# What from_pretrained reads: configs (model, generation, processor, tokenizer, the shard
# index), vocabularies (vocab.txt, merges.txt, SentencePiece and tiktoken models, chat
# templates) and safetensors weights. Pickled weights are not fetched: unpickling a file
# from a shared store runs whatever code it holds.
CHECKPOINT_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja", ".safetensors")
WEIGHT_SUFFIX = ".safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# A folder listing more is not one checkpoint (a bucket's root, a data set): refused
# rather than fetched file by file.
MAX_ENTRIES = 1000
# What can tell two versions of one object apart, as the fsspec backends name it (s3fs,
# gcsfs, adlfs, the local filesystem); every one a listing gives goes into the cache key.
IDENTITY_KEYS = ("ETag", "etag", "generation", "md5Hash", "crc32c", "version_id", "LastModified",
                 "last_modified", "updated", "mtime")


@dataclass(frozen=True)
class RemoteFile:
    name: str        # its name in the checkpoint folder: one plain name, no directory part
    path: str        # its path on the filesystem
    size: int
    identity: str    # what changes when the object is rewritten (ETag, generation, mtime)


@dataclass(frozen=True)
class Listing:
    """A checkpoint folder as its store lists it."""
    url: str
    fs: object
    files: tuple[RemoteFile, ...]    # the files a checkpoint is loaded from, by name
    skipped: tuple[str, ...]         # what else the folder holds: never fetched

    def selected(self, weights: bool) -> tuple[RemoteFile, ...]:
        return tuple(f for f in self.files if weights or not f.name.endswith(WEIGHT_SUFFIX))

    def weights_problem(self) -> str | None:
        """Why the weights cannot be fetched (as the end of a ``model.source=URL:`` line);
        None where the folder has safetensors weights."""
        if any(f.name.endswith(WEIGHT_SUFFIX) for f in self.files):
            return None
        pickled = [n for n in self.skipped if n.endswith(PICKLE_SUFFIXES)]
        if pickled:
            return (f"its weights are pickled ({', '.join(pickled)}), which are not fetched from a URL; save "
                    "them as safetensors (save_pretrained(..., safe_serialization=True))")
        return "the folder has a config.json but no weights (*.safetensors)"


def is_remote(source) -> bool:
    """Whether ``model.source`` is a URL rather than a directory, hub id or shipped name."""
    return isinstance(source, str) and "://" in source


def cache_root(model_config) -> Path:
    """Where this node keeps fetched checkpoints: ``model.cache_dir``, else shardscribe's
    cache (``$SHARDSCRIBE_CACHE``, else ``~/.cache/shardscribe``), under ``models/``."""
    from ..cache import cache_dir

    base = Path(model_config.cache_dir).expanduser() if model_config.cache_dir else cache_dir()
    return base / "models"


def local_model_config(model_config, weights: bool = True, shipped: tuple[str, ...] = ()):
    """``model_config`` with its checkpoint on this node: a URL ``model.source`` replaced by
    its copy in the node's cache (fetched first where no process on the node has yet); a
    Hugging Face id downloaded into the node's hub cache first under ``model.allow_download``
    (the driver's download fills its own node's only); ``shipped`` names (the family's own
    models) and directories unchanged. ``weights=False``: the configs and tokenizer only,
    for what needs no model."""
    source = model_config.source
    if not is_remote(source):
        if model_config.allow_download and source not in shipped:
            download_missing(source)
        return model_config
    folder, _ = fetch_checkpoint(source, cache_root(model_config), weights=weights)
    return model_config.with_values(source=str(folder))


def download_checkpoint(source: str, cache_dir: str | None = None) -> None:
    """Hub id ``source`` into the local Hugging Face cache (``model.allow_download``);
    ModelError in one line where the hub cannot be reached or has no such repository."""
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(source, cache_dir=cache_dir)
    except Exception as exc:   # network, authentication, no such repository: one line either way
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise ModelError(f"model.source={source}: the download (model.allow_download) failed: "
                         f"{type(exc).__name__}: {first}") from None


def download_missing(source: str) -> None:
    """Hub id ``source`` into this machine's Hugging Face cache where its config.json is not
    there yet (huggingface_hub locks its own downloads, so the model workers of one node
    share one). A path, or a name that cannot be a hub id, is left alone."""
    path = Path(source).expanduser()
    if path.exists() or path.is_absolute() or source.startswith((".", "~")) or source.count("/") > 1:
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(source, "config.json"), str):
        download_checkpoint(source)


def _where(url: str) -> str:
    return f"model.source={redact_uri(url)}"


def _failure(url: str, what: str, exc: BaseException) -> ModelError:
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return ModelError(f"{_where(url)}: {what} ({type(exc).__name__}: {redact_text(first)})")


def _filesystem(url: str, options: dict | None):
    from ..storage import StorageError, url_to_fs

    try:
        fs, path = url_to_fs(url, options)
    except StorageError as exc:
        raise ModelError(f"model.source={exc}") from None
    return fs, path.rstrip("/")


def list_checkpoint(url: str, options: dict | None = None) -> Listing:
    """The checkpoint folder at ``url``; ModelError in one line where there is nothing
    there, no config.json, a name that would leave the folder, or no answer from the store."""
    fs, root = _filesystem(url, options)
    try:
        fs.invalidate_cache(root)   # a long-lived worker must see a checkpoint rewritten since
        if fs.info(root).get("type") != "directory":
            raise ModelError(f"{_where(url)}: a file, not a checkpoint folder")
        entries = fs.ls(root, detail=True)
    except FileNotFoundError:
        raise ModelError(f"{_where(url)}: nothing there (no such checkpoint folder)") from None
    except ModelError:
        raise
    except Exception as exc:   # credentials, network, endpoint: the backends raise their own kinds
        raise _failure(url, "cannot list the checkpoint folder", exc) from None
    if len(entries) > MAX_ENTRIES:
        raise ModelError(f"{_where(url)}: the folder holds {len(entries)} entries (more than {MAX_ENTRIES}): "
                         "not one checkpoint")
    files, skipped = _sorted_entries(url, root, entries)
    if "config.json" not in {f.name for f in files}:
        raise ModelError(f"{_where(url)}: the folder has no config.json (not a transformers checkpoint)")
    return Listing(url, fs, files, skipped)


def _sorted_entries(url: str, root: str, entries: list[dict]) -> tuple[tuple[RemoteFile, ...], tuple[str, ...]]:
    """(the checkpoint's files, the names of everything else), each by name."""
    files, skipped = [], []
    for entry in entries:
        path = entry["name"].rstrip("/")
        if path == root:    # a store's folder marker object
            continue
        name = _member_name(url, root, path)
        if entry.get("type") != "file":
            skipped.append(name + "/")
        elif name.startswith(".") or not name.endswith(CHECKPOINT_SUFFIXES):
            skipped.append(name)
        else:
            files.append(RemoteFile(name, entry["name"], int(entry.get("size") or 0), _identity(entry)))
    return tuple(sorted(files, key=lambda f: f.name)), tuple(sorted(skipped))


def _member_name(url: str, root: str, path: str) -> str:
    """The name of listed ``path`` inside folder ``root``; ModelError for one that is not a
    plain name there (``..``, a separator): it would be written outside the cache entry."""
    name = path[len(root) + 1:] if path.startswith(root + "/") else ""
    if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise ModelError(f"{_where(url)}: the folder lists {redact_uri(path)!r}, not a plain name inside it; "
                         "refused")
    return name


def _identity(entry: dict) -> str:
    return ";".join(f"{k}={entry[k]}" for k in IDENTITY_KEYS if entry.get(k) is not None)


def entry_name(listing: Listing, weights: bool) -> str:
    """The cache entry of ``listing``'s files (with or without the weights): the folder's
    last name, for people, and a hash of the URL and the files' names, sizes and identity."""
    url = redact_uri(listing.url).rstrip("/")
    described = [url, weights, [(f.name, f.size, f.identity) for f in listing.selected(weights)]]
    digest = hashlib.sha256(json.dumps(described).encode()).hexdigest()[:20]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", posixpath.basename(url)).lstrip(".")[:48] or "checkpoint"
    return f"{label}-{digest}" + ("" if weights else "-configs")


def fetch_checkpoint(url: str, root: str | Path, options: dict | None = None, weights: bool = True,
                     listing: Listing | None = None) -> tuple[Path, bool]:
    """The local copy of checkpoint ``url`` under ``root``, fetched first unless a process
    on this node already has: (its folder, whether this call downloaded it).
    ``weights=False``: the configs and tokenizer files only (a complete copy serves too)."""
    listing = listing or list_checkpoint(url, options)
    problem = listing.weights_problem()
    if weights and problem:
        raise ModelError(f"{_where(url)}: {problem}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    candidates = [root / entry_name(listing, True)] + ([] if weights else [root / entry_name(listing, False)])
    for folder in candidates:
        if folder.is_dir():   # complete: an entry appears only by its final rename
            return folder, False
    target = candidates[-1]
    with _held(target, url):
        if target.is_dir():   # another process fetched it while this one waited
            return target, False
        _download(listing, listing.selected(weights), target)
    return target, True


@contextlib.contextmanager
def _held(target: Path, url: str):
    """The node-wide lock of cache entry ``target``, waited for as long as another process's
    download takes (saying so once)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(target) + ".lock")
    try:
        lock.acquire(timeout=1)
    except Timeout:
        log.info("%s: another process on this node is fetching it; waiting", _where(url))
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _download(listing: Listing, files: tuple[RemoteFile, ...], target: Path) -> None:
    """``files`` into a temporary folder beside ``target``, renamed to it once all are there
    at their listed sizes. Called under the entry's lock."""
    url = listing.url
    for stale in target.parent.glob(f".{target.name}.part-*"):   # a process that died mid-fetch
        shutil.rmtree(stale, ignore_errors=True)
    part = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.part-"))
    log.info("%s: fetching %d files (%.1f MiB) into %s", _where(url), len(files),
             sum(f.size for f in files) / 2**20, target)
    if listing.skipped:
        log.info("%s: not fetched (not files a checkpoint is loaded from): %s", _where(url),
                 ", ".join(listing.skipped))
    try:
        for f in files:
            _get(listing, f, part / f.name)
        os.rename(part, target)
    finally:
        shutil.rmtree(part, ignore_errors=True)


def _get(listing: Listing, remote: RemoteFile, local: Path) -> None:
    try:
        listing.fs.get_file(remote.path, str(local))
    except Exception as exc:   # the backends raise their own kinds for network and permission errors
        raise _failure(listing.url, f"cannot fetch {remote.name}", exc) from None
    size = local.stat().st_size
    if size != remote.size:
        raise ModelError(f"{_where(listing.url)}: {remote.name} changed while it was fetched ({remote.size} bytes "
                         f"listed, {size} read); run the job again")


def read_member(url: str, name: str, options: dict | None = None) -> str | None:
    """File ``name`` of checkpoint folder ``url`` as text (a small config file, read
    remotely: the driver never reads the weights); None where the folder has no such file."""
    fs, root = _filesystem(url, options)
    try:
        with fs.open(f"{root}/{name}", "rb") as fh:
            return fh.read().decode("utf-8")
    except FileNotFoundError:
        return None
    except Exception as exc:   # as in list_checkpoint
        raise _failure(url, f"cannot read {name}", exc) from None
