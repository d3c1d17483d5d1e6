"""The prefix store's value format, and what the store checks of a value before the core loads it.

A value (all integers little-endian)::

    magic    8    b"OKVCHUNK"
    version  u16  VALUE_VERSION
    flags    u8   bit 0: every snapshot is complete (its ring layers carry the tail they need)
    kind     u8   0: a KvSequenceCache range [start, end); 1: a KvCellCache prefix [0, end)
    start    u64, end u64
    n_tok    u32, tokens int64 x n_tok   (the chunk's tokens: [start, end), kind 1: [0, end))
    n_snap   u32, length u64 x n_snap
    crc32    u32  over every byte above (zlib's CRC-32)
    snapshots, concatenated

The CRC covers the header only: each snapshot carries its own CRC-32, which the core checks as it
loads, so the rows are checksummed once. Before loading, the store reads each snapshot's header
(no checksum pass) and accepts the value only if the snapshot's layout (version, kind, flags,
layers, policies, heads, dtypes, row bytes) is the cache's and its range is the chunk's; a
header damaged past that is caught by the core's checksum. The flags byte sits at a fixed offset
so a ``save`` can read it with a ranged read (``HEAD_BYTES``) to replace an incomplete chunk.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

VALUE_MAGIC = b"OKVCHUNK"
VALUE_VERSION = 2
KIND_SEQ, KIND_CELL = 0, 1
FLAG_COMPLETE = 1
HEAD_BYTES = 12
"""Magic, version, flags, kind: what ``head_many`` reads."""
_FIXED = struct.Struct("<8sHBBQQI")

SNAP_MAGIC = b"OKVSNAP\0"
_SNAP_HEADER = 16
_LAYER_PRINT = 27


def tokens_bytes(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}q", *tokens)


def encode_value(
    kind: int, start: int, end: int, tokens: Sequence[int], snaps: Sequence[bytes], complete: bool
) -> bytes:
    flags = FLAG_COMPLETE if complete else 0
    head = [_FIXED.pack(VALUE_MAGIC, VALUE_VERSION, flags, kind, start, end, len(tokens))]
    head.append(tokens_bytes(tokens))
    head.append(struct.pack(f"<I{len(snaps)}Q", len(snaps), *(len(b) for b in snaps)))
    body = b"".join(head)
    return b"".join([body, struct.pack("<I", zlib.crc32(body)), *snaps])


def claims_complete(value: bytes | memoryview) -> bool:
    """Whether a value's flags byte says every snapshot is complete (the store checks the
    claim against the snapshots on load: a ``save`` trusts it)."""
    return len(value) >= HEAD_BYTES and bool(value[10] & FLAG_COMPLETE)


def head_complete(head: bytes) -> bool | None:
    """From a value's first ``HEAD_BYTES``: whether it is a complete chunk of this version
    (``None``: not a value this build writes, to be replaced)."""
    if len(head) < HEAD_BYTES or head[:8] != VALUE_MAGIC:
        return None
    version, flags = struct.unpack_from("<HB", head, 8)
    if version != VALUE_VERSION:
        return None
    return bool(flags & FLAG_COMPLETE)


def decode_value(
    value: bytes, kind: int, start: int, end: int, tokens: bytes, n_snaps: int
) -> list[memoryview] | str:
    """The snapshots of a value for the chunk ``[start, end)`` with ``tokens`` (their int64
    bytes), or why the value is not that chunk's."""
    mv = memoryview(value)
    if len(mv) < _FIXED.size or bytes(mv[:8]) != VALUE_MAGIC:
        return "not a chunk value"
    _magic, version, _flags, vkind, vstart, vend, n_tok = _FIXED.unpack_from(mv, 0)
    if version != VALUE_VERSION:
        return f"version {version}, this build reads {VALUE_VERSION}"
    at = _FIXED.size + 8 * n_tok
    if at + 4 > len(mv):
        return "truncated"
    (n,) = struct.unpack_from("<I", mv, at)
    if n != n_snaps:
        return f"{n} snapshots, the cache has {n_snaps} layer caches"
    lens_at = at + 4
    crc_at = lens_at + 8 * n
    if crc_at + 4 > len(mv):
        return "truncated"
    if zlib.crc32(mv[:crc_at]) != struct.unpack_from("<I", mv, crc_at)[0]:
        return "header checksum mismatch"
    if (vkind, vstart, vend) != (kind, start, end):
        return f"holds kind {vkind} [{vstart}, {vend}), the key's is kind {kind} [{start}, {end})"
    if mv[_FIXED.size : _FIXED.size + 8 * n_tok] != tokens:
        return "tokens differ (a hash collision)"
    lens = struct.unpack_from(f"<{n}Q", mv, lens_at)
    snaps, off = [], crc_at + 4
    for length in lens:
        if off + length > len(mv):
            return "truncated"
        snaps.append(mv[off : off + length])
        off += length
    if off != len(mv):
        return "trailing bytes"
    return snaps


