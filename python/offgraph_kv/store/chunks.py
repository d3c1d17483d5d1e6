"""What the sequence and the cell stores share: a namespace bound to a model identity, chained
chunk keys, and batched reads and writes of chunk values through a backend.

:class:`ChunkStore` is the base of :class:`~offgraph_kv.store.PrefixStore`; the cell store's
functions (:mod:`offgraph_kv.store.cells`) take one and use only its public methods here.
"""

from __future__ import annotations

import hashlib
import struct
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import CacheError, InvalidArgumentError
from .format import HEAD_BYTES, head_complete, tokens_bytes
from .identity import identity

__all__ = ["MAX_VALUE_BYTES", "ChunkStore", "SaveResult", "StoreWarning"]

MAX_VALUE_BYTES = 512 * 1024 * 1024 - 1024
"""Redis refuses bulk strings of 512 MB; a value stays below with room to spare."""
_SCHEME = b"offgraph-kv prefix store v2"


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


class ChunkStore:
    """A backend, a chunk size and a namespace, bound to a model identity (``model``: the torch
    model, whose weights digest is computed once, here, or a ``str``/``bytes`` identity the
    caller vouches for; ``tokenizer`` adds the tokenizer's vocabulary)."""

    def __init__(
        self,
        backend: Any,
        chunk_tokens: int = 256,
        namespace: str | None = None,
        model: Any = None,
        tokenizer: Any = None,
    ):
        if int(chunk_tokens) <= 0:
            raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
        self.backend = backend
        self.chunk_tokens = int(chunk_tokens)
        self.namespace = namespace or "default"
        self.prefix = f"okv:{self.namespace}:"
        self.identity = None if model is None else identity(model, tokenizer)
        dtype = getattr(model, "dtype", None)
        self.model_dtype = dtype if type(dtype).__module__ == "torch" else None

    def root(self, layouts: Sequence[bytes]) -> bytes:
        """The key chain's root for caches of ``layouts``: scheme, chunk size, namespace, model
        identity and layouts. Refused (``InvalidArgumentError``) without a model identity."""
        if self.identity is None:
            raise InvalidArgumentError(
                "PrefixStore: no model identity; pass model= (the torch model, or a str/bytes "
                "naming its weights) so another model's rows are never served"
            )
        h = hashlib.sha256(_SCHEME + struct.pack("<Q", self.chunk_tokens))
        h.update(self.namespace.encode() + b"\0" + self.identity)
        for lay in layouts:
            h.update(struct.pack("<I", len(lay)) + lay)
        return h.digest()

    def chain_keys(self, root: bytes, tokens: Sequence[int]) -> list[str]:
        """The keys of ``tokens``' whole chunks: each chains the previous one's digest with
        the chunk's tokens, from ``root``."""
        c = self.chunk_tokens
        h, out = root, []
        for s in range(0, len(tokens) - c + 1, c):
            h = hashlib.sha256(h + tokens_bytes(tokens[s : s + c])).digest()
            out.append(self.prefix + h.hex())
        return out

    def warn(self, msg: str) -> None:
        """A :class:`StoreWarning`: what a failed backend call or a bad value became."""
        warnings.warn(f"PrefixStore: {msg}", StoreWarning, stacklevel=3)

    def drop(self, keys: Sequence[str]) -> None:
        """Deletes ``keys``, best effort (a value left behind stays a miss either way)."""
        try:
            self.backend.delete(list(keys))
        except Exception:  # noqa: BLE001 - best effort
            pass

    def get(self, keys: list[str]) -> list[Any]:
        """The values of ``keys`` (``None`` where missing), or the backend's exception in each
        slot: never raises."""
        try:
            return list(self.backend.get_many(keys))
        except Exception as e:  # noqa: BLE001 - a backend failure is reported, not raised
            return [e] * len(keys)

    def stored(self, keys: list[str]) -> list[bool | None | BaseException]:
        """Per key, from the value's flags: ``True`` stored complete, ``False`` stored
        incomplete (to be replaced when a cache holds it complete), ``None`` missing, or the
        backend's exception. The flags are trusted here; a load checks them."""
        try:
            if hasattr(self.backend, "head_many"):
                heads = list(self.backend.head_many(keys, HEAD_BYTES))
                return [
                    h if isinstance(h, BaseException) or h is None else bool(head_complete(h))
                    for h in heads
                ]
            return [
                e if isinstance(e, BaseException) else (True if e else None)
                for e in self.backend.exists_many(keys)
            ]
        except Exception as e:  # noqa: BLE001 - a backend failure is reported, not raised
            return [e] * len(keys)

    def write(
        self, keys: list[str], build: Callable[[int], tuple[bytes, bool]], what: str
    ) -> SaveResult:
        """Writes ``build(k) -> (value, complete)`` for each chunk ``k`` of ``keys`` the store
        lacks or holds incomplete where ours is complete; a ``CacheError`` from ``build`` or a
        backend's refusal is reported in ``failed`` (and warned, naming ``what``)."""
        stored = self.stored(keys)
        present = sum(1 for x in stored if x is True or x is False)
        failed: list[tuple[int, str]] = []
        items, idx = [], []
        for k, (key, st) in enumerate(zip(keys, stored)):
            if st is True:
                continue
            try:
                value, complete = build(k)
            except CacheError as e:
                failed.append((k, f"{type(e).__name__}: {e}"))
                continue
            if st is False and not complete:
                continue  # ours is no better than what is stored
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
            self.warn(f"{what} could not write {len(failed)} of {len(keys)} chunks: {failed[0][1]}")
        return SaveResult(written, failed, present)

    def stats(self) -> dict[str, int]:
        """Keys and value bytes under this store's namespace."""
        return self.backend.stats(self.prefix)

    def clear(self) -> int:
        """Deletes every key under this store's namespace; returns how many."""
        return self.backend.clear(self.prefix)
