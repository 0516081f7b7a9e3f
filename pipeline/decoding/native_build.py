"""Build a C source that ships with the package into a shared library and load it with
ctypes, for the native CPU loops of the decoders (the CTC beam search's frame loop of
"FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities", Algorithm 1,
is the first).

The source is compiled on first use with the system C compiler (``$CC``, else ``cc``,
``gcc`` or ``clang``) into the cache directory of :func:`pipeline.cache.cache_dir`, under
a name keyed by the hash of the source and the flags, so an edited source is rebuilt and
concurrent workers share one build. No Python C-API and no shell are involved.

What is loaded is what was built: the build records the SHA-256 of the library beside it
(``<lib>.sha256``), and a load reads the library's bytes once, checks them against that
record, and loads that verified copy from a private temporary file (so the file cannot be
swapped between the check and the load). A library that fails the check, has no record,
or sits in a directory that other users can write to is rebuilt instead of loaded.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import stat
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..cache import cache_dir

log = logging.getLogger(__name__)


def compiler() -> str | None:
    """The C compiler to use: ``$CC``, else the first of cc, gcc, clang on the PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(source: Path, cflags: tuple[str, ...], out_dir: Path | None = None,
          libs: tuple[str, ...] = ("-lm",)) -> Path:
    """Compile ``source`` (if not cached in ``out_dir``, default the cache directory) and
    return the shared library's path. Raises RuntimeError with the compiler's message when
    that fails."""
    source = Path(source)
    text = source.read_bytes()
    digest = hashlib.sha256(text + " ".join(cflags).encode()).hexdigest()[:16]
    out_dir = Path(out_dir) if out_dir is not None else cache_dir()
    lib = out_dir / f"{source.stem}-{digest}.so"
    if lib.exists() and _verified(lib) is not None:
        return lib
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC, or install gcc)")
    out_dir.mkdir(parents=True, exist_ok=True)
    # build beside the target, then rename: concurrent workers never load half a file
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *cflags, "-o", tmp, str(source), *libs],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[:2000]}")
        record = Path(tmp + ".sha256")
        record.write_text(hashlib.sha256(Path(tmp).read_bytes()).hexdigest())
        os.replace(record, _record(lib))
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _record(lib: Path) -> Path:
    return lib.with_name(lib.name + ".sha256")


def _private(path: Path) -> bool:
    """Owned by this user and writable by no one else (the file and its directory)."""
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def _verified(lib: Path) -> bytes | None:
    """The library's bytes when they match the build's record, else None."""
    try:
        if not _private(lib):
            log.warning("%s is writable by other users; rebuilding it", lib)
            return None
        data = lib.read_bytes()
        expected = _record(lib).read_text().strip()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != expected:
        log.warning("%s does not match its build record; rebuilding it", lib)
        return None
    return data


def load(source: Path, cflags: tuple[str, ...], out_dir: Path | None = None) -> ctypes.CDLL:
    """Build ``source`` if needed and load the verified library. Raises OSError or
    RuntimeError when either fails; callers that can run without it catch those and fall
    back."""
    lib = build(source, cflags, out_dir)
    data = _verified(lib)
    if data is None:
        lib.unlink(missing_ok=True)
        lib = build(source, cflags, out_dir)
        data = _verified(lib)
        if data is None:
            raise RuntimeError(f"{lib}: the library just built does not verify")
    fd, private = tempfile.mkstemp(suffix=".so")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return ctypes.CDLL(private)
    finally:
        os.unlink(private)
