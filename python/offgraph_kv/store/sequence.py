"""The sequence store: :class:`PrefixStore` saves and loads the K/V of prompt prefixes of a
:class:`~offgraph_kv.KvSequenceCache` or an :class:`~offgraph_kv.hf.OffgraphCache`, chunk by
chunk (the design is in :mod:`offgraph_kv.store`); its ``save_seq``/``load_seq`` hand cell
caches to :mod:`offgraph_kv.store.cells`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _native as _okv
from .._errors import CacheError
from . import cells
from .chunks import ChunkStore, SaveResult
from .format import KIND_SEQ, check_snapshot, check_value, encode_value, layout_of

__all__ = ["PrefixStore"]

_LOOKUP_BATCH = 8


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


class PrefixStore(ChunkStore):
    """Stores and restores K/V of prompt prefixes, chunk by chunk, in a backend (see the module
    docs). ``model`` binds the keys to the weights: the torch model (its weights digest is
    computed once, here), or a ``str``/``bytes`` identity the caller vouches for (a checkpoint
    hash); ``tokenizer`` adds the tokenizer's vocabulary. ``namespace`` separates stores sharing
    a backend. A store without a model identity refuses ``save``/``load``
    (``InvalidArgumentError``); ``stats``/``clear`` need none."""

    def bind(self, model: Any, tokenizer: Any = None) -> PrefixStore:
        """This store (same backend, chunks and namespace) for ``model``; ``self`` if it is
        already bound to an identity."""
        if self.identity is not None:
            return self
        return PrefixStore(self.backend, self.chunk_tokens, self.namespace, model, tokenizer)

    def keys(self, cache: Any, token_ids: Sequence[int]) -> list[str]:
        """The keys of ``token_ids``' whole chunks for this cache's model."""
        return self.chain_keys(self.root(_layouts(_layers(cache))), [int(t) for t in token_ids])

    def save(self, cache: Any, token_ids: Sequence[int]) -> SaveResult:
        """Writes the whole chunks of ``token_ids`` that ``cache`` holds and the store lacks (or
        holds incomplete where ``cache`` has them complete)."""
        kvs = _layers(cache)
        tokens = [int(t) for t in token_ids]
        length = min(kv.length for kv in kvs) if kvs else 0
        layouts = _layouts(kvs)
        keys = self.chain_keys(self.root(layouts), tokens[:length])
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

        return self.write(keys, build, "save")

    def _lookup(
        self, keys: list[str], tokens: list[int], layouts: list[bytes]
    ) -> list[tuple[list[memoryview], bool]]:
        """``(snapshots, complete)`` of the leading run of keys that hit and pass every check;
        a value that fails one is deleted."""
        c = self.chunk_tokens
        hits: list[tuple[list[memoryview], bool]] = []
        for b in range(0, len(keys), _LOOKUP_BATCH):
            batch = keys[b : b + _LOOKUP_BATCH]
            for j, v in enumerate(self.get(batch)):
                k = b + j
                if v is None:
                    return hits
                if isinstance(v, BaseException):
                    self.warn(f"lookup of chunk {k} failed ({type(v).__name__}: {v}): a miss")
                    return hits
                s, e = k * c, (k + 1) * c
                checked = check_value(v, KIND_SEQ, s, e, tokens[s:e], layouts)
                if isinstance(checked, str):
                    self.warn(f"chunk {k} is bad ({checked}): deleted, a miss")
                    self.drop([keys[k]])
                    return hits
                hits.append(checked)
        return hits

    def load(self, cache: Any, token_ids: Sequence[int]) -> int:
        """Restores the longest stored prefix of ``token_ids`` (at most ``len - 1`` tokens) into an
        empty ``cache``; returns the tokens restored (0 on a miss or a non-empty cache).

        An :class:`~offgraph_kv.hf.OffgraphCache` whose layers have not run yet gets the pools a
        forward of the bound model would give it (its ``kv_dtype``, else the model's dtype, else
        the config's): one dtype, never a guess among several."""
        tokens = [int(t) for t in token_ids]
        usable = max(len(tokens) - 1, 0)
        if self.identity is None:
            self.root([])  # raises: no model identity
        if getattr(cache, "fresh", None) is not None and cache.fresh():
            if usable < self.chunk_tokens:
                return 0
            cache.kv_caches(model_dtype=self.model_dtype)
        try:
            restored = self._load(cache, tokens, usable)
        except CacheError as e:  # a refusal of the core is a miss, whatever it is
            self.warn(f"load refused ({type(e).__name__}: {e}): a miss")
            restored = 0
        if not restored and hasattr(cache, "drop_empty_layers"):
            cache.drop_empty_layers()
        return restored

    def _load(self, cache: Any, tokens: list[int], usable: int) -> int:
        kvs = _layers(cache)
        if not kvs or any(kv.length for kv in kvs):
            return 0
        layouts = _layouts(kvs)
        keys = self.chain_keys(self.root(layouts), tokens[:usable])
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
                    self.warn(f"chain of {n} chunks refused ({e}): trying a shorter one")
                    n -= 1
                    continue
                self.warn(f"chunk {bad} is damaged ({e}): deleted, a miss")
                self.drop([keys[bad]])
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
        holds ``token_ids`` (see :mod:`offgraph_kv.store.cells`)."""
        return cells.save_seq(self, kc, seq, token_ids)

    def load_seq(self, kc: Any, token_ids: Sequence[int]) -> tuple[int | None, int]:
        """Restores the longest stored prefix of ``token_ids`` (at most ``len - 1`` tokens) as a
        new sequence of ``kc``: ``(seq_id, tokens)``, or ``(None, 0)`` on a miss."""
        return cells.load_seq(self, kc, token_ids)

    def __repr__(self) -> str:
        return (
            f"PrefixStore({self.backend!r}, chunk_tokens={self.chunk_tokens}, "
            f"namespace={self.namespace!r}, bound={self.identity is not None})"
        )
