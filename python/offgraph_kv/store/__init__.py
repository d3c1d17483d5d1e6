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
  :mod:`offgraph_kv.store.identity`) and of the tokenizer where given; the layout is every
  layer's snapshot fingerprint (policy, window, heads, head_dim, pool dtypes, row bytes). Two
  checkpoints of one shape never share a key, and a cache loads only rows of its own pool dtypes.
* **Values** (:mod:`offgraph_kv.store.format`): the chunk's kind, range and tokens, one snapshot
  per layer cache, a CRC-32 over the header; each snapshot carries its own CRC-32, checked by the
  core as it loads (one checksum pass over the rows). A value is accepted only if its header
  checksum, version, range, tokens, and every snapshot's layout and range are its key's chunk's;
  anything else is a miss and the value is deleted (a hash collision becomes a miss, never a
  wrong row). So is a value whose ring layer carries positions below its window's tail (no
  save writes one; the core refuses one carrying more than its slots) or whose flags claim
  complete over incomplete snapshots (a ``save`` reads only the flags, so the lie would stay).
  A value the core refuses as damaged is deleted too; one it refuses for room is a miss, kept.
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
* **Cell caches** (:mod:`offgraph_kv.store.cells`): ``save_seq``/``load_seq`` store a
  :class:`~offgraph_kv.KvCellCache` sequence's prefixes, which
  :class:`~offgraph_kv.hf.BatchGenerator` uses with ``store=``.

Modules
-------
* :mod:`offgraph_kv.store.format`: the value format, and what the store checks of a value.
* :mod:`offgraph_kv.store.identity`: the digest of a model's weights and tokenizer.
* :mod:`offgraph_kv.store.backends`: :class:`MemoryBackend`, :class:`RedisBackend`.
* :mod:`offgraph_kv.store.chunks`: keys and batched reads and writes of chunk values
  (:class:`~offgraph_kv.store.chunks.ChunkStore`), what both stores share.
* :mod:`offgraph_kv.store.sequence`: :class:`PrefixStore`.
* :mod:`offgraph_kv.store.cells`: cell sequences, and the batcher's ``GeneratorStore``.
* :mod:`offgraph_kv.store.host`: :class:`HostTier`, the in-process tier of evicted sequences.
"""

from .backends import MemoryBackend, RedisBackend
from .chunks import MAX_VALUE_BYTES, SaveResult, StoreWarning
from .host import HostTier
from .sequence import PrefixStore

__all__ = [
    "MAX_VALUE_BYTES",
    "HostTier",
    "MemoryBackend",
    "PrefixStore",
    "RedisBackend",
    "SaveResult",
    "StoreWarning",
]
