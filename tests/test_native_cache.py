"""The native-library cache loads only what it built (pipeline.decoding.native_build)."""
from __future__ import annotations

import ctypes
import hashlib

import pytest

from shardscribe.pipeline.decoding import native_build

SOURCE = "int answer(void) { return 42; }\n"


@pytest.fixture
def built(tmp_path):
    if native_build.compiler() is None:
        pytest.fail("no C compiler: run scripts/setup.sh")
    src = tmp_path / "answer.c"
    src.write_text(SOURCE)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    lib = native_build.build(src, ("-O1", "-shared", "-fPIC"), cache)
    return src, cache, lib


def _answer(lib: ctypes.CDLL) -> int:
    return lib.answer()


def test_a_tampered_library_is_rebuilt_not_loaded(built):
    src, cache, lib = built
    record = lib.with_name(lib.name + ".sha256").read_text()
    assert record == hashlib.sha256(lib.read_bytes()).hexdigest()
    # A library replaced in the cache (here: one that returns 7) must not be loaded.
    other = src.with_name("seven.c")
    other.write_text("int answer(void) { return 7; }\n")
    evil = native_build.build(other, ("-O1", "-shared", "-fPIC"), src.parent / "elsewhere")
    lib.write_bytes(evil.read_bytes())
    assert _answer(native_build.load(src, ("-O1", "-shared", "-fPIC"), cache)) == 42
    assert hashlib.sha256(lib.read_bytes()).hexdigest() == record


def test_a_library_without_its_record_is_rebuilt(built):
    src, cache, lib = built
    lib.with_name(lib.name + ".sha256").unlink()
    assert _answer(native_build.load(src, ("-O1", "-shared", "-fPIC"), cache)) == 42
    assert lib.with_name(lib.name + ".sha256").exists()


def test_a_cache_others_can_write_is_not_trusted(built):
    src, cache, lib = built
    cache.chmod(0o777)
    with pytest.raises(RuntimeError, match="does not verify"):
        native_build.load(src, ("-O1", "-shared", "-fPIC"), cache)
