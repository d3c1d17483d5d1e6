"""The host tier: K/V of prompts that left the cell pool, kept in process memory.

When a :class:`~offgraph_kv.hf.BatchGenerator` evicts a held (cached, finished) sequence for
room, :meth:`HostTier.evicted` copies its whole chunks out of the pool as chunk snapshots
(``kc.save_seq_chunk``); a later request whose prompt shares the prefix gets it back with
:meth:`HostTier.admit` (``kc.load_seq_chunks``) instead of prefilling it again.

* **Deduplicated.** Chunks are keyed by the chained hash of their tokens (the cell store's key
  chain, :func:`~offgraph_kv.store.cells.cell_keys`, rooted at the cache's cell layout), so
  sessions that share a long system prompt store its chunks once, each session adding only its
  own tail. A chunk snapshot carries its own range only: a prompt of ``n`` chunks costs ``n``
  chunks' rows, not the ``n (n + 1) / 2`` of whole-prefix snapshots.
* **LRU by bytes.** Past ``max_bytes`` the least recently used chunks are dropped. A chain's
  chunks are touched tail first, so its head (shared by more prompts) outlives its tail.
* **Ring layers.** A chunk carries ring-layer rows only for the positions the ring table still
  held when it was saved (the sequence's newest). A chain is restored only where it ends
  ring-complete (the next step's window is carried); a chunk already held without ring rows is
  replaced when a later eviction holds them.
* **Damage.** A chunk the core refuses for its bytes (checksum) is dropped and the admission
  tries a shorter chain; no room in the pool is a miss that keeps the chunks.

Identity: the tier never leaves the process, so its keys hash a per-tier name; a tier binds to
the first model it serves and refuses another. The engine thread is the only caller of
:meth:`admit` and :meth:`evicted`; :meth:`stats` may be read from any thread.
"""

from __future__ import annotations

import struct
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import _native as _okv
from .._errors import CacheError, DTypeError, InvalidArgumentError, SnapshotError
from .cells import cell_keys, cell_layout
from .chunks import ChunkStore

__all__ = ["HostTier"]

# A chunk snapshot's state (start, end, ring_from) follows the 16-byte header and 27 bytes of
# fingerprint per layer (src/kv/snapshot/format.rs).
_HEADER, _LAYER_PRINT = 16, 27


@dataclass
class _Chunk:
    blob: bytes
    start: int
    end: int
    ring_from: int


def _ring_from(blob: bytes) -> int:
    (n_layers,) = struct.unpack_from("<I", blob, 12)
    return int(struct.unpack_from("<Q", blob, _HEADER + _LAYER_PRINT * n_layers + 16)[0])


