"""The weights digest of a GGUF file (the native engine's model identity, see :mod:`.identity`).

The file is never read whole: the digest hashes the header as stored (metadata and tensor
infos, every byte up to the aligned start of the tensor data), the file's size, and for every
tensor ``SAMPLES`` windows of ``WINDOW`` bytes spread evenly over its bytes plus its last
window. A tensor's bytes run from its offset to the next tensor's (the last one's to the end of
the file), so no table of quantized block sizes is needed. Reading an 8 GB file's digest costs
a few thousand page reads, not 8 GB.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from typing import Any

from .._errors import EngineError

__all__ = ["gguf_digest"]

SAMPLES = 64
"""Windows sampled per tensor."""
WINDOW = 64
"""Bytes per sampled window."""

# Fixed-width metadata value types (GGUF's numbering) -> their size in bytes.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4


class _Reader:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf: Any, path: str):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise EngineError(f"{self.path}: truncated GGUF header (at byte {self.pos})")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> bytes:
        return self.take(self.u64())

    def skip_value(self, kind: int, depth: int = 0) -> None:
        if kind in _FIXED:
            self.take(_FIXED[kind])
        elif kind == _STRING:
            self.take(self.u64())
        elif kind == _ARRAY and depth == 0:
            inner, n = self.u32(), self.u64()
            if inner in _FIXED:
                self.take(_FIXED[inner] * n)
            else:
                for _ in range(n):
                    self.skip_value(inner, depth + 1)
        else:
            raise EngineError(f"{self.path}: GGUF metadata value of unknown type {kind}")


def gguf_digest(path: str | os.PathLike[str], samples: int = SAMPLES) -> bytes:
    """SHA-256 over GGUF ``path``'s header, size and a strided sample of every tensor's bytes.

    Raises:
        EngineError: not a GGUF file, a truncated or inconsistent header.
        OSError: the file cannot be opened.
        ValueError: ``samples`` below 1.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples: expected an int >= 1, got {samples!r}")
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            raise EngineError(f"{path}: not a GGUF file ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _digest(buf, size, path, samples)


def _digest(buf: Any, size: int, path: str, samples: int) -> bytes:
    header, start, offsets = layout(buf, size, path)
    h = hashlib.sha256(b"offgraph-kv gguf v1\0")
    h.update(struct.pack("<QQ", size, samples))
    h.update(buf[:header])  # magic, version, metadata, tensor infos
    bounds = sorted(set(offsets)) + [size - start]
    for lo, hi in zip(bounds, bounds[1:]):
        n = hi - lo
        step = max(WINDOW, n // samples)
        for at in range(0, n, step)[:samples]:
            h.update(buf[start + lo + at : start + lo + min(at + WINDOW, n)])
        h.update(buf[start + hi - min(WINDOW, n) : start + hi])
    return h.digest()


def layout(buf: Any, size: int, path: str) -> tuple[int, int, list[int]]:
    """``(header bytes, start of the tensor data, each tensor's offset in the data)`` of the
    GGUF bytes ``buf`` (``size`` long, ``path`` names it in errors)."""
    r = _Reader(buf, path)
    if r.take(4) != b"GGUF":
        raise EngineError(f"{path}: not a GGUF file (bad magic)")
    version = r.u32()
    if version < 2:
        raise EngineError(f"{path}: GGUF version {version} is not supported")
    n_tensors, n_kv = r.u64(), r.u64()
    alignment = 32
    for _ in range(n_kv):
        key = r.string()
        kind = r.u32()
        if key == b"general.alignment" and kind == _UINT32:
            alignment = struct.unpack("<I", buf[r.pos : r.pos + 4])[0] or 32
        r.skip_value(kind)
    offsets = []
    for _ in range(n_tensors):
        r.string()
        n_dims = r.u32()
        if n_dims > 8:
            raise EngineError(f"{path}: a tensor of {n_dims} dimensions")
        r.take(8 * n_dims + 4)  # dims, type: hashed with the header
        offsets.append(r.u64())
    start = -(-r.pos // alignment) * alignment
    data = size - start
    if data < 0 or any(not 0 <= o <= data for o in offsets):
        raise EngineError(f"{path}: a tensor offset lies past the end of the file")
    return r.pos, start, offsets
