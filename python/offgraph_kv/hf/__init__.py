"""A drop-in Hugging Face ``transformers`` cache whose K/V live in offgraph-kv's pools.

Usage::

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from offgraph_kv.hf import OffgraphCache

    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="offgraph")
    tok = AutoTokenizer.from_pretrained(name)
    inputs = tok("The off-graph cache", return_tensors="pt")
    cache = OffgraphCache(model.config)
    out = model.generate(**inputs, cache=cache, max_new_tokens=40)
    # continue later from the same cache:
    more = model.generate(out, cache=cache, max_new_tokens=20)

``attn_implementation="offgraph"`` (registered when this module is imported, see
:func:`register_attention`) makes the model's attention read the pools directly through
:func:`offgraph_kv.attend`; any other attention (``"sdpa"``, ``"eager"``) works too and reads the
zero-copy views that :meth:`OffgraphCache.update` returns.

Design
------
* **Layout.** One :class:`offgraph_kv.KvSequenceCache` per decoder layer, with the batch folded
  into the heads: the pool is ``[batch * kv_heads, slots, head_dim]``. ``generate`` advances every
  batch row in lockstep (left padding), so one logical length serves the batch, and the pool
  reshaped to ``[batch, kv_heads, slots, head_dim]`` and sliced over a read run is a strided
  zero-copy torch view. The cache is per layer, not one controller for all layers, because
  transformers drives layers one after another: a prompt longer than a ring's ``max_step`` arrives
  whole at layer 0 and must be chunked there before layer 1 sees it.
* **Policies.** ``full_attention`` layers are ``Flat`` (capacity ``max_cache_len``, default
  ``config.max_position_embeddings``; pools reserve that depth of address space once and the OS
  commits pages as rows are written, so unused capacity costs no memory and no step copies).
  ``sliding_attention`` layers are ``Ring(window=sliding_window)`` with
  ``max_step = max(max_step, window)``, i.e. a pool depth of at most about twice the window:
  enough to rewind by ``max_step`` tokens (assisted decoding). A window at or above
  ``max_cache_len`` (e.g. ``max_cache_len=256`` under Gemma 3's window of 512) makes the ring a
  full layer: every held position is visible and the pool is at most ``max_cache_len`` deep.
  Other layer types (chunked, linear attention) are refused; KV-sharing ``dummy`` layers pass
  through.
* **Precision.** Pools hold the model's dtype by default (``kv_dtype=None``: float32, float16 or
  bfloat16 pools for a model of that dtype), or any of ``"float32"``, ``"float16"``,
  ``"bfloat16"``, ``"q8_0"`` by name. New rows go to ``update`` in their own 16-bit type when they
  are float16/bfloat16 (bfloat16 as raw bits), so only the new rows are ever converted, and they
  are rounded once, in the pool.
* **One source of truth.** What a layer holds is asked of its cache: ``update`` returns the rows
  of the spec's read runs, and every other read (batch ops, the long ring step) goes through
  ``kv.held_runs(0, lo, hi)``, which answers with or without an open step, after any crop. No
  copy of the last read is kept.
* **Zero copy.** ``update`` writes the new rows and returns views of the pool over the spec's read
  run. A wrapped ring (two runs) is joined
  with one ``torch.cat``, bounded by the window. A flat layer never copies its history.
* **Copies, and why.** (a) Pools of another dtype than the model's (``kv_dtype`` set): the
  returned history is converted to the model dtype every step (a copy; with
  ``attn_implementation="offgraph"`` it is skipped and the kernel reads the pools in place). A
  q8_0 pool has no tensor view, so eager/sdpa (and the offgraph attention's fallbacks) get a
  dequantized float32 copy of the history each step; the offgraph attention itself reads the
  blocks in place. (b) A ring step longer than its ``max_step`` (a long prompt on a sliding layer,
  or a long message appended to a conversation): the prior window (<= window-1 rows) is copied
  out before the chunked writes overwrite its slots, and returned concatenated with the new rows.
  (c) Beam search, below.
* **Beam search and batch ops.** ``reorder_cache``, ``batch_select_indices`` and
  ``batch_repeat_interleave`` gather every held row by the batch index (``index_select``; all held
  rows, not only the visible window, since a later crop may bring older ones back) and write them
  back at the same positions: ``clear`` (or a new pool when the batch size changes), positions
  below the held range stepped over unwritten, the rows rewritten, then the length and crop bound
  restored exactly. An identity ``beam_idx`` costs nothing. Cell forks
  (``KvCellCache.seq_clone``) would make the reorder itself free, but eager and sdpa need a dense
  ``[batch, heads, L, dim]`` per row, which a cell layout can only serve by gathering the whole
  history every step, in every generation mode; the gather-on-reorder costs only in beam search.
  Measured (4 layers x 8 heads x 128, 3 beams, 1 thread, shared machine): a reorder takes
  23.5 ms at 512 tokens and 107 ms at 2K against ``DynamicCache``'s 10.1 and 29.7 ms, i.e. the
  gather plus the rewrite cost 2-3.5x DynamicCache's ``index_select``: beam search is correct
  here but not fast (cell forks with the "offgraph" attention reading the cells would fix it).
* **Crop.** ``crop(-n)`` is ``rewind(length - n)`` on every layer. Ring pools keep
  ``window + max_step - 1`` rows, so any crop by at most ``max_step`` tokens succeeds (past
  recording is always on; ``activate_past_recording`` is a no-op) and ``is_croppable`` is True.
  A deeper crop of a ring layer raises :class:`offgraph_kv.InvalidArgumentError` naming the layer,
  and changes no layer: every layer is checked before any is cropped.
"""

from __future__ import annotations

from .. import _native as _okv  # noqa: F401  (tests patch _okv.attend through here)
from .attention import offgraph_attention, register_attention
from .cache import ATTN_NAME, KV_DTYPES, OffgraphCache, OffgraphLayer

__all__ = [
    "ATTN_NAME",
    "KV_DTYPES",
    "BatchGenerator",
    "OffgraphCache",
    "OffgraphLayer",
    "offgraph_attention",
    "register_attention",
]

register_attention()

from ..batch import BatchGenerator  # noqa: E402  (imports this package's attention setup)
