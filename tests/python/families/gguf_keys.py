"""The scalar metadata of a GGUF file, read from its header alone. gguf-py's reader parses every
array element (4 s on a 49k-token vocabulary); the fixture checks need a few scalars."""

from __future__ import annotations

import struct
from pathlib import Path

# GGUF value types: struct format of each fixed-size one; 8 is a string, 9 an array.
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def scalars(path: Path) -> dict[str, object]:
    """Every non-array key of ``path``'s metadata with its value (strings decoded)."""
    data = Path(path).read_bytes()
    magic, _version, _tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF", magic
    at = 24

    def take(fmt: str):
        nonlocal at
        (v,) = struct.unpack_from("<" + fmt, data, at)
        at += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal at
        n = take("Q")
        at += n
        return data[at - n : at].decode("utf-8")

    def value(ty: int):
        if ty in _FIXED:
            return take(_FIXED[ty])
        if ty == _STRING:
            return string()
        assert ty == _ARRAY, ty
        elem, count = take("I"), take("Q")
        for _ in range(count):
            value(elem)
        return None

    out: dict[str, object] = {}
    for _ in range(n_kv):
        key = string()
        ty = take("I")
        v = value(ty)
        if ty != _ARRAY:
            out[key] = v
    return out
