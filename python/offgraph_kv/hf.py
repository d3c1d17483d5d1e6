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
  enough to rewind by a window (beam reorder) and by ``max_step`` tokens (assisted decoding).
  Other layer types (chunked, linear attention) are refused; KV-sharing ``dummy`` layers pass
  through.
* **Zero copy.** ``update`` converts the new rows to float32 (a copy of the new rows only), writes
  them, and returns views of the pool over the spec's read run. A wrapped ring (two runs) is joined
  with one ``torch.cat``, bounded by the window. A flat layer never copies its history.
* **Copies, and why.** (a) bf16/f16 models: pools are float32, so the returned history is converted
  to the model dtype every step (a copy; with ``attn_implementation="offgraph"`` it is skipped and
  the kernel reads the float32 pools). (b) A ring step longer than its ``max_step`` (a long prompt
  on a sliding layer): the returned tensor is the prior window (<= window-1 rows) concatenated with
  the new rows, once per prefill. (c) Beam search, below.
* **Beam search.** ``reorder_cache(beam_idx)`` gathers the visible history rows by ``beam_idx``
  (``index_select``) and writes them back at the same positions: ``rewind`` by the visible length,
  one ``begin_step``, one ``update``. An identity ``beam_idx`` costs nothing. Cell forks
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
  A deeper crop of a ring layer raises :class:`offgraph_kv.CacheError`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DummyLayer, get_layer_types_and_kwargs

