"""Where the prefix store keeps its values: an in-process LRU or Redis (single or cluster).

A backend maps string keys to bytes values and answers in batches: ``get_many``,
``head_many`` (a value's first bytes), ``exists_many``, ``set_many``, ``delete``, plus ``stats`` and
``clear`` over a key prefix. A failed operation comes back as an exception object in its slot
(never raised), so the store can treat it as a miss.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlparse

__all__ = ["MemoryBackend", "RedisBackend"]


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

    def head_many(self, keys: Sequence[str], n: int) -> list[bytes | None]:
        """The first ``n`` bytes of each value (``None`` where a key is missing)."""
        with self._lock:
            return [None if (v := self._data.get(k)) is None else v[:n] for k in keys]

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

    def head_many(self, keys: Sequence[str], n: int) -> list[bytes | BaseException | None]:
        """The first ``n`` bytes of each value (``None`` where a key is missing): ``GETRANGE``,
        so checking what a chunk holds does not move the chunk."""
        res = self._pipeline([("getrange", (k, 0, n - 1)) for k in keys])
        return [None if r == b"" else r for r in res]

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
