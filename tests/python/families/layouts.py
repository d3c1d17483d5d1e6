"""SmolLM2's cut-down Llama checkpoint rewritten into each family's Hugging Face layout. Each
family's extra parameters are set so that they matter (leaving one out moves the logits) while
the model stays close to SmolLM2: where a family rescales an activation, the weights undo it
(Granite's multipliers, Gemma's embedding normalizer) or take the scale SmolLM2 has there (QK and
post norms, measured in activations.Stats). Inputs are never modified."""

from __future__ import annotations

import math

import torch

from .activations import Stats

# Gemma's GELU (tanh) is close to SiLU rescaled: silu(x) ~ c * gelu(x / c).
_GELU_FROM_SILU = 1.702
_SPREAD = 0.2
# Post-norms (Gemma 2, OLMo 2) at SmolLM2's typical output scales times these (attention, MLP):
# at (1, 1) the normalized first token (SmolLM2's attention sink) leaves predictions varying
# little (19 and 22 distinct over the text); of the pairs tried, this one gives both the lowest
# loss on the text (and 54 and 58 distinct).
_POST = (0.7, 1.5)
# Qwen 2's biases, as a fraction of each projection's typical scale.
_BIAS = 0.1


def _layers(config: dict) -> range:
    return range(config["num_hidden_layers"])


def _attn(i: int, part: str) -> str:
    return f"model.layers.{i}.self_attn.{part}"


def _around(scale: float, width: int, g: torch.Generator) -> torch.Tensor:
    """Norm weights of a typical scale, varied by channel (+-10%) so that each weight counts."""
    return scale * (1 + _SPREAD * (torch.rand(width, generator=g) - 0.5))


def qwen2(config: dict, state: dict, stats: Stats) -> tuple[dict, dict]:
    """Q/K/V biases drawn at a fraction of each projection's typical scale."""
    g = torch.Generator().manual_seed(2)
    state = dict(state)
    for i in _layers(config):
        for part, scale in (("q", stats.q[i]), ("k", stats.k[i]), ("v", stats.v[i])):
            width = state[_attn(i, f"{part}_proj.weight")].shape[0]
            bias = torch.randn(width, generator=g) * scale * _BIAS
            state[_attn(i, f"{part}_proj.bias")] = bias
    cfg = {**config, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
           "use_sliding_window": False}  # fmt: skip
    return cfg, state


def qwen3(config: dict, state: dict, stats: Stats) -> tuple[dict, dict]:
    """Per-head Q/K RMS norms whose weights are around SmolLM2's typical Q/K head scale."""
    head_dim = stats.head_dim
    g = torch.Generator().manual_seed(3)
    state = dict(state)
    for i in _layers(config):
        state[_attn(i, "q_norm.weight")] = _around(stats.q_head[i], head_dim, g)
        state[_attn(i, "k_norm.weight")] = _around(stats.k_head[i], head_dim, g)
    cfg = {**config, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
           "head_dim": head_dim, "attention_bias": False}  # fmt: skip
    return cfg, state


def _rows_per_head(w: torch.Tensor, order: torch.Tensor, head_dim: int) -> torch.Tensor:
    heads = w.shape[0] // head_dim
    return w.reshape(heads, head_dim, -1)[:, order].reshape(w.shape)


def phi3(config: dict, state: dict, stats: Stats, *, longrope: bool = False) -> tuple[dict, dict]:
    """Fused QKV and gate/up; RoPE on the first 3/4 of each head (Phi-4-mini's partial rotary).
    SmolLM2 rotates all 32 pairs (i, i+32); its 24 fastest pairs become the rotated (j, j+24) and
    its 8 slowest (< 4e-4 rad/token, nearly still over the text) the unrotated tail. Pair j's
    frequency theta'^(-j/24) equals SmolLM2's theta^(-j/32) with theta' = theta^(3/4)."""
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    half, rot = head_dim // 2, head_dim * 3 // 8
    order = torch.tensor([*range(rot), *range(half, half + rot),
                          *range(rot, half), *range(half + rot, head_dim)])  # fmt: skip
    state = dict(state)
    for i in _layers(config):
        q = _rows_per_head(state.pop(_attn(i, "q_proj.weight")), order, head_dim)
        k = _rows_per_head(state.pop(_attn(i, "k_proj.weight")), order, head_dim)
        v = state.pop(_attn(i, "v_proj.weight"))
        state[_attn(i, "qkv_proj.weight")] = torch.cat([q, k, v])
        mlp = f"model.layers.{i}.mlp"
        gate, up = state.pop(f"{mlp}.gate_proj.weight"), state.pop(f"{mlp}.up_proj.weight")
        state[f"{mlp}.gate_up_proj.weight"] = torch.cat([gate, up])
    theta = config["rope_parameters"]["rope_theta"] ** 0.75
    context = config["max_position_embeddings"]
    rope = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.75}
    cfg = {**config, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
           "rope_parameters": rope, "original_max_position_embeddings": context,
           "sliding_window": None, "pad_token_id": None}  # fmt: skip
    if longrope:
        # Phi-3.5 / Phi-4-mini's 128k scaling: 16x the original context, per-pair factors (the
        # short ones apply below the original context, so over the whole text).
        pairs = 24
        rope.update(rope_type="longrope", original_max_position_embeddings=context,
                    short_factor=[1.0 + 0.08 * j for j in range(pairs)],
                    long_factor=[1.0 + 0.5 * j for j in range(pairs)])  # fmt: skip
        cfg["max_position_embeddings"] = 16 * context
    return cfg, state


