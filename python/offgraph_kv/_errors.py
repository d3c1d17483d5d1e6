"""The exception tree. Every error the native module raises is one of these.

Each class derives from :class:`CacheError` and from the closest built-in, so
``except ValueError`` and ``except okv.CacheError`` both work.
"""

from __future__ import annotations


class CacheError(Exception):
    """Base of every offgraph-kv error."""

    def __str__(self) -> str:  # KeyError would quote the message; keep it plain
        return str(self.args[0]) if self.args else ""


class ConfigError(CacheError, ValueError):
    """A configuration field is out of range or inconsistent."""


class InvalidArgumentError(CacheError, ValueError):
    """An argument is out of range: a layer, a token count, a rewind target."""


class ShapeError(InvalidArgumentError):
    """An array has the wrong rank or shape."""


class DTypeError(CacheError, TypeError):
    """An argument has the wrong type or an array the wrong dtype."""


class NotFoundError(CacheError, KeyError):
    """A key or builder that is not there."""


class KeyExistsError(CacheError, KeyError):
    """A registry key that is already taken."""


class CapacityError(CacheError, RuntimeError):
    """Not enough room: capacity, free cells, sequence ids."""


class StepError(CacheError, RuntimeError):
    """The step protocol was misused (no open step, a rewrite, a stale spec)."""


class UnknownSequenceError(CacheError, KeyError):
    """A sequence id the cache did not hand out (ids are unique in the process, so
    another cache's id is refused too), or one already freed."""


class BackendError(CacheError, RuntimeError):
    """An attention backend (XNNPACK) failed."""


class SnapshotError(CacheError, ValueError):
    """A snapshot that cannot be loaded: truncated, damaged, foreign, newer, or not continuing."""


class EngineError(CacheError, ValueError):
    """The native engine cannot run a file: not a well-formed GGUF (truncated, a hostile header),
    an unsupported architecture, tensor type or tokenizer, or a model missing what it needs."""


__all__ = [
    "CacheError",
    "ConfigError",
    "InvalidArgumentError",
    "ShapeError",
    "DTypeError",
    "NotFoundError",
    "KeyExistsError",
    "CapacityError",
    "StepError",
    "UnknownSequenceError",
    "BackendError",
    "SnapshotError",
    "EngineError",
]
