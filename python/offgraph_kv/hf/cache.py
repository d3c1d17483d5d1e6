"""The transformers cache half: :class:`OffgraphLayer` and :class:`OffgraphCache` (design notes in
the package docstring, :mod:`offgraph_kv.hf`)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, get_layer_types_and_kwargs

from .. import _native as _okv
from .._errors import CacheError, InvalidArgumentError

ATTN_NAME = "offgraph"
"""The ``attn_implementation`` name under which :func:`offgraph_attention` is registered."""

_SPEC_ATTR = "_offgraph_spec"


def tag_spec(key: Any, spec: Any, batch_size: int) -> None:
    """Attach a step's spec (and the batch size it serves) to the ``key`` tensor a layer's
    ``update`` returns: the attention function reads it back with :func:`tagged_spec`."""
    setattr(key, _SPEC_ATTR, (spec, batch_size))


def tagged_spec(key: Any) -> Any:
    """``(spec, batch_size)`` :func:`tag_spec` attached to ``key``, or ``None``."""
    return getattr(key, _SPEC_ATTR, None)


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
        """``[B, H, slots, D]`` torch views of the pools, rebuilt only when a pool moves (reserved
        pools never do; the copy-growth fallback does when it grows)."""
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
                tag_spec(k, spec, self.batch_size)
            return self._out(k, v)
        # A ring step longer than max_step (a long prompt on a sliding layer): write it in chunks
        # and return the prior window followed by all the new rows. The prior window is copied
        # first: the chunks overwrite its slots (``.to`` alone returns the view when the pool
        # holds the model's dtype).
        lo, length = self._visible()
        first = 0
        if self._views is None and length > lo:
            # Rows restored without a write (a prefix-store load) have no views yet: they come
            # with the first chunk's write, whose slots are older than the window (the ring is
            # window + max_step - 1 deep), so the window is still intact to copy after it.
            first = self.max_step
            self._write(kin[:, :, :first], vin[:, :, :first])
        hk, hv = self._rows(lo, length)
        hk = hk.to(key_states.dtype, copy=True)
        hv = hv.to(value_states.dtype, copy=True)
        for s in range(first, t, self.max_step):
            self._write(kin[:, :, s : s + self.max_step], vin[:, :, s : s + self.max_step])
        keys = torch.cat([hk, key_states.detach()], dim=2)
        values = torch.cat([hv, value_states.detach()], dim=2)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        length = self.get_seq_length()
        if self.window is None:
            return length + query_length, 0
        offset = _okv.first_visible(length, self.window)  # the next query is at `length`
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

    def activate_past_recording(self, **kwargs: Any) -> None:
        """Always on: a ring keeps ``window + max_step - 1`` rows; crops within max_step work.
        Keywords (newer transformers pass ``recurrent_states_to_keep``, for linear-attention
        layers' states) are accepted and ignored: these layers keep no recurrent state."""

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
        return _okv.first_visible(length, self.window), length

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
            ``config.max_position_embeddings``). Pools reserve it once; memory is committed as rows
            are written.
        max_step: most tokens a sliding layer takes in one step without chunking, and the deepest
            crop it allows (raised to the window). Its pool depth is ``window + max_step - 1``.
        initial_capacity: first pool size in slots where pools grow by copying (the fallback).
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
            from .._errors import ConfigError

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