def layout_of(empty_snapshot: bytes) -> bytes:
    """The layout bytes of a cache (version, kind, flags, layers and their prints), read from a
    snapshot of no positions: what every snapshot it accepts starts with after the magic."""
    (n_layers,) = struct.unpack_from("<I", empty_snapshot, 12)
    return bytes(empty_snapshot[8 : _SNAP_HEADER + _LAYER_PRINT * n_layers])


def check_snapshot(snap: memoryview, layout: bytes, kind: int, start: int, end: int) -> bool | str:
    """Whether ``snap`` (unverified bytes) has the cache's ``layout`` and holds ``[start, end)``
    (kind 1: exactly the held range ``[0, end)``); returns whether its ring layers are complete,
    or why it does not fit."""
    lay_end = 8 + len(layout)
    if len(snap) < lay_end + 16 + 4 or bytes(snap[:8]) != SNAP_MAGIC:
        return "not a snapshot"
    if snap[8:lay_end] != layout:
        return "another layout (layers, policies, heads, dtypes) or format"
    n_layers = (len(layout) - 8) // _LAYER_PRINT
    if kind == KIND_CELL:
        (n_ranges,) = struct.unpack_from("<I", snap, lay_end)
        if n_ranges != 1 or struct.unpack_from("<QQ", snap, lay_end + 4) != (0, end):
            return f"the snapshot does not hold exactly [0, {end})"
        return True
    s, e = struct.unpack_from("<QQ", snap, lay_end)
    if (s, e) != (start, end):
        return f"the snapshot holds [{s}, {e}), the chunk is [{start}, {end})"
    if len(snap) < lay_end + 16 + 8 * n_layers + 4:
        return "truncated"
    froms = struct.unpack_from(f"<{n_layers}Q", snap, lay_end + 16)
    complete = True
    for i, f in enumerate(froms):
        policy, window = struct.unpack_from("<BQ", snap, _SNAP_HEADER + _LAYER_PRINT * i)
        need = start if policy == 0 else max(start, end - (window - 1))
        if f < need:
            # No save writes a ring layer below its window's tail; the core refuses one
            # carrying more than its slots, so such a value is damage, never a shorter chain.
            return f"layer {i} carries positions from {f}, below the {need} its window needs"
        complete = complete and f == need
    return complete


def check_value(
    value: object,
    kind: int,
    start: int,
    end: int,
    tokens: Sequence[int],
    layouts: Sequence[bytes],
) -> tuple[list[memoryview], bool] | str:
    """A backend's ``value`` for the chunk ``[start, end)`` holding ``tokens``, for caches of
    ``layouts`` (one per layer cache): ``(snapshots, complete)``, or why it is not that chunk's
    (anything else than bytes, a header, range, token, layout or range mismatch, a flags byte
    claiming complete over incomplete snapshots). The rows' checksums are the core's to check."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return f"the backend returned {type(value).__name__}, not bytes"
    snaps = decode_value(value, kind, start, end, tokens_bytes(tokens), len(layouts))
    if isinstance(snaps, str):
        return snaps
    complete = True
    for i, (snap, lay) in enumerate(zip(snaps, layouts)):
        ok = check_snapshot(snap, lay, kind, start, end)
        if isinstance(ok, str):
            return f"layer cache {i}: {ok}"
        complete = complete and ok
    if claims_complete(value) and not complete:
        # A save reads only the flags: a lie there would never be replaced.
        return "its flags claim complete, its snapshots are not"
    return snaps, complete