def granite(config: dict, state: dict, stats: Stats) -> tuple[dict, dict]:
    """Granite's four multipliers, each undone by the weights it multiplies: the embedding is
    halved (x2 on input; the tied output gets x3 back in the final norm for the halving and the
    1/1.5 logit scale), o_proj/down_proj doubled (residual x0.5), Q scaled so attention_multiplier
    gives SmolLM2's 1/sqrt(head_dim)."""
    emb, resid, logits = 2.0, 0.5, 1.5
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    attn = 0.25
    state = dict(state)
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"] / emb
    state["model.norm.weight"] = state["model.norm.weight"] * emb * logits
    for i in _layers(config):
        state[_attn(i, "q_proj.weight")] = state[_attn(i, "q_proj.weight")] / (
            attn * math.sqrt(head_dim)
        )
        state[_attn(i, "o_proj.weight")] = state[_attn(i, "o_proj.weight")] / resid
        down = f"model.layers.{i}.mlp.down_proj.weight"
        state[down] = state[down] / resid
    cfg = {**config, "architectures": ["GraniteForCausalLM"], "model_type": "granite",
           "embedding_multiplier": emb, "residual_multiplier": resid,
           "attention_multiplier": attn, "logits_scaling": logits}  # fmt: skip
    return cfg, state


def olmo2(config: dict, state: dict, stats: Stats) -> tuple[dict, dict]:
    """No pre-norms: SmolLM2's input norms fold into Q/K/V and gate/up, divided by the residual
    stream's typical RMS there; full-width Q/K norms and the post-norms take SmolLM2's scales."""
    g = torch.Generator().manual_seed(4)
    hidden = config["hidden_size"]
    state = dict(state)
    for i in _layers(config):
        pre = f"model.layers.{i}"
        attn_norm = state.pop(f"{pre}.input_layernorm.weight") / stats.attn_in[i]
        for part in ("q", "k", "v"):
            key = _attn(i, f"{part}_proj.weight")
            state[key] = state[key] * attn_norm
        mlp_norm = state.pop(f"{pre}.post_attention_layernorm.weight") / stats.mlp_in[i]
        for part in ("gate", "up"):
            key = f"{pre}.mlp.{part}_proj.weight"
            state[key] = state[key] * mlp_norm
        kv = state[_attn(i, "k_proj.weight")].shape[0]
        state[_attn(i, "q_norm.weight")] = _around(stats.q[i], hidden, g)
        state[_attn(i, "k_norm.weight")] = _around(stats.k[i], kv, g)
        post_attn = _around(stats.attn_out[i] * _POST[0], hidden, g)
        state[f"{pre}.post_attention_layernorm.weight"] = post_attn
        state[f"{pre}.post_feedforward_layernorm.weight"] = _around(
            stats.mlp_out[i] * _POST[1], hidden, g
        )
    cfg = {**config, "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2",
           "attention_bias": False}  # fmt: skip
    return cfg, state


def gemma2(config: dict, state: dict, stats: Stats, embed: torch.Tensor, *, window: int,
           attn_cap: float, final_cap: float) -> tuple[dict, dict]:  # fmt: skip
    """Sandwich norms (SmolLM2's pre-norms; post-norms at SmolLM2's output scales), Gemma's stored
    norm weights (w - 1: Gemma multiplies by 1 + w), its sqrt(hidden) embedding normalizer undone
    by the embedding (the final norm restores the tied output), GELU for SiLU, the given softcaps
    and alternating sliding windows. ``embed`` is the embedding of the Gemma vocabulary."""
    hidden, head_dim = config["hidden_size"], stats.head_dim
    g = torch.Generator().manual_seed(5)
    state = dict(state)
    norm = math.sqrt(hidden)
    state["model.embed_tokens.weight"] = embed / norm
    state["model.norm.weight"] = state["model.norm.weight"] * norm - 1
    for i in _layers(config):
        pre = f"model.layers.{i}"
        state[f"{pre}.input_layernorm.weight"] = state[f"{pre}.input_layernorm.weight"] - 1
        ffn = state.pop(f"{pre}.post_attention_layernorm.weight")
        state[f"{pre}.pre_feedforward_layernorm.weight"] = ffn - 1
        post_attn = _around(stats.attn_out[i] * _POST[0], hidden, g)
        state[f"{pre}.post_attention_layernorm.weight"] = post_attn - 1
        post_ffw = _around(stats.mlp_out[i] * _POST[1], hidden, g)
        state[f"{pre}.post_feedforward_layernorm.weight"] = post_ffw - 1
        gate, up = f"{pre}.mlp.gate_proj.weight", f"{pre}.mlp.up_proj.weight"
        state[gate] = state[gate] / _GELU_FROM_SILU
        state[up] = state[up] * _GELU_FROM_SILU
    cfg = {**config, "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
           "head_dim": head_dim, "query_pre_attn_scalar": head_dim,
           "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
           "sliding_window": window, "attn_logit_softcapping": attn_cap,
           "final_logit_softcapping": final_cap, "vocab_size": embed.shape[0],
           "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
           # The converter writes no RoPE base for Gemma 2: files run at Gemma 2's 10000.
           "rope_parameters": {**config["rope_parameters"], "rope_theta": 10_000.0}}  # fmt: skip
    return cfg, state
