"""The prefix store for :class:`~offgraph_kv.KvCellCache` sequences, and the two calls
:class:`~offgraph_kv.hf.BatchGenerator` makes with ``store=``.

A cell sequence's chunk ``k`` is stored as the whole prefix ``[0, (k + 1) * chunk_tokens)``: one
``kc.save_seq(seq, upto=end)`` snapshot (the core saves a cell sequence from position 0 only).
So a load is one value and one ``load_seq``, and a prompt of ``n`` chunks stores
``n (n + 1) / 2`` chunks' rows: the cost of having no range start for cell snapshots. Keys chain
like the sequence store's, over a root that names the cell layout, so cell and sequence values
never share a key. A value is accepted only if its tokens, kind, layout and held range
(exactly ``[0, end)``) are its key's. One the core refuses for its contents (``SnapshotError``:
a checksum, ring positions that are not the held tail) is deleted and the next shorter prefix
tried; a refusal for room (``CapacityError``: fewer free cells than the sequence holds, every
sequence id live) is a miss and the value stays, for a cache that has the room.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _native as _okv
from .._errors import CacheError, SnapshotError
from .chunks import ChunkStore, SaveResult
from .format import KIND_CELL, check_value, encode_value, layout_of

__all__ = ["GeneratorStore", "cell_keys", "cell_layout", "load_seq", "save_seq"]


def cell_layout(kc: Any) -> bytes:
    """The layout bytes of ``kc``'s sequence snapshots (from an empty sequence of a one-cell
    cache of the same config: ``kc`` itself is not touched)."""
    probe = _okv.KvCellCache(kc.config, 1, n_seq_max=1)
    return layout_of(probe.save_seq(probe.seq_new(), 0))


def cell_keys(store: ChunkStore, layout: bytes, tokens: Sequence[int]) -> list[str]:
    """The keys of ``tokens``' whole chunks for cell sequences of ``layout``: a root naming
    the cell layout, so cell and sequence values never share a key."""
    return store.chain_keys(store.root([b"cell", layout]), tokens)


def save_seq(
    store: ChunkStore,
    kc: Any,
    seq: int,
    token_ids: Sequence[int],
    after: int = 0,
    layout: bytes | None = None,
) -> SaveResult:
    """Writes the chunk prefixes of ``seq`` (which holds ``token_ids``) that end above ``after``
    and the store lacks; returns a :class:`~offgraph_kv.store.SaveResult`."""
    layout = cell_layout(kc) if layout is None else layout
    c = store.chunk_tokens
    tokens = [int(t) for t in token_ids]
    held = min(len(tokens), kc.seq_len(seq))
    keys = cell_keys(store, layout, tokens[:held])
    first = after // c
    if first >= len(keys):
        return SaveResult(0, [], 0)

    def build(j: int) -> tuple[bytes, bool]:
        end = (first + j + 1) * c
        snap = kc.save_seq(seq, end)
        return encode_value(KIND_CELL, 0, end, tokens[:end], [snap], True), True

    return store.write(keys[first:], build, "save_seq")


def load_seq(
    store: ChunkStore,
    kc: Any,
    token_ids: Sequence[int],
    above: int = 0,
    layout: bytes | None = None,
) -> tuple[int | None, int]:
    """The longest stored prefix of ``token_ids`` (at most ``len - 1`` tokens, more than
    ``above``) as a new sequence of ``kc``: ``(seq_id, tokens)``, or ``(None, 0)``."""
    c = store.chunk_tokens
    tokens = [int(t) for t in token_ids]
    usable = max(len(tokens) - 1, 0)
    if usable // c * c <= above:
        return None, 0
    layout = cell_layout(kc) if layout is None else layout
    keys = cell_keys(store, layout, tokens[:usable])
    stored = store.stored(keys)
    for k in range(len(keys) - 1, -1, -1):
        end = (k + 1) * c
        if end <= above:
            break
        if stored[k] is None or isinstance(stored[k], BaseException):
            continue
        (value,) = store.get([keys[k]])
        if value is None:
            continue
        if isinstance(value, BaseException):
            store.warn(f"lookup of chunk {k} failed ({type(value).__name__}: {value}): a miss")
            return None, 0
        checked = check_value(value, KIND_CELL, 0, end, tokens[:end], [layout])
        if isinstance(checked, str):
            store.warn(f"chunk {k} is bad ({checked}): deleted, a miss")
            store.drop([keys[k]])
            continue
        try:
            return kc.load_seq(checked[0][0]), end
        except SnapshotError as e:  # the core refuses the contents: damage
            store.warn(f"chunk {k} is damaged ({e}): deleted, a miss")
            store.drop([keys[k]])
        except CacheError as e:  # no room (CapacityError) or no sequence id: a miss, kept
            store.warn(f"load_seq of chunk {k} refused ({type(e).__name__}: {e}): a miss")
            return None, 0
    return None, 0


class GeneratorStore:
    """A :class:`~offgraph_kv.hf.BatchGenerator`'s use of a prefix store: on admission, the
    longest stored prefix a live sequence does not beat; after each step, the chunk prefixes
    the step's prefill passed (so every saved chunk is complete by construction: the ring table
    still holds the tail of a boundary the step just passed)."""

    def __init__(self, store: Any, model: Any, kc: Any):
        self.store = store.bind(model)
        self.kc = kc
        self.layout = cell_layout(kc)
        self.loaded_tokens = 0
        self.loads = 0
        self.saved_chunks = 0

    def admit(self, prompt: list[int], live: int) -> tuple[int | None, int]:
        """A new sequence holding more than ``live`` tokens of ``prompt`` from the store."""
        seq, n = load_seq(self.store, self.kc, prompt, above=live, layout=self.layout)
        if seq is not None:
            self.loads += 1
            self.loaded_tokens += n
        return seq, n

    def prefilled(self, fed: Sequence[tuple[int | None, list[int], int, int]]) -> None:
        """``(seq, prompt, before, after)`` per request of a step that fed positions
        ``[before, after)``: saves the prompt's chunk prefixes ending in ``(before, after]``."""
        c = self.store.chunk_tokens
        for seq, prompt, before, after in fed:
            end = min(after, len(prompt))
            if seq is None or end // c <= before // c:
                continue
            res = save_seq(self.store, self.kc, seq, prompt[:end], after=before, layout=self.layout)
            self.saved_chunks += int(res)

    def stats(self) -> dict[str, int]:
        return {
            "store_loads": self.loads,
            "store_tokens_loaded": self.loaded_tokens,
            "store_chunks_saved": self.saved_chunks,
        }
