"""What SmolLM2's cut-down layers compute on real text, measured once: the families whose extra
parameters rescale activations (QK norms, post-norms) take these scales as their weights, so the
variant stays close to the real model while the parameters still matter."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def _typical(x: torch.Tensor, width: int) -> float:
    """The median RMS of ``x``'s rows of ``width`` values (a token's vector, or one head of it):
    the median, as the first token's activations are far larger than the rest (attention sink)."""
    return float(x.reshape(-1, width).double().pow(2).mean(-1).sqrt().median())


@dataclass
class Stats:
    """Per layer, the typical RMS of a token's Q/K/V projections (whole and per head), of the
    attention and MLP outputs, and of the residual stream entering attention and the MLP."""

    head_dim: int
    q: list[float] = field(default_factory=list)
    k: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)
    q_head: list[float] = field(default_factory=list)
    k_head: list[float] = field(default_factory=list)
    attn_out: list[float] = field(default_factory=list)
    mlp_out: list[float] = field(default_factory=list)
    attn_in: list[float] = field(default_factory=list)
    mlp_in: list[float] = field(default_factory=list)


def measure(config: dict, state: dict[str, torch.Tensor], ids: list[int]) -> Stats:
    """Runs the Llama checkpoint ``(config, state)`` over ``ids`` in float32 and records Stats."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    stats = Stats(config["hidden_size"] // config["num_attention_heads"])
    seen: dict[tuple[int, str], torch.Tensor] = {}
    hooks = []

    def keep(key, pick):
        return lambda _m, args, out: seen.__setitem__(key, pick(args, out).detach())

    for i, layer in enumerate(model.model.layers):
        parts = {
            "q": layer.self_attn.q_proj,
            "k": layer.self_attn.k_proj,
            "v": layer.self_attn.v_proj,
            "attn_out": layer.self_attn.o_proj,
            "mlp_out": layer.mlp.down_proj,
        }
        for kind, module in parts.items():
            hooks.append(module.register_forward_hook(keep((i, kind), lambda _a, out: out)))
        # The residual stream is what the pre-norms take in.
        for kind, module in (("attn_in", layer.input_layernorm),
                             ("mlp_in", layer.post_attention_layernorm)):  # fmt: skip
            hooks.append(module.register_forward_hook(keep((i, kind), lambda a, _out: a[0])))
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    for i in range(len(model.model.layers)):
        for kind in ("q", "k", "v", "attn_out", "mlp_out", "attn_in", "mlp_in"):
            x = seen[i, kind]
            getattr(stats, kind).append(_typical(x, x.shape[-1]))
        stats.q_head.append(_typical(seen[i, "q"], stats.head_dim))
        stats.k_head.append(_typical(seen[i, "k"], stats.head_dim))
    return stats
