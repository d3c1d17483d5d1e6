"""Test helpers shared by the test modules: tiny random-weight model configs (built here, no
downloads) and the greedy generate-and-compare against ``model.generate`` with DynamicCache.

Importable from every test directory: pytest puts ``tests/python`` (this conftest's directory)
on ``sys.path``.
"""

from __future__ import annotations

import torch
from transformers import (
    DynamicCache,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

# The shape every tiny model shares: 4 query heads on 2 KV heads of 16, vocabulary 128.
TINY = dict(
    num_hidden_layers=2,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=128,
)

TIE = 5e-3  # logits margin under which the top-2 of the reference count as a near-tie


def tiny_config(name: str, **over):
    """The config of tiny model ``name`` (llama, mistral, gemma2, gemma3); ``over`` overrides
    TINY's fields. Sliding-window families get a window of 8."""
    kw = {**TINY, **over}
    if name == "llama":
        return LlamaConfig(**kw)
    kw.setdefault("sliding_window", 8)
    if name == "mistral":
        return MistralConfig(**kw)
    if name == "gemma2":
        return Gemma2Config(**kw)
    if name == "gemma3":
        return Gemma3TextConfig(**kw)
    raise ValueError(name)


_CLASSES = {
    "llama": LlamaForCausalLM,
    "mistral": MistralForCausalLM,
    "gemma2": Gemma2ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
}


def tiny_model(name: str, dtype: torch.dtype = torch.float32, seed: int = 0, **over):
    """A tiny random-weight model (weights from ``seed``) in eval mode, with no eos and pad 0 so
    that ``generate`` runs its full length."""
    torch.manual_seed(seed)
    model = _CLASSES[name](tiny_config(name, **over)).to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


_REFS: dict = {}


def reference(model, prompt: list[int], n: int, eos=None) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and per-token logits of ``model.generate`` alone, with DynamicCache
    (computed once per model, prompt, length and eos set)."""
    key = (id(model), tuple(prompt), n, None if eos is None else tuple(sorted(eos)))
    if key not in _REFS:
        kw = {} if eos is None else {"eos_token_id": sorted(eos)}
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                cache=DynamicCache(config=model.config),
                max_new_tokens=n,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                **kw,
            )
        toks = out.sequences[0, len(prompt) :].tolist()
        if eos is not None:  # generate pads after an eos when the batch is done; cut there
            for i, t in enumerate(toks):
                if t in eos:
                    toks = toks[: i + 1]
                    break
        # The entry keeps the model alive, so its id is never reused by another model.
        _REFS[key] = (model, toks, [x[0] for x in out.logits])
    return _REFS[key][1:]


def assert_greedy_matches(ref: tuple[list[int], list[torch.Tensor]], got: list[int]) -> None:
    """``got`` equals the reference's tokens, except from a near-tie of the reference's top-2
    logits on (margin below TIE), where a batched forward may pick the second choice."""
    toks, logits = ref
    for i, (a, b) in enumerate(zip(toks, got)):
        if a != b:
            top = torch.topk(logits[i].float(), 2)
            margin = float(top.values[0] - top.values[1])
            assert b == int(top.indices[1]) and margin < TIE, (
                f"token {i}: generate gave {a}, the batch {b}; reference top-2 margin {margin}"
            )
            return  # a near-tie: the continuations may legitimately differ from here
    assert len(got) == len(toks), (got, toks)
