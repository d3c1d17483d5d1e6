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
  ``config.max_position_embeddings``; pools grow by doubling from ``initial_capacity``, so unused
  capacity costs nothing). ``sliding_attention`` layers are ``Ring(window=sliding_window)`` with
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

import math
import warnings
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, get_layer_types_and_kwargs

from . import _native as _okv
from ._errors import CacheError, InvalidArgumentError

__all__ = [
    "ATTN_NAME",
    "OffgraphCache",
    "OffgraphLayer",
    "offgraph_attention",
    "register_attention",
]

ATTN_NAME = "offgraph"
"""The ``attn_implementation`` name under which :func:`offgraph_attention` is registered."""

_SPEC_ATTR = "_offgraph_spec"

KV_DTYPES = ("float32", "float16", "bfloat16", "q8_0")
_MODEL_POOL = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _np_rows(x: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """New rows for ``update`` without a float32 round trip of 16-bit inputs: float16 as is,
    bfloat16 as its bits (``bits="bfloat16"``), anything else as float32."""
    if x.dtype == torch.float16:
        return x.contiguous().numpy(), None
    if x.dtype == torch.bfloat16:
        return x.contiguous().view(torch.int16).numpy(), "bfloat16"
    return x.to(torch.float32).contiguous().numpy(), None


def _pool_torch(arr: np.ndarray, dtype: str) -> torch.Tensor:
    """A torch tensor of a pool view: zero-copy for float32/float16/bfloat16, a dequantized
    float32 copy for q8_0 (its blocks have no tensor type)."""
    if dtype == "q8_0":
        return torch.from_numpy(_okv.dequantize(arr, "q8_0"))
    if dtype == "bfloat16":
        return _pool_tensor(arr.view(np.int16)).view(torch.bfloat16)
    return _pool_tensor(arr)


def _pool_tensor(arr: np.ndarray) -> torch.Tensor:
    """A torch view of a read-only pool array. Nothing ever writes through it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


class OffgraphLayer(CacheLayerMixin):
    """One decoder layer's cache: a :class:`~offgraph_kv.KvSequenceCache`, batch folded into heads.

    ``window=None`` is a full-attention (flat) layer; an int is a sliding (ring) layer.
    """

    is_compileable = False
    is_croppable = True

    def __init__(
        self,
        capacity: int,
        window: int | None = None,
        max_step: int = 256,
        initial_capacity: int = 256,
        defer_dtype: bool = False,
        kv_dtype: str | None = None,
    ):
        super().__init__()
        self.kv_dtype = kv_dtype
        self.capacity = int(capacity)
        self.window = None if window is None else int(window)
        self.is_sliding = self.window is not None
        if self.window is None:
            self.max_step = self.capacity
        else:
            self.max_step = min(max(int(max_step), self.window), self.capacity)
        self.initial_capacity = max(1, min(int(initial_capacity), self.capacity))
        self.defer_dtype = defer_dtype
        # Set up without a forward (a prefix-store restore): take the dtype of the first update.
        self._adopt_dtype = False
        self.kv: _okv.KvSequenceCache | None = None
        self.batch_size = 0
        self.n_heads = 0
        self.head_dim = 0
        self.dtype = torch.float32
        # Torch views of the pools, refreshed by every write (the only time a pool can grow).
        # What the pools hold is always asked of the cache (held_runs), never mirrored here.
        self._views: tuple[int, int, torch.Tensor, torch.Tensor] | None = None

    # -- set-up -----------------------------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype = key_states.dtype
        self._init(key_states.shape[0], key_states.shape[1], key_states.shape[-1])
        self.device = key_states.device
        if key_states.device.type != "cpu":
            raise ValueError("OffgraphCache keeps K/V in host memory; run the model on the CPU")

    def _init(self, batch: int, heads: int, head_dim: int) -> None:
        policy = _okv.Flat() if self.window is None else _okv.Ring(window=self.window)
        layer = _okv.LayerConfig(policy, batch * heads, head_dim)
        cfg = _okv.CacheConfig(
            self.capacity,
            1,
            [layer],
            initial_capacity=self.initial_capacity,
            max_step=self.max_step,
            dtype=self.kv_dtype or _MODEL_POOL.get(self.dtype, "float32"),
        )
        self.kv = _okv.KvSequenceCache(cfg)
        self.batch_size, self.n_heads, self.head_dim = int(batch), int(heads), int(head_dim)
        self._views = None
        self.is_initialized = True

    # -- views ------------------------------------------------------------------------------------

    def _pool(self, spec: _okv.AttendSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, H, slots, D]`` torch views of the pools, rebuilt only when a pool grows."""
        k, v = spec.k, spec.v
        key = (k.__array_interface__["data"][0], k.shape[1])
        copied = "q8_0" in (spec.k_dtype, spec.v_dtype)  # a dequantized copy is stale next step
        if self._views is None or self._views[:2] != key or copied:
            shape = (self.batch_size, self.n_heads, k.shape[1], self.head_dim)
            kt, vt = _pool_torch(k, spec.k_dtype), _pool_torch(v, spec.v_dtype)
            self._views = (*key, kt.view(shape), vt.view(shape))
        return self._views[2], self._views[3]

    def _gather(self, runs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of pool slot runs: a view for one run, a cat for two."""
        if not runs:
            empty = torch.empty(self.batch_size, self.n_heads, 0, self.head_dim, dtype=self.dtype)
            return empty, empty
        assert self._views is not None
        kp, vp = self._views[2], self._views[3]
        if len(runs) == 1:
            s, n = runs[0]
            return kp[:, :, s : s + n], vp[:, :, s : s + n]
        ks = [kp[:, :, s : s + n] for s, n in runs]
        vs = [vp[:, :, s : s + n] for s, n in runs]
        return torch.cat(ks, dim=2), torch.cat(vs, dim=2)

    def _rows(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of positions [lo, hi) as the cache holds them now (with or without an open step;
        ``InvalidArgumentError`` if it no longer holds them). A one-run result is a view."""
        assert self.kv is not None
        return self._gather(self.kv.held_runs(0, lo, hi))

    def _out(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if (k.dtype != self.dtype or v.dtype != self.dtype) and not self.defer_dtype:
            return k.to(self.dtype), v.to(self.dtype)
        return k, v

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> _okv.AttendSpec:
        """One step of ``T <= max_step`` rows, ``k``/``v`` ``[B, H, T, D]`` (float32, float16 or
        bfloat16; rounded once into the pool's dtype)."""
        assert self.kv is not None
        b, h, t, d = k.shape
        (kn, bits), (vn, _) = _np_rows(k.reshape(b * h, t, d)), _np_rows(v.reshape(b * h, t, d))
        self.kv.begin_step(t)
        try:
            spec = self.kv.update(0, kn, vn, bits=bits)
        except BaseException:
            self.kv.rewind(self.kv.length - t)
            raise
        self._pool(spec)
        return spec

    # -- the CacheLayerMixin face -----------------------------------------------------------------

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        elif self._adopt_dtype:
            self.dtype, self._adopt_dtype = key_states.dtype, False
        assert self.kv is not None
        b, h, t, d = key_states.shape
        if (b, h, d) != (self.batch_size, self.n_heads, self.head_dim):
            raise ValueError(
                f"OffgraphCache layer holds batch {self.batch_size} x {self.n_heads} heads x "
                f"{self.head_dim}, got key_states of shape {tuple(key_states.shape)}"
            )
        kin = key_states.detach()
        vin = value_states.detach()
        if vin.dtype != kin.dtype:
            vin = vin.to(kin.dtype)
        if t <= self.max_step:
            spec = self._write(kin, vin)
            k, v = self._gather(spec.read)
            if (k.dtype == self.dtype and v.dtype == self.dtype) or self.defer_dtype:
                setattr(k, _SPEC_ATTR, (spec, self.batch_size))
            return self._out(k, v)
        # A ring step longer than max_step (a long prompt on a sliding layer): write it in chunks
        # and return the prior window followed by all the new rows. The prior window is copied
        # first: the chunks overwrite its slots (``.to`` alone returns the view when the pool
        # holds the model's dtype).
        lo, length = self._visible()
        hk, hv = self._rows(lo, length)
        hk = hk.to(key_states.dtype, copy=True)
        hv = hv.to(value_states.dtype, copy=True)
        for s in range(0, t, self.max_step):
            self._write(kin[:, :, s : s + self.max_step], vin[:, :, s : s + self.max_step])
        keys = torch.cat([hk, key_states.detach()], dim=2)
        values = torch.cat([hv, value_states.detach()], dim=2)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        length = self.get_seq_length()
        if self.window is None:
            return length + query_length, 0
        offset = max(length - self.window + 1, 0)
        return length - offset + query_length, offset

    def get_seq_length(self) -> int:
        return 0 if self.kv is None else self.kv.length

    def get_max_length(self) -> int:
        return self.capacity if self.window is None else min(self.window, self.capacity)

    def offload(self) -> None:  # host memory only
        pass

    def prefetch(self) -> None:
        pass

    def reset(self) -> None:
        if self.kv is not None:
            self.kv.clear()

    def activate_past_recording(self) -> None:
        """Always on: a ring keeps ``window + max_step - 1`` rows; crops within max_step work."""

    def check_crop(self, tokens_to_remove: int) -> None:
        """Raise what :meth:`crop` would raise, changing nothing."""
        if tokens_to_remove > 0:
            raise ValueError(
                f"crop({tokens_to_remove}): pass a negative number of tokens to remove"
            )
        if tokens_to_remove == 0 or self.kv is None:
            return
        new_len = max(self.kv.length + tokens_to_remove, 0)
        lowest = self.kv.min_rewind
        if new_len < lowest:
            raise InvalidArgumentError(
                f"crop({tokens_to_remove}): length {new_len} is below {lowest}, the oldest "
                f"length whose window keys this ring layer (window {self.window}) still holds"
            )

    def crop(self, tokens_to_remove: int) -> None:
        self.check_crop(tokens_to_remove)
        if tokens_to_remove == 0 or self.kv is None:
            return
        self.kv.rewind(max(self.kv.length + tokens_to_remove, 0))

    def _visible(self) -> tuple[int, int]:
        """Positions [lo, length) the next step may read."""
        length = self.get_seq_length()
        lo = 0 if self.window is None else max(length - self.window + 1, 0)
        return lo, length

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.kv is None or self.kv.length == 0:
            return
        idx = beam_idx.to("cpu", torch.long)
        if idx.numel() == self.batch_size and torch.equal(idx, torch.arange(self.batch_size)):
            return
        self._regather(idx)

    def _skip(self, n: int) -> None:
        """Advance ``n`` positions without writing rows: positions no query will read."""
        assert self.kv is not None
        while n > 0:
            step = min(self.max_step, n)
            self.kv.begin_step(step)
            n -= step

    def _regather(self, idx: torch.Tensor) -> None:
        """Row ``i`` of the batch becomes row ``idx[i]``, for every position the layer holds.

        The held rows (all of them, not only the visible window: a later crop may expose the
        rest) are gathered into copies, then rewritten at the same positions into the same pool
        (a new one when the batch size changes). Positions below the held range and between the
        length and the high-water mark are stepped over without writing, so the rebuilt cache
        holds exactly what the old one did (same length, high-water mark and crop bound).
        """
        assert self.kv is not None
        lo, hi = self.kv.held_range(0)
        high = self.kv.high_water
        k, v = self._rows(lo, hi)
        k, v = k.index_select(0, idx), v.index_select(0, idx)  # copies: the rewrite reads them
        if idx.numel() == self.batch_size:
            self.kv.clear()
        else:
            self._init(idx.numel(), self.n_heads, self.head_dim)
        self._skip(lo)
        for s in range(0, hi - lo, self.max_step):
            self._write(k[:, :, s : s + self.max_step], v[:, :, s : s + self.max_step])
        self._skip(high - hi)
        self.kv.rewind(hi)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.kv is not None and self.kv.length > 0:
            self._regather(torch.arange(self.batch_size).repeat_interleave(repeats))
        elif self.kv is not None:
            self._init(self.batch_size * repeats, self.n_heads, self.head_dim)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.kv is not None and self.kv.length > 0:
            idx = torch.arange(self.batch_size)[indices.to("cpu")]
            self._regather(idx)


class OffgraphCache(Cache):
    """A ``transformers`` cache backed by offgraph-kv pools: ``generate(..., cache=...)``.

    Args:
        config: the model's config (``layer_types`` / ``sliding_window`` choose flat or ring).
        max_cache_len: most tokens a full-attention layer holds (default
            ``config.max_position_embeddings``). Pools grow by doubling up to it.
        max_step: most tokens a sliding layer takes in one step without chunking, and the deepest
            crop it allows (raised to the window). Its pool depth is ``window + max_step - 1``.
        initial_capacity: first pool size in slots.
        kv_dtype: the pools' dtype, one of ``"float32"``, ``"float16"``, ``"bfloat16"``,
            ``"q8_0"``; ``None`` (default) stores the model's dtype (float32 for others).
    """

    def __init__(
        self,
        config: Any,
        max_cache_len: int | None = None,
        max_step: int = 256,
        initial_capacity: int = 256,
        kv_dtype: str | None = None,
    ):
        if kv_dtype is not None and kv_dtype not in KV_DTYPES:
            from ._errors import ConfigError

            raise ConfigError(f"kv_dtype: expected None or one of {KV_DTYPES}, got {kv_dtype!r}")
        text = config.get_text_config(decoder=True)
        capacity = max_cache_len or getattr(text, "max_position_embeddings", None) or 32768
        defer = getattr(config, "_attn_implementation", None) == ATTN_NAME
        layer_types, kwargs = get_layer_types_and_kwargs(text)
        layers: list[Any] = []
        for i, (kind, kw) in enumerate(zip(layer_types, kwargs)):
            if kind == "full_attention":
                window = None
            elif kind == "sliding_attention":
                window = int(kw["sliding_window"])
            elif kind == "dummy":
                layers.append(DummyLayer())
                continue
            else:
                raise NotImplementedError(f"OffgraphCache: layer {i} has unsupported type {kind!r}")
            layers.append(
                OffgraphLayer(
                    capacity,
                    window=window,
                    max_step=max_step,
                    initial_capacity=initial_capacity,
                    defer_dtype=defer,
                    kv_dtype=kv_dtype,
                )
            )
        super().__init__(layers=layers)
        n_heads = getattr(text, "num_attention_heads", 1)
        self._kv_geometry = (
            getattr(text, "num_key_value_heads", None) or n_heads,
            getattr(text, "head_dim", None) or text.hidden_size // n_heads,
        )
        # The model's dtype where the config names it: a layer the prefix store restores
        # before any forward gets pools of the dtype the forward would have chosen.
        dtype = getattr(config, "dtype", None)
        self._model_dtype = dtype if isinstance(dtype, torch.dtype) else None

    def kv_caches(self, batch_size: int = 1, model_dtype: torch.dtype | None = None) -> list[Any]:
        """Each layer's :class:`~offgraph_kv.KvSequenceCache` (``None`` for a pass-through layer),
        making empty pools for ``batch_size`` rows where a layer has not run yet (the prefix store
        restores into them). Such a layer's pools take the dtype a forward of ``model_dtype``
        would give them (default: the config's dtype, else float32); the layer adopts the
        model's actual dtype at its first update."""
        dtype = model_dtype if model_dtype is not None else self._model_dtype
        out: list[Any] = []
        for layer in self.layers:
            if not isinstance(layer, OffgraphLayer):
                out.append(None)
                continue
            if layer.kv is None:
                if dtype is not None:
                    layer.dtype = dtype
                layer._init(batch_size, *self._kv_geometry)
                layer._adopt_dtype = True
            out.append(layer.kv)
        return out

    def fresh(self) -> bool:
        """Whether no layer has pools yet (what the prefix store may set up)."""
        return all(getattr(layer, "kv", None) is None for layer in self.layers)

    def drop_empty_layers(self) -> None:
        """Forgets the pools of layers that hold no token, so the next forward sets them up for
        its own batch size and dtype (after a prefix-store miss)."""
        for layer in self.layers:
            if isinstance(layer, OffgraphLayer) and layer.kv is not None and not layer.kv.length:
                layer.kv = None
                layer.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last ``-tokens_to_remove`` tokens from every layer, or from none: every
        layer is checked before any changes (``Cache.crop`` alone goes layer by layer, so a ring
        layer refusing after a flat layer was cropped would leave them at different lengths)."""
        for i, layer in enumerate(self.layers):
            if isinstance(layer, OffgraphLayer):
                try:
                    layer.check_crop(tokens_to_remove)
                except CacheError as e:
                    raise type(e)(f"layer {i}: {e}") from None
        super().crop(tokens_to_remove)

    def nbytes(self) -> int:
        """Bytes held by all pools."""
        return sum(
            layer.kv.nbytes() for layer in self.layers if getattr(layer, "kv", None) is not None
        )


# -- offgraph-kv's attend as a transformers attention function ----------------------------------


def _reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None,
    sliding_window: int | None,
) -> torch.Tensor:
    """Plain attention, the fallback where ``attend`` does not apply. Returns ``[B, T, H, D]``."""
    b, hq, t, d = query.shape
    key, value = key.to(query.dtype), value.to(query.dtype)
    groups = hq // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    n = key.shape[2]
    if attention_mask is None:
        qpos = torch.arange(t).unsqueeze(1) + (n - t)  # lower-right aligned
        kpos = torch.arange(n).unsqueeze(0)
        attention_mask = kpos <= qpos
        if sliding_window is not None:
            attention_mask = attention_mask & (kpos > qpos - sliding_window)
    if softcap is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scale
        )
    else:
        scores = torch.matmul(query, key.transpose(2, 3)) * scale
        scores = torch.tanh(scores / softcap) * softcap
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask[..., :n]
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(probs, value)
    return out.transpose(1, 2).contiguous()


def offgraph_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function reading offgraph-kv pools through :func:`attend`.

    It applies when ``key`` came from :class:`OffgraphCache` (it carries the step's AttendSpec), the
    mask is the plain causal/sliding pattern the spec declares (no padding: the registered mask
    function returns ``None`` then), and there is no softcap, sink or dropout. Otherwise it falls
    back to plain attention over the tensors it was given, which is always correct.
    """
    tagged = getattr(key, _SPEC_ATTR, None)
    special = (
        kwargs.get("softcap") is not None
        or kwargs.get("s_aux") is not None
        or kwargs.get("sinks") is not None
        or kwargs.get("position_bias") is not None
        or (dropout and module.training)
    )
    if tagged is None or attention_mask is not None or special:
        return (
            _reference_attention(
                query,
                key,
                value,
                attention_mask,
                scaling,
                kwargs.get("softcap"),
                kwargs.get("sliding_window"),
            ),
            None,
        )
    spec, batch = tagged
    b, hq, t, d = query.shape
    q = query.detach().to(torch.float32).reshape(b * hq, t, d)
    out = _okv.attend(q.numpy(), spec, scale=scaling, threads=torch.get_num_threads())
    out = torch.from_numpy(out).view(b, hq, t, d).transpose(1, 2)
    return out.to(query.dtype).contiguous(), None


def _offgraph_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    attention_mask: torch.Tensor | None = None,
    allow_is_causal_skip: bool = True,
    **kwargs: Any,
) -> torch.Tensor | None:
    """``None`` for a plain causal/sliding pattern without padding (the spec's analytic mask is
    exact then); otherwise sdpa's boolean mask, which makes the attention fall back."""
    from transformers.masking_utils import sdpa_mask

    if allow_is_causal_skip and (attention_mask is None or bool(attention_mask.all())):
        return None
    return sdpa_mask(
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        allow_is_causal_skip=False,
        **kwargs,
    )


def register_attention(name: str = ATTN_NAME) -> None:
    """Register :func:`offgraph_attention` and its mask function under ``name`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, offgraph_attention)
    AttentionMaskInterface.register(name, _offgraph_mask)


register_attention()

from .batch import BatchGenerator as BatchGenerator  # noqa: E402  (re-exported)
