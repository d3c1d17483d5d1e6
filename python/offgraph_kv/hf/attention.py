"""The attention half: :func:`offgraph_attention` reads the pools through
:func:`offgraph_kv.attend` when the key tensor carries its step's spec, and
:func:`register_attention` registers it (with its mask function) under a name."""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _native as _okv
from .cache import ATTN_NAME, tagged_spec

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
    tagged = tagged_spec(key)
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
