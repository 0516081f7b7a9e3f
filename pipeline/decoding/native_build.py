"""Build a C source that ships with the package into a shared library and load it with
ctypes, for the native CPU loops of the decoders (the CTC beam search's frame loop of
"FlexCTC: GPU-powered CTC Beam Decoding with advanced Contextual Abilities", Algorithm 1,
is the first).

The source is compiled on first use with the system C compiler (``$CC``, else ``cc``,
``gcc`` or ``clang``) into the cache directory of :func:`pipeline.cache.cache_dir`, under
a name keyed by the hash of the source and the flags, so an edited source is rebuilt and
concurrent workers share one build. No Python C-API and no shell are involved.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pipeline.cache import cache_dir


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
    if lib.exists():
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
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def load(source: Path, cflags: tuple[str, ...], out_dir: Path | None = None) -> ctypes.CDLL:
    """Build ``source`` if needed and load it. Raises OSError or RuntimeError when either
    fails; callers that can run without it catch those and fall back."""
    return ctypes.CDLL(str(build(source, cflags, out_dir)))
