"""A prefix store: K/V of shared prompt prefixes kept outside the process, in memory or Redis.

Usage::

    from offgraph_kv.store import PrefixStore, RedisBackend

    store = PrefixStore(RedisBackend("redis://127.0.0.1:6379/0"), model=model)
    cache = OffgraphCache(model.config)
    n = store.load(cache, prompt_ids)          # tokens restored (at most len - 1)
    out = model.generate(prompt, cache=cache, ...)   # prefills the rest only
    store.save(cache, prompt_ids)              # chunks written

Design
------
* **Chunks and keys.** A prompt is cut into chunks of ``chunk_tokens``; only whole chunks are
  stored. Chunk ``k``'s key is ``okv:<namespace>:<hex>`` where the hex is a chained SHA-256:
  ``h_0 = SHA-256(scheme, chunk_tokens, namespace, model identity, layout)`` and
  ``h_k+1 = SHA-256(h_k, chunk k's tokens as int64)``. The model identity is a digest of the
  weights (every parameter's name, shape, dtype and a strided sample of its bytes, see
  :mod:`offgraph_kv.store_identity`) and of the tokenizer where given; the layout is every
  layer's snapshot fingerprint (policy, window, heads, head_dim, pool dtypes, row bytes). Two
  checkpoints of one shape never share a key, and a cache loads only rows of its own pool dtypes.
* **Values** (:mod:`offgraph_kv.store_format`): the chunk's kind, range and tokens, one snapshot
  per layer cache, a CRC-32 over the header; each snapshot carries its own CRC-32, checked by the
  core as it loads (one checksum pass over the rows). A value is accepted only if its header
  checksum, version, range, tokens, and every snapshot's layout and range are its key's chunk's;
  anything else is a miss and the value is deleted (a hash collision becomes a miss, never a
  wrong row). A value the core refuses as damaged is deleted too.
* **Ring layers.** A chunk carries what its sliding layers still held when it was saved: an early
  chunk of a long prompt may lack the sliding tail (the ring overwrote it) and is stored marked
  incomplete. Such a chunk loads only inside a chain whose later chunks carry that tail; ``load``
  picks the longest chain ending on a complete chunk, and a ``save`` that holds the chunk complete
  replaces an incomplete one (so a cache that saves as it prefills heals the store).
* **One dtype.** An :class:`~offgraph_kv.hf.OffgraphCache` that has not run yet takes the pools
  a forward of the bound model would give it (the ``kv_dtype`` asked for, else the model's
  dtype): the store never tries another dtype.
* **Loading.** ``load`` looks keys up in pipelined batches, stopping at the first miss, restores
  the longest stored prefix that leaves at least one prompt token to compute (so ``generate``
  prefills the rest), all layers or none. An unreachable server, a lost cluster node, a bad value
  or any refusal of the core is a miss with a warning: ``load`` never raises for what a backend
  returns.
* **Saving.** ``save`` writes the chunks the store lacks (or holds incomplete where this cache
  has them complete) and returns how many it wrote, an ``int`` that also carries ``.failed``
  (chunk index and reason for each chunk it could not write) and ``.present`` (chunks already
  stored). Values stay under Redis's 512 MB bulk limit.
* **Cell caches** (:mod:`offgraph_kv.store_cells`): ``save_seq``/``load_seq`` store a
  :class:`~offgraph_kv.KvCellCache` sequence's prefixes, which
  :class:`~offgraph_kv.hf.BatchGenerator` uses with ``store=``.
"""

from __future__ import annotations

import hashlib
import struct
import warnings
from collections.abc import Sequence
from typing import Any

from . import _native as _okv
from ._errors import CacheError, InvalidArgumentError
from .store_backends import MemoryBackend, RedisBackend
from .store_format import (
    HEAD_BYTES,
    KIND_SEQ,
    check_snapshot,
    claims_complete,
    decode_value,
    encode_value,
    head_complete,
    layout_of,
    tokens_bytes,
)
from .store_identity import identity

__all__ = [
    "MAX_VALUE_BYTES",
    "MemoryBackend",
    "PrefixStore",
    "RedisBackend",
    "SaveResult",
    "StoreWarning",
]

MAX_VALUE_BYTES = 512 * 1024 * 1024 - 1024
"""Redis refuses bulk strings of 512 MB; a value stays below with room to spare."""
_SCHEME = b"offgraph-kv prefix store v2"
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


def _layouts(kvs: Sequence[Any]) -> list[bytes]:
    """Each layer cache's layout bytes (from a snapshot of no positions)."""
    return [layout_of(kv.save_state(0)) for kv in kvs]


