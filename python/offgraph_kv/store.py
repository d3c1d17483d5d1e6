"""A prefix store: K/V of shared prompt prefixes kept outside the process, in memory or Redis.

Usage::

    from offgraph_kv.store import PrefixStore, RedisBackend

    store = PrefixStore(RedisBackend("redis://127.0.0.1:6379/0"))
    cache = OffgraphCache(model.config)
    n = store.load(cache, prompt_ids)          # tokens restored (at most len - 1)
    out = model.generate(prompt, cache=cache, ...)   # prefills the rest only
    store.save(cache, prompt_ids)              # chunks written

Design
------
* **Chunks and keys.** A prompt is cut into chunks of ``chunk_tokens``; only whole chunks are
  stored. Chunk ``k``'s key is ``okv:<namespace>:<hex>`` where the hex is a chained SHA-256:
  ``h_0 = SHA-256(scheme, chunk_tokens, namespace, model fingerprint)`` and
  ``h_k+1 = SHA-256(h_k, chunk k's tokens as int64)``. The model fingerprint is every layer's
  snapshot fingerprint (policy, window, heads, head_dim, dtypes, row bytes), so caches of another
  model or layout never share keys.
* **Values.** One value per chunk: ``b"OKVCHUNK"``, a version, the chunk's tokens, one snapshot
  range per cache layer (``KvSequenceCache.save_state(upto=end, start=start)``), and a CRC-32 over
  all of it. Each snapshot carries its own CRC-32 and fingerprint, checked again by the core. A
  value whose magic, version, tokens, layer count or checksum is wrong is a miss and is deleted
  (a hash collision becomes a miss, never a wrong row).
* **Ring layers.** A chunk carries what its sliding layers still held when it was saved: an early
  chunk of a long prompt may lack the sliding tail (the ring overwrote it). Such a chunk loads only
  as part of a chain whose later chunks carry that tail; the core computes what every ring layer
  holds after the chain and refuses a chain with a hole, and ``load`` then tries a shorter one.
* **Loading.** ``load`` looks keys up in pipelined batches, stopping at the first miss, restores
  the longest stored prefix that leaves at least one prompt token to compute (so ``generate``
  prefills the rest), all layers or none. An unreachable server, a lost cluster node or a bad
  value is a miss with a warning: ``load`` never raises for them.
* **Saving.** ``save`` writes the chunks the store lacks and returns how many it wrote, an
  ``int`` that also carries ``.failed`` (chunk index and reason for each chunk it could not
  write) and ``.present`` (chunks already stored). Values stay under Redis's 512 MB bulk limit.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlparse

from . import _native as _okv
from ._errors import SnapshotError

__all__ = [
    "MAX_VALUE_BYTES",
    "MemoryBackend",
    "PrefixStore",
    "RedisBackend",
    "SaveResult",
    "StoreWarning",
]

VALUE_MAGIC = b"OKVCHUNK"
VALUE_VERSION = 1
MAX_VALUE_BYTES = 512 * 1024 * 1024 - 1024
"""Redis refuses bulk strings of 512 MB; a value stays below with room to spare."""
_SCHEME = b"offgraph-kv prefix store v1"
_LOOKUP_BATCH = 8


class StoreWarning(UserWarning):
    """A backend failed (unreachable, a lost node) or a stored value was bad: a miss."""


class SaveResult(int):
    """Chunks written; ``failed`` lists ``(chunk, reason)`` for chunks not written, ``present``
    counts chunks the store already held."""

    failed: list[tuple[int, str]]
    present: int

    def __new__(cls, written: int, failed: list[tuple[int, str]], present: int) -> SaveResult:
        obj = super().__new__(cls, written)
        obj.failed = failed
        obj.present = present
        return obj

    def __repr__(self) -> str:
        return f"SaveResult(written={int(self)}, present={self.present}, failed={self.failed})"


# -- backends ------------------------------------------------------------------------------------


class MemoryBackend:
    """An in-process LRU of values, bounded by ``max_bytes`` (keys and values counted)."""

    def __init__(self, max_bytes: int = 1 << 30):
        if int(max_bytes) <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._data: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        with self._lock:
            for k in keys:
                v = self._data.get(k)
                if v is not None:
                    self._data.move_to_end(k)
                out.append(v)
        return out

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        with self._lock:
            return [k in self._data for k in keys]

    def set_many(self, items: Sequence[tuple[str, bytes]]) -> list[str | None]:
        """Stores each item; returns per item ``None`` or why it was not stored."""
        out: list[str | None] = []
        with self._lock:
            for k, v in items:
                size = len(k) + len(v)
                if size > self.max_bytes:
                    out.append(f"{size} bytes exceed max_bytes {self.max_bytes}")
                    continue
                old = self._data.pop(k, None)
                if old is not None:
                    self._bytes -= len(k) + len(old)
                while self._data and self._bytes + size > self.max_bytes:
                    ok, ov = self._data.popitem(last=False)
                    self._bytes -= len(ok) + len(ov)
                self._data[k] = bytes(v)
                self._bytes += size
                out.append(None)
        return out

    def delete(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                v = self._data.pop(k, None)
                if v is not None:
                    self._bytes -= len(k) + len(v)

    def stats(self, prefix: str = "okv:") -> dict[str, int]:
        with self._lock:
            sizes = [len(v) for k, v in self._data.items() if k.startswith(prefix)]
        return {"keys": len(sizes), "bytes": sum(sizes)}

    def clear(self, prefix: str = "okv:") -> int:
        with self._lock:
            keys = [k for k in self._data if k.startswith(prefix)]
        self.delete(keys)
        return len(keys)

    def __repr__(self) -> str:
        return f"MemoryBackend(max_bytes={self.max_bytes}, used={self._bytes})"


class RedisBackend:
    """Redis (``redis://host:port/db``) or Redis Cluster (``redis-cluster://host:port[,host:port]``)
    through redis-py. Connections are made on first use; ``timeout`` bounds every socket wait, so
    an unreachable server or a lost node turns into an error the store reports as a miss."""

    def __init__(self, url: str, timeout: float = 2.0, ttl: int | None = None):
        parsed = urlparse(url)
        if parsed.scheme not in ("redis", "rediss", "redis-cluster"):
            raise ValueError(f"RedisBackend: expected redis:// or redis-cluster://, got {url!r}")
        self.url = url
        self.cluster = parsed.scheme == "redis-cluster"
        self.timeout = float(timeout)
        self.ttl = ttl
        self._client: Any = None
        self._lock = threading.Lock()

    def _conn(self) -> Any:
        with self._lock:
            if self._client is None:
                import redis

                if self.cluster:
                    from redis.cluster import ClusterNode, RedisCluster

                    netloc = urlparse(self.url).netloc
                    nodes = []
                    for hp in netloc.split(","):
                        host, _, port = hp.rpartition(":")
                        nodes.append(ClusterNode(host or "127.0.0.1", int(port or 6379)))
                    self._client = RedisCluster(
                        startup_nodes=nodes,
                        socket_timeout=self.timeout,
                        socket_connect_timeout=self.timeout,
                    )
                else:
                    self._client = redis.Redis.from_url(
                        self.url,
                        socket_timeout=self.timeout,
                        socket_connect_timeout=self.timeout,
                    )
            return self._client

    def _reset(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken client
                pass

    def _pipeline(self, ops: Sequence[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Runs ``ops`` in one pipeline; per op the result or the exception it raised."""
        pipe = self._conn().pipeline(transaction=False)
        for name, args in ops:
            getattr(pipe, name)(*args)
        try:
            return list(pipe.execute(raise_on_error=False))
        except Exception as e:  # noqa: BLE001 - a whole-pipeline failure fails every op
            self._reset()
            return [e] * len(ops)

    def get_many(self, keys: Sequence[str]) -> list[bytes | BaseException | None]:
        return self._pipeline([("get", (k,)) for k in keys])

    def exists_many(self, keys: Sequence[str]) -> list[bool | BaseException]:
        res = self._pipeline([("exists", (k,)) for k in keys])
        return [r if isinstance(r, BaseException) else bool(r) for r in res]

    def set_many(self, items: Sequence[tuple[str, bytes]]) -> list[str | None]:
        ops = []
        for k, v in items:
            ops.append(("set", (k, v) if self.ttl is None else (k, v, self.ttl)))
        res = self._pipeline(ops)
        return [f"{type(r).__name__}: {r}" if isinstance(r, BaseException) else None for r in res]

    def delete(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        if keys:
            self._pipeline([("delete", (k,)) for k in keys])

    def _scan(self, prefix: str) -> list[str]:
        client = self._conn()
        return [k.decode() if isinstance(k, bytes) else k for k in client.scan_iter(f"{prefix}*")]

    def stats(self, prefix: str = "okv:") -> dict[str, int]:
        keys = self._scan(prefix)
        sizes = self._pipeline([("strlen", (k,)) for k in keys]) if keys else []
        return {"keys": len(keys), "bytes": sum(s for s in sizes if isinstance(s, int))}

    def clear(self, prefix: str = "okv:") -> int:
        keys = self._scan(prefix)
        self.delete(keys)
        return len(keys)

    def close(self) -> None:
        self._reset()

    def __repr__(self) -> str:
        return f"RedisBackend({self.url!r})"


# -- values --------------------------------------------------------------------------------------


def _tokens_bytes(tokens: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(tokens)}q", *(int(t) for t in tokens))


def encode_value(tokens: Sequence[int], blobs: Sequence[bytes]) -> bytes:
    """One chunk's value: magic, version, tokens, one snapshot per layer, CRC-32."""
    parts = [VALUE_MAGIC, struct.pack("<HI", VALUE_VERSION, len(tokens)), _tokens_bytes(tokens)]
    parts.append(struct.pack("<I", len(blobs)))
    for b in blobs:
        parts.append(struct.pack("<Q", len(b)))
        parts.append(b)
    body = b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def decode_value(value: bytes, tokens: Sequence[int], n_layers: int) -> list[memoryview] | str:
    """The per-layer snapshots of a value for ``tokens``, or why it does not fit."""
    mv = memoryview(value)
    if len(mv) < 22 or bytes(mv[:8]) != VALUE_MAGIC:
        return "not a chunk value"
    if zlib.crc32(mv[:-4]) != struct.unpack_from("<I", mv, len(mv) - 4)[0]:
        return "checksum mismatch"
    version, n_tok = struct.unpack_from("<HI", mv, 8)
    if version != VALUE_VERSION:
        return f"version {version}, this build reads {VALUE_VERSION}"
    at = 14
    if n_tok != len(tokens) or bytes(mv[at : at + 8 * n_tok]) != _tokens_bytes(tokens):
        return "tokens differ (a hash collision)"
    at += 8 * n_tok
    (n_blobs,) = struct.unpack_from("<I", mv, at)
    at += 4
    if n_blobs != n_layers:
        return f"{n_blobs} layers, the cache has {n_layers}"
    blobs = []
    end = len(mv) - 4
    for _ in range(n_blobs):
        if at + 8 > end:
            return "truncated"
        (n,) = struct.unpack_from("<Q", mv, at)
        at += 8
        if at + n > end:
            return "truncated"
        blobs.append(mv[at : at + n])
        at += n
    if at != end:
        return "trailing bytes"
    return blobs


# -- the store -----------------------------------------------------------------------------------


def torch_dtype(name: str) -> Any:
    """The torch dtype of that name (torch is imported only for an OffgraphCache)."""
    import torch

    return getattr(torch, name)


def _layers(cache: Any) -> list[Any]:
    """The KvSequenceCaches behind ``cache``, in layer order."""
    if isinstance(cache, _okv.KvSequenceCache):
        return [cache]
    kv_caches = getattr(cache, "kv_caches", None)
    if kv_caches is not None:
        return [c for c in kv_caches() if c is not None]
    raise TypeError(
        f"PrefixStore: expected a KvSequenceCache or an OffgraphCache, got {type(cache).__name__}"
    )


def _fingerprint(kvs: Sequence[Any]) -> bytes:
    """Every layer's snapshot fingerprint (the header of an empty snapshot, minus the magic)."""
    h = hashlib.sha256()
    for kv in kvs:
        empty = kv.save_state(0)
        n_layers = struct.unpack_from("<I", empty, 12)[0]
        h.update(empty[8 : 16 + 27 * n_layers])
    return h.digest()


class PrefixStore:
    """Stores and restores K/V of prompt prefixes, chunk by chunk, in a backend (see the module
    docs). ``namespace`` separates stores sharing a backend (e.g. per model revision)."""

    def __init__(self, backend: Any, chunk_tokens: int = 256, namespace: str | None = None):
        if int(chunk_tokens) <= 0:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
        self.backend = backend
        self.chunk_tokens = int(chunk_tokens)
        self.namespace = namespace or "default"
        self.prefix = f"okv:{self.namespace}:"

    def keys(self, cache: Any, token_ids: Sequence[int]) -> list[str]:
        """The keys of ``token_ids``' whole chunks for this cache's model."""
        return self._keys(_fingerprint(_layers(cache)), [int(t) for t in token_ids])

    def _keys(self, fp: bytes, tokens: list[int]) -> list[str]:
        c = self.chunk_tokens
        h = hashlib.sha256(
            _SCHEME + struct.pack("<Q", c) + self.namespace.encode() + b"\0" + fp
        ).digest()
        out = []
        for s in range(0, len(tokens) - c + 1, c):
            h = hashlib.sha256(h + _tokens_bytes(tokens[s : s + c])).digest()
            out.append(self.prefix + h.hex())
        return out

    def _warn(self, msg: str) -> None:
        warnings.warn(f"PrefixStore: {msg}", StoreWarning, stacklevel=3)

    def save(self, cache: Any, token_ids: Sequence[int]) -> SaveResult:
        """Writes the whole chunks of ``token_ids`` that ``cache`` holds and the store lacks."""
        kvs = _layers(cache)
        tokens = [int(t) for t in token_ids]
        length = min(kv.length for kv in kvs) if kvs else 0
        keys = self._keys(_fingerprint(kvs), tokens[:length])
        if not keys:
            return SaveResult(0, [], 0)
        failed: list[tuple[int, str]] = []
        try:
            exists = list(self.backend.exists_many(keys))
        except Exception as e:  # noqa: BLE001 - a backend failure is reported, not raised
            exists = [e] * len(keys)
        present = sum(1 for x in exists if x is True)
        c = self.chunk_tokens
        items, idx = [], []
        for k, (key, ex) in enumerate(zip(keys, exists)):
            if ex is True:
                continue
            s, e = k * c, (k + 1) * c
            blobs = [kv.save_state(e, start=s) for kv in kvs]
            value = encode_value(tokens[s:e], blobs)
            if len(value) > MAX_VALUE_BYTES:
                failed.append(
                    (k, f"value of {len(value)} bytes is over the limit; lower chunk_tokens")
                )
                continue
            items.append((key, value))
            idx.append(k)
        if items:
            try:
                errs = list(self.backend.set_many(items))
            except Exception as e:  # noqa: BLE001
                errs = [f"{type(e).__name__}: {e}"] * len(items)
            failed.extend((k, err) for k, err in zip(idx, errs) if err is not None)
        failed.sort()
        written = len(items) - sum(1 for k, _ in failed if k in idx)
        if failed:
            self._warn(f"save could not write {len(failed)} of {len(keys)} chunks: {failed[0][1]}")
        return SaveResult(written, failed, present)

    def _lookup(self, keys: list[str], tokens: list[int], n_layers: int) -> list[list[memoryview]]:
        """Values of the leading run of keys that hit and pass every check."""
        c = self.chunk_tokens
        hits: list[list[memoryview]] = []
        for b in range(0, len(keys), _LOOKUP_BATCH):
            batch = keys[b : b + _LOOKUP_BATCH]
            try:
                values = list(self.backend.get_many(batch))
            except Exception as e:  # noqa: BLE001
                values = [e] * len(batch)
            for j, v in enumerate(values):
                k = b + j
                if v is None:
                    return hits
                if isinstance(v, BaseException):
                    self._warn(f"lookup of chunk {k} failed ({type(v).__name__}: {v}): a miss")
                    return hits
                blobs = decode_value(v, tokens[k * c : (k + 1) * c], n_layers)
                if isinstance(blobs, str):
                    self._warn(f"chunk {k} is bad ({blobs}): deleted, a miss")
                    try:
                        self.backend.delete([keys[k]])
                    except Exception:  # noqa: BLE001 - best effort
                        pass
                    return hits
                hits.append(blobs)
        return hits

    def load(self, cache: Any, token_ids: Sequence[int]) -> int:
        """Restores the longest stored prefix of ``token_ids`` (at most ``len - 1`` tokens) into an
        empty ``cache``; returns the tokens restored (0 on a miss or a non-empty cache).

        An :class:`~offgraph_kv.hf.OffgraphCache` whose layers have not run yet does not know the
        model's dtype, which its pools (and so the keys) depend on: the store tries the config's
        dtype, then float32, bfloat16 and float16, and keeps the first that hits."""
        if getattr(cache, "fresh", None) is not None and cache.fresh():
            for dtype in (
                None,
                torch_dtype("float32"),
                torch_dtype("bfloat16"),
                torch_dtype("float16"),
            ):
                cache.kv_caches(model_dtype=dtype)
                restored = self._load(cache, token_ids)
                if restored:
                    return restored
            return 0
        return self._load(cache, token_ids)

    def _load(self, cache: Any, token_ids: Sequence[int]) -> int:
        kvs = _layers(cache)
        tokens = [int(t) for t in token_ids]
        if not kvs or any(kv.length for kv in kvs):
            return 0
        usable = max(len(tokens) - 1, 0)
        keys = self._keys(_fingerprint(kvs), tokens[:usable])
        if not keys:
            if hasattr(cache, "drop_empty_layers"):
                cache.drop_empty_layers()
            return 0
        restored = self._restore(kvs, self._lookup(keys, tokens, len(kvs)))
        if not restored and hasattr(cache, "drop_empty_layers"):
            cache.drop_empty_layers()
        return restored

    def _restore(self, kvs: Sequence[Any], hits: list[list[memoryview]]) -> int:
        # Try the longest chain first; the core refuses a chain whose ring tail has a hole.
        for n in range(len(hits), 0, -1):
            if not all(_okv.snapshot_info(b)["complete"] for b in hits[n - 1]):
                continue
            try:
                for i, kv in enumerate(kvs):
                    kv.load_state([hits[k][i] for k in range(n)])
            except SnapshotError:
                for kv in kvs:
                    kv.clear()
                continue
            return n * self.chunk_tokens
        return 0

    def stats(self) -> dict[str, int]:
        """Keys and value bytes under this store's namespace."""
        return self.backend.stats(self.prefix)

    def clear(self) -> int:
        """Deletes every key under this store's namespace; returns how many."""
        return self.backend.clear(self.prefix)

    def __repr__(self) -> str:
        return (
            f"PrefixStore({self.backend!r}, chunk_tokens={self.chunk_tokens}, "
            f"namespace={self.namespace!r})"
        )
