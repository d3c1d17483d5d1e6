"""The process-global cache registry and :class:`CacheSession`.

Keys are strings; builders are keyed by the pair ``(backend_id, kind)``.
Thread-safe: the native registry holds a lock around every operation.
"""

from __future__ import annotations

from typing import Any, Callable

import offgraph_kv._native as _native  # the extension module itself, not the package

from ._errors import StepError


def install(key: str, cache: Any) -> None:
    """Store ``cache`` under ``key``. Raises ``KeyExistsError`` if taken."""
    _native.install(key, cache)


def get(key: str) -> Any:
    """The cache under ``key``. Raises ``NotFoundError``."""
    return _native.get(key)


def erase(key: str) -> None:
    """Remove ``key``. Raises ``NotFoundError``."""
    _native.erase(key)


def erase_if_same(key: str, cache: Any) -> bool:
    """Remove ``key`` only if it holds ``cache`` itself (identity), in one step under the
    registry's lock; returns whether it did. ``CacheSession`` erases its own entry this way."""
    return _native.erase_if_same(key, cache)


def contains(key: str) -> bool:
    return _native.contains(key)


def keys() -> list[str]:
    """Installed keys, sorted."""
    return _native.keys()


def unique_key(prefix: str = "cache-") -> str:
    """A key no other call in this process has returned."""
    return _native.unique_key(prefix)


def register_builder(backend_id: str, kind: str, fn: Callable[[Any], Any]) -> None:
    """Register ``fn(config) -> cache`` for ``(backend_id, kind)`` (replaces any)."""
    _native.register_builder(backend_id, kind, fn)


def build(backend_id: str, kind: str, cfg: Any) -> Any:
    """Validate ``cfg`` (``ConfigError``), then build with the registered builder
    (``NotFoundError`` when none; ``BackendError`` when the builder raises)."""
    return _native.build(backend_id, kind, cfg)


class CacheSession:
    """Installs ``cache`` on creation and erases its key on ``close()``, on
    ``with``-exit, or when garbage-collected.

    >>> with CacheSession(cache) as s:
    ...     registry.get(s.key) is cache
    """

    def __init__(self, cache: Any, key: str | None = None) -> None:
        self._key = key if key is not None else unique_key("session-")
        install(self._key, cache)
        self._cache = cache
        self._open = True

    @property
    def key(self) -> str:
        return self._key

    @property
    def cache(self) -> Any:
        if not self._open:
            raise StepError(f"session {self._key!r} is closed")
        return self._cache

    @property
    def closed(self) -> bool:
        return not self._open

    def close(self) -> None:
        """Erase the key if it still holds this session's cache (idempotent).

        A cache someone else installed under the key after this session's entry
        was erased is theirs: it stays.
        """
        if self._open:
            self._open = False
            cache, self._cache = self._cache, None
            erase_if_same(self._key, cache)

    def __enter__(self) -> CacheSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        state = "closed" if not self._open else "open"
        return f"CacheSession(key={self._key!r}, {state})"