from . import _native as _okv

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
    ):
        super().__init__()
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
        self._views: tuple[int, int, torch.Tensor, torch.Tensor] | None = None
        # The rows of the last read: pool runs, and the positions [base, end) they hold.
        self._runs: list[tuple[int, int]] = []
        self._base = 0
        self._end = 0

    # -- set-up -----------------------------------------------------------------------------------

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._init(key_states.shape[0], key_states.shape[1], key_states.shape[-1])
        self.dtype = key_states.dtype
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
        )
        self.kv = _okv.KvSequenceCache(cfg)
        self.batch_size, self.n_heads, self.head_dim = int(batch), int(heads), int(head_dim)
        self._views = None
        self._runs, self._base, self._end = [], 0, 0
        self.is_initialized = True

    # -- views ------------------------------------------------------------------------------------

    def _pool(self, spec: _okv.AttendSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, H, slots, D]`` torch views of the pools, rebuilt only when a pool grows."""
        k, v = spec.k, spec.v
        key = (k.__array_interface__["data"][0], k.shape[1])
        if self._views is None or self._views[:2] != key:
            shape = (self.batch_size, self.n_heads, k.shape[1], self.head_dim)
            self._views = (*key, _pool_tensor(k).view(shape), _pool_tensor(v).view(shape))
        return self._views[2], self._views[3]

    def _rows(self, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of positions [lo, hi) from the last read runs: a view for one run, a cat for two."""
        if lo < self._base or hi > self._end:
            raise RuntimeError(
                f"positions [{lo}, {hi}) are no longer held (the last read covers "
                f"[{self._base}, {self._end}))"
            )
        assert self._views is not None
        kp, vp = self._views[2], self._views[3]
        ks, vs = [], []
        pos = self._base
        for start, n in self._runs:
            a, b = max(lo, pos), min(hi, pos + n)
            if a < b:
                s = start + (a - pos)
                ks.append(kp[:, :, s : s + (b - a)])
                vs.append(vp[:, :, s : s + (b - a)])
            pos += n
        if len(ks) == 1:
            return ks[0], vs[0]
        if not ks:
            empty = kp[:, :, :0]
            return empty, empty
        return torch.cat(ks, dim=2), torch.cat(vs, dim=2)

    def _out(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dtype != torch.float32 and not self.defer_dtype:
            return k.to(self.dtype), v.to(self.dtype)
        return k, v

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> _okv.AttendSpec:
        """One step of ``T <= max_step`` rows, ``k``/``v`` float32 ``[B, H, T, D]``."""
        assert self.kv is not None
        b, h, t, d = k.shape
        self.kv.begin_step(t)
        try:
            spec = self.kv.update(0, k.reshape(b * h, t, d).numpy(), v.reshape(b * h, t, d).numpy())
        except BaseException:
            self.kv.rewind(self.kv.length - t)
            raise
        self._pool(spec)
        self._runs = [tuple(r) for r in spec.read]
        self._base = spec.read_base_pos
        self._end = self.kv.length
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
        k32 = key_states.detach().to(torch.float32)
        v32 = value_states.detach().to(torch.float32)
        if t <= self.max_step:
            spec = self._write(k32, v32)
            k, v = self._rows(self._base, self._end)
            if self.dtype == torch.float32 or self.defer_dtype:
                setattr(k, _SPEC_ATTR, (spec, self.batch_size))
            return self._out(k, v)
        # A ring step longer than max_step (a long prompt on a sliding layer): write it in chunks
        # and return the prior window followed by all the new rows.
        # The prior window is read after the first chunk is written: its read covers that window
        # (which it cannot overwrite), also right after a restore, when no read came before.
        length = self.kv.length
        lo = max(length - self.window + 1, 0) if self.window is not None else 0
        self._write(k32[:, :, : self.max_step], v32[:, :, : self.max_step])
        hk, hv = self._rows(lo, length) if length > lo else (k32[:, :, :0], v32[:, :, :0])
        hk, hv = hk.to(key_states.dtype), hv.to(value_states.dtype)  # a copy: the ring overwrites
        for s in range(self.max_step, t, self.max_step):
            self._write(k32[:, :, s : s + self.max_step], v32[:, :, s : s + self.max_step])
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
        return self.capacity if self.window is None else self.window

    def offload(self) -> None:  # host memory only
        pass

    def prefetch(self) -> None:
        pass

    def reset(self) -> None:
        if self.kv is not None:
            self.kv.clear()
        self._runs, self._base, self._end = [], 0, 0

    def activate_past_recording(self) -> None:
        """Always on: a ring keeps ``window + max_step - 1`` rows; crops within max_step work."""

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(
                f"crop({tokens_to_remove}): pass a negative number of tokens to remove"
            )
        if tokens_to_remove == 0 or self.kv is None:
            return
        new_len = max(self.kv.length + tokens_to_remove, 0)
        self.kv.rewind(new_len)
        self._end = min(self._end, new_len)
        self._base = min(self._base, self._end)

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
        if idx.numel() != self.batch_size:
            self._rebuild(idx)
            return
        lo, hi = self._visible()
        k, v = self._rows(lo, hi)
        k, v = k.index_select(0, idx), v.index_select(0, idx)  # copies: the rewrite reads them
        self.kv.rewind(lo)
        self._write(k, v)

    def _rebuild(self, idx: torch.Tensor) -> None:
        """A new pool for a new batch size: zero rows below the visible window, gathered above."""
        lo, hi = self._visible()
        k, v = self._rows(lo, hi)
        k, v = k.index_select(0, idx), v.index_select(0, idx)
        self._init(idx.numel(), self.n_heads, self.head_dim)
        pos = 0
        while pos < lo:  # ring layers only: positions stay absolute
            n = min(self.max_step, lo - pos)
            zeros = torch.zeros(self.batch_size, self.n_heads, n, self.head_dim)
            self._write(zeros, zeros)
            pos += n
        for s in range(0, hi - lo, self.max_step):
            self._write(k[:, :, s : s + self.max_step], v[:, :, s : s + self.max_step])

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.kv is not None and self.kv.length > 0:
            self._rebuild(torch.arange(self.batch_size).repeat_interleave(repeats))
        elif self.kv is not None:
            self._init(self.batch_size * repeats, self.n_heads, self.head_dim)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.kv is not None and self.kv.length > 0:
            idx = torch.arange(self.batch_size)[indices.to("cpu")]
            self._rebuild(idx)


class OffgraphCache(Cache):
    """A ``transformers`` cache backed by offgraph-kv pools: ``generate(..., cache=...)``.

    Args:
        config: the model's config (``layer_types`` / ``sliding_window`` choose flat or ring).
        max_cache_len: most tokens a full-attention layer holds (default
            ``config.max_position_embeddings``). Pools grow by doubling up to it.
        max_step: most tokens a sliding layer takes in one step without chunking, and the deepest
            crop it allows (raised to the window). Its pool depth is ``window + max_step - 1``.
        initial_capacity: first pool size in slots.
    """

    def __init__(
        self,
        config: Any,
        max_cache_len: int | None = None,
        max_step: int = 256,
        initial_capacity: int = 256,
    ):
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
                )
            )
        super().__init__(layers=layers)
        n_heads = getattr(text, "num_attention_heads", 1)
        self._kv_geometry = (
            getattr(text, "num_key_value_heads", None) or n_heads,
            getattr(text, "head_dim", None) or text.hidden_size // n_heads,
        )

    def kv_caches(self, batch_size: int = 1) -> list[Any]:
        """Each layer's :class:`~offgraph_kv.KvSequenceCache` (``None`` for a pass-through layer),
        making empty pools for ``batch_size`` rows where a layer has not run yet (the prefix store
        restores into them; such a layer takes the model's dtype from its first update)."""
        out: list[Any] = []
        for layer in self.layers:
            if not isinstance(layer, OffgraphLayer):
                out.append(None)
                continue
            if layer.kv is None:
                layer._init(batch_size, *self._kv_geometry)
                layer._adopt_dtype = True
            out.append(layer.kv)
        return out

    def drop_empty_layers(self) -> None:
        """Forgets the pools of layers that hold no token, so the next forward sets them up for
        its own batch size and dtype (after a prefix-store miss)."""
        for layer in self.layers:
            if isinstance(layer, OffgraphLayer) and layer.kv is not None and not layer.kv.length:
                layer.kv = None
                layer.is_initialized = False

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