def _checked_size(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgumentError(f"{name}: expected an int, got {type(v).__name__}")
    if v < 0:
        raise InvalidArgumentError(f"{name}: expected >= 0, got {v}")
    return v


def _cache(kc: Any) -> Any:
    if not isinstance(kc, _okv.KvCellCache):
        raise DTypeError(f"kc: expected a KvCellCache, got {type(kc).__name__}")
    return kc


def _ids(name: str, tokens: Any) -> list[int]:
    """Token ids as ints (numpy integers too); anything else is a DTypeError."""
    try:
        out = [t.__index__() for t in tokens]
    except (TypeError, AttributeError):
        raise DTypeError(f"{name}: expected a sequence of token ids (ints)") from None
    if any(isinstance(t, bool) for t in tokens):
        raise DTypeError(f"{name}: expected token ids, got a bool")
    return out


def _index(name: str, v: Any) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise DTypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v.__index__() < 0:
        raise InvalidArgumentError(f"{name}: expected >= 0, got {v}")
    return int(v.__index__())


class HostTier:
    """An in-process, deduplicated, LRU-by-bytes store of evicted sequences' chunks.

    Args:
        max_bytes: most bytes of chunk snapshots held (0 holds nothing).
        chunk_tokens: tokens per chunk: the granularity of what is shared and restored.
    """

    def __init__(self, max_bytes: int, chunk_tokens: int = 256):
        self.max_bytes = _checked_size("max_bytes", max_bytes)
        if _checked_size("chunk_tokens", chunk_tokens) == 0:
            raise InvalidArgumentError("chunk_tokens: expected >= 1, got 0")
        self.chunk_tokens = chunk_tokens
        name = f"offgraph-kv host tier {uuid.uuid4()}"
        self._keys = ChunkStore(None, chunk_tokens, namespace="host", model=name)  # keys only
        self._chunks: OrderedDict[str, _Chunk] = OrderedDict()  # LRU first
        self._lock = threading.Lock()
        self._bytes = 0
        self._model_id: int | None = None
        self._layout: tuple[Any, bytes, int, int] | None = None  # kc, layout, window, keep
        self._counts = {"hits": 0, "tokens_restored": 0, "evictions": 0, "misses": 0}

    def bind(self, model: Any) -> None:
        """Ties the tier to ``model``: its keys name no weights, so one tier serves one model
        (``InvalidArgumentError`` for another)."""
        if self._model_id is not None and self._model_id != id(model):
            raise InvalidArgumentError("HostTier: already serving another model")
        self._model_id = id(model)

    def _layout_of(self, kc: Any) -> tuple[bytes, int, int]:
        """``kc``'s cell layout, largest ring window and ring keep (memoized per cache)."""
        if self._layout is None or self._layout[0] is not kc:
            cfg = kc.config
            windows = [lc.policy.window for lc in cfg.layers if isinstance(lc.policy, _okv.Ring)]
            w = max(windows) if windows else 0
            keep = w + cfg.max_step - 1 if w else 0
            self._layout = (kc, cell_layout(kc), w, keep)
        return self._layout[1], self._layout[2], self._layout[3]

    # -- the generator's two calls ----------------------------------------------------------------

    def evicted(self, kc: Any, seq: int, tokens: Sequence[int]) -> int:
        """``seq`` (holding ``tokens`` from position 0) leaves the pool: saves its whole chunks
        the tier lacks, or holds without ring rows this save has. Returns chunks written. Never
        raises for the cache's refusals (a chunk it will not save ends the chain there)."""
        kc, seq, tokens = _cache(kc), _index("seq", seq), _ids("tokens", tokens)
        if self.max_bytes == 0:
            return 0
        c = self.chunk_tokens
        layout, w, keep = self._layout_of(kc)
        try:
            held = min(len(tokens), int(kc.seq_len(seq)))
            nxt = int(kc.next_pos(seq))
        except CacheError:
            return 0  # not a live sequence of kc: nothing leaves
        keys = cell_keys(self._keys, layout, tokens[: held // c * c])
        with self._lock:  # the chunks of this chain the tier holds are the last it drops
            self._touch(keys)
        written = added = 0
        for k, key in enumerate(keys):
            start, end = k * c, (k + 1) * c
            old = self._chunks.get(key)
            # A held chunk improves only by ring rows, which only the newest positions have.
            if old is not None and (w == 0 or old.ring_from == start or end <= nxt - keep):
                continue
            try:
                blob = kc.save_seq_chunk(seq, start, end)
            except CacheError:
                break  # a hole: no later chunk chains from 0
            ring_from = _ring_from(blob)
            if old is not None and ring_from >= old.ring_from:
                continue
            if added + len(blob) > self.max_bytes:
                break  # the rest of the chain cannot fit beside its head
            with self._lock:
                if old is not None:
                    self._bytes -= len(self._chunks.pop(key).blob)
                self._chunks[key] = _Chunk(blob, start, end, ring_from)
                self._bytes += len(blob)
                self._trim()  # the bound holds at every step, other chains going first
            added += len(blob)
            written += 1
        with self._lock:
            self._touch(keys)
            self._trim()
        return written

    def _chain(self, kc: Any, prompt: list[int]) -> tuple[list[str], int, int]:
        """``prompt``'s chunk keys, how many of them from 0 the tier holds, and the ring window."""
        usable = max(len(prompt) - 1, 0)
        layout, w, _ = self._layout_of(kc)
        keys = cell_keys(self._keys, layout, prompt[:usable])
        n = 0
        while n < len(keys) and keys[n] in self._chunks:
            n += 1
        return keys, n, w

    def _useful(self, prompt: list[int], live: int) -> bool:
        """Whether the tier could add to ``live`` tokens of ``prompt`` at all."""
        c = self.chunk_tokens
        return self.max_bytes > 0 and max(len(prompt) - 1, 0) // c * c > live

    def peek(self, kc: Any, prompt: Sequence[int], live: int) -> int:
        """Tokens of ``prompt`` :meth:`admit` would restore now (0: none beyond ``live``):
        the scheduler makes that room in the pool first. Changes nothing."""
        kc, prompt, live = _cache(kc), _ids("prompt", prompt), _index("live", live)
        if not self._useful(prompt, live):
            return 0
        keys, n, w = self._chain(kc, prompt)
        while n * self.chunk_tokens > live and not self._ring_complete(keys, n, w):
            n -= 1
        return n * self.chunk_tokens if n * self.chunk_tokens > live else 0

    def admit(self, kc: Any, prompt: Sequence[int], live: int) -> tuple[int | None, int]:
        """A new sequence of ``kc`` holding the longest held chain of ``prompt`` (at most
        ``len(prompt) - 1`` tokens, more than ``live``) that ends ring-complete:
        ``(seq, tokens)``, or ``(None, 0)``."""
        kc, prompt, live = _cache(kc), _ids("prompt", prompt), _index("live", live)
        c = self.chunk_tokens
        if not self._useful(prompt, live):
            return None, 0  # nothing the tier could add: not a miss
        keys, n, w = self._chain(kc, prompt)
        while n * c > live:
            if not self._ring_complete(keys, n, w):
                n -= 1
                continue
            parts = [self._chunks[k] for k in keys[:n]]
            try:
                seq = kc.load_seq_chunks([p.blob for p in parts])
            except SnapshotError:
                bad = self._drop_damaged(keys[:n])
                n = n - 1 if bad is None else bad
                continue
            except CacheError:  # no room, or every sequence id live: a miss, chunks kept
                break
            with self._lock:
                self._touch(keys[:n])
                self._counts["hits"] += 1
                self._counts["tokens_restored"] += n * c
            return int(seq), n * c
        with self._lock:
            self._counts["misses"] += 1
        return None, 0

    def _ring_complete(self, keys: list[str], n: int, w: int) -> bool:
        """Whether chunks ``keys[:n]`` carry the ring rows the step after them needs."""
        end = n * self.chunk_tokens
        lo = max(end - w + 1, 0) if w else end
        for k in range(lo // self.chunk_tokens, n):
            ch = self._chunks[keys[k]]
            if ch.ring_from > max(ch.start, lo):
                return False
        return True

    def _drop_damaged(self, keys: list[str]) -> int | None:
        """Drops the chunks of ``keys`` whose bytes fail their checks; returns the first one's
        index (a chain stops before it), ``None`` when all are intact."""
        first = None
        for k, key in enumerate(keys):
            try:
                info = _okv.snapshot_info(self._chunks[key].blob)
                ok = info["kind"] == "chunk" and info["start"] == self._chunks[key].start
            except SnapshotError:
                ok = False
            if not ok:
                with self._lock:
                    self._bytes -= len(self._chunks.pop(key).blob)
                first = k if first is None else first
        return first

    # -- LRU --------------------------------------------------------------------------------------

    def _touch(self, keys: list[str]) -> None:
        """Marks a chain used, tail first: its head ends most recent (the lock is held)."""
        for key in reversed(keys):
            if key in self._chunks:
                self._chunks.move_to_end(key)

    def _trim(self) -> None:
        while self._bytes > self.max_bytes and self._chunks:
            _, ch = self._chunks.popitem(last=False)
            self._bytes -= len(ch.blob)
            self._counts["evictions"] += 1

    def clear(self) -> None:
        """Drops every chunk (not counted as evictions)."""
        with self._lock:
            self._chunks.clear()
            self._bytes = 0

    def stats(self) -> dict[str, int]:
        """``host_cache_*``: ``bytes``, ``max_bytes``, ``chunks``, ``hits`` (admissions served),
        ``tokens_restored``, ``evictions`` (chunks dropped for room), ``misses``."""
        with self._lock:
            out = {
                "host_cache_bytes": self._bytes,
                "host_cache_max_bytes": self.max_bytes,
                "host_cache_chunks": len(self._chunks),
            }
            out.update({f"host_cache_{k}": v for k, v in self._counts.items()})
            return out