class PrefixStore:
    """Stores and restores K/V of prompt prefixes, chunk by chunk, in a backend (see the module
    docs). ``model`` binds the keys to the weights: the torch model (its weights digest is
    computed once, here), or a ``str``/``bytes`` identity the caller vouches for (a checkpoint
    hash); ``tokenizer`` adds the tokenizer's vocabulary. ``namespace`` separates stores sharing
    a backend. A store without a model identity refuses ``save``/``load``
    (``InvalidArgumentError``); ``stats``/``clear`` need none."""

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

    def bind(self, model: Any, tokenizer: Any = None) -> PrefixStore:
        """This store (same backend, chunks and namespace) for ``model``; ``self`` if it is
        already bound to an identity."""
        if self.identity is not None:
            return self
        return PrefixStore(self.backend, self.chunk_tokens, self.namespace, model, tokenizer)

    def _root(self, layouts: Sequence[bytes]) -> bytes:
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

    def keys(self, cache: Any, token_ids: Sequence[int]) -> list[str]:
        """The keys of ``token_ids``' whole chunks for this cache's model."""
        return self._keys(self._root(_layouts(_layers(cache))), [int(t) for t in token_ids])

    def _keys(self, root: bytes, tokens: list[int]) -> list[str]:
        c = self.chunk_tokens
        h, out = root, []
        for s in range(0, len(tokens) - c + 1, c):
            h = hashlib.sha256(h + tokens_bytes(tokens[s : s + c])).digest()
            out.append(self.prefix + h.hex())
        return out

    def _warn(self, msg: str) -> None:
        warnings.warn(f"PrefixStore: {msg}", StoreWarning, stacklevel=3)

    def _drop(self, keys: Sequence[str]) -> None:
        try:
            self.backend.delete(list(keys))
        except Exception:  # noqa: BLE001 - best effort: the value stays a miss either way
            pass

    def _stored(self, keys: list[str]) -> list[bool | None | BaseException]:
        """Per key: ``True`` stored complete, ``False`` stored incomplete (to be replaced when
        this cache holds it complete), ``None`` missing, or the backend's exception."""
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

    def _write(self, keys: list[str], build: Any, what: str) -> SaveResult:
        """Writes ``build(k) -> (value, complete)`` for each chunk ``k`` the store lacks or holds
        incomplete where ours is complete."""
        stored = self._stored(keys)
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
            self._warn(
                f"{what} could not write {len(failed)} of {len(keys)} chunks: {failed[0][1]}"
            )
        return SaveResult(written, failed, present)

    def save(self, cache: Any, token_ids: Sequence[int]) -> SaveResult:
        """Writes the whole chunks of ``token_ids`` that ``cache`` holds and the store lacks (or
        holds incomplete where ``cache`` has them complete)."""
        kvs = _layers(cache)
        tokens = [int(t) for t in token_ids]
        length = min(kv.length for kv in kvs) if kvs else 0
        layouts = _layouts(kvs)
        keys = self._keys(self._root(layouts), tokens[:length])
        if not keys:
            return SaveResult(0, [], 0)
        c = self.chunk_tokens

        def build(k: int) -> tuple[bytes, bool]:
            s, e = k * c, (k + 1) * c
            snaps = [kv.save_state(e, start=s) for kv in kvs]
            complete = all(
                check_snapshot(memoryview(b), lay, KIND_SEQ, s, e) is True
                for b, lay in zip(snaps, layouts)
            )
            return encode_value(KIND_SEQ, s, e, tokens[s:e], snaps, complete), complete

        return self._write(keys, build, "save")

    def _get(self, keys: list[str]) -> list[Any]:
        try:
            return list(self.backend.get_many(keys))
        except Exception as e:  # noqa: BLE001
            return [e] * len(keys)

    def _lookup(
        self, keys: list[str], tokens: list[int], layouts: list[bytes]
    ) -> list[tuple[list[memoryview], bool]]:
        """``(snapshots, complete)`` of the leading run of keys that hit and pass every check;
        a value that fails one is deleted."""
        c = self.chunk_tokens
        hits: list[tuple[list[memoryview], bool]] = []
        for b in range(0, len(keys), _LOOKUP_BATCH):
            batch = keys[b : b + _LOOKUP_BATCH]
            for j, v in enumerate(self._get(batch)):
                k = b + j
                if v is None:
                    return hits
                if isinstance(v, BaseException):
                    self._warn(f"lookup of chunk {k} failed ({type(v).__name__}: {v}): a miss")
                    return hits
                s, e = k * c, (k + 1) * c
                checked = self._check(v, KIND_SEQ, s, e, tokens[s:e], layouts)
                if isinstance(checked, str):
                    self._warn(f"chunk {k} is bad ({checked}): deleted, a miss")
                    self._drop([keys[k]])
                    return hits
                hits.append(checked)
        return hits

    @staticmethod
    def _check(
        value: Any, kind: int, s: int, e: int, tokens: list[int], layouts: list[bytes]
    ) -> tuple[list[memoryview], bool] | str:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            return f"the backend returned {type(value).__name__}, not bytes"
        snaps = decode_value(value, kind, s, e, tokens_bytes(tokens), len(layouts))
        if isinstance(snaps, str):
            return snaps
        complete = True
        for i, (snap, lay) in enumerate(zip(snaps, layouts)):
            ok = check_snapshot(snap, lay, kind, s, e)
            if isinstance(ok, str):
                return f"layer cache {i}: {ok}"
            complete = complete and ok
        if claims_complete(value) and not complete:
            # A save reads only the flags: a lie there would never be replaced.
            return "its flags claim complete, its snapshots are not"
        return snaps, complete

    def load(self, cache: Any, token_ids: Sequence[int]) -> int:
        """Restores the longest stored prefix of ``token_ids`` (at most ``len - 1`` tokens) into an
        empty ``cache``; returns the tokens restored (0 on a miss or a non-empty cache).

        An :class:`~offgraph_kv.hf.OffgraphCache` whose layers have not run yet gets the pools a
        forward of the bound model would give it (its ``kv_dtype``, else the model's dtype, else
        the config's): one dtype, never a guess among several."""
        tokens = [int(t) for t in token_ids]
        usable = max(len(tokens) - 1, 0)
        if self.identity is None:
            self._root([])  # raises: no model identity
        if getattr(cache, "fresh", None) is not None and cache.fresh():
            if usable < self.chunk_tokens:
                return 0
            cache.kv_caches(model_dtype=self.model_dtype)
        try:
            restored = self._load(cache, tokens, usable)
        except CacheError as e:  # a refusal of the core is a miss, whatever it is
            self._warn(f"load refused ({type(e).__name__}: {e}): a miss")
            restored = 0
        if not restored and hasattr(cache, "drop_empty_layers"):
            cache.drop_empty_layers()
        return restored

    def _load(self, cache: Any, tokens: list[int], usable: int) -> int:
        kvs = _layers(cache)
        if not kvs or any(kv.length for kv in kvs):
            return 0
        layouts = _layouts(kvs)
        keys = self._keys(self._root(layouts), tokens[:usable])
        if not keys:
            return 0
        return self._restore(kvs, keys, self._lookup(keys, tokens, layouts))

    def _restore(
        self, kvs: Sequence[Any], keys: list[str], hits: list[tuple[list[memoryview], bool]]
    ) -> int:
        # Longest chain first; the core refuses a chain whose ring tail has a hole.
        n = len(hits)
        while n > 0:
            if not hits[n - 1][1]:
                n -= 1
                continue
            try:
                for i, kv in enumerate(kvs):
                    kv.load_state([hits[k][0][i] for k in range(n)])
                return n * self.chunk_tokens
            except CacheError as e:
                for kv in kvs:
                    kv.clear()
                bad = self._damaged(hits[:n])
                if bad is None:
                    self._warn(f"chain of {n} chunks refused ({e}): trying a shorter one")
                    n -= 1
                    continue
                self._warn(f"chunk {bad} is damaged ({e}): deleted, a miss")
                self._drop([keys[bad]])
                n = bad
        return 0

    @staticmethod
    def _damaged(hits: list[tuple[list[memoryview], bool]]) -> int | None:
        """The first chunk holding a snapshot the core does not read (checksum and all)."""
        for k, (snaps, _) in enumerate(hits):
            for snap in snaps:
                try:
                    _okv.snapshot_info(snap)
                except CacheError:
                    return k
        return None

    def save_seq(self, kc: Any, seq: int, token_ids: Sequence[int]) -> SaveResult:
        """Writes the whole-chunk prefixes of a :class:`~offgraph_kv.KvCellCache` sequence that
        holds ``token_ids`` (see :mod:`offgraph_kv.store_cells`)."""
        from .store_cells import save_seq

        return save_seq(self, kc, seq, token_ids)

    def load_seq(self, kc: Any, token_ids: Sequence[int]) -> tuple[int | None, int]:
        """Restores the longest stored prefix of ``token_ids`` (at most ``len - 1`` tokens) as a
        new sequence of ``kc``: ``(seq_id, tokens)``, or ``(None, 0)`` on a miss."""
        from .store_cells import load_seq

        return load_seq(self, kc, token_ids)

    def stats(self) -> dict[str, int]:
        """Keys and value bytes under this store's namespace."""
        return self.backend.stats(self.prefix)

    def clear(self) -> int:
        """Deletes every key under this store's namespace; returns how many."""
        return self.backend.clear(self.prefix)

    def __repr__(self) -> str:
        return (
            f"PrefixStore({self.backend!r}, chunk_tokens={self.chunk_tokens}, "
            f"namespace={self.namespace!r}, bound={self.identity is not None})"
        )
