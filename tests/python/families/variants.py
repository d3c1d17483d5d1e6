"""The variants: each one's GGUF architecture once converted, its config changes and the layout
of SmolLM2's weights in its family (layouts.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from . import layouts

# Gemma 2's window is shorter than the text (256 positions) so that alternating windows matter,
# and its softcaps bite on these activations. Measured on the float32 checkpoint, leaving one out
# moves the logits by: no window, KL 0.015 and top-1 0.953; no attention cap, KL 0.019 and top-1
# 0.906; no final cap, KL 0.16.
GEMMA2_WINDOW = 32
GEMMA2_ATTN_CAP = 8.0
GEMMA2_FINAL_CAP = 30.0
F16 = ("f16",)


@dataclass(frozen=True)
class Spec:
    arch: str  # the converted file's general.architecture
    config: dict = field(default_factory=dict)  # over SmolLM2's config
    # (config, state, stats[, embed]) -> the family's (config, state); None: Llama's layout.
    layout: Callable | None = None
    vocab: str = "smollm2"  # or "gemma": a SentencePiece vocabulary (gemma_vocab.py)
    tokenizer_class: str | None = None  # written into tokenizer_config.json when set
    # The pre-tokenizer to name when the converter does not know the tokenizer's hash.
    pre: str | None = None
    # The converter's output types it is checked on: every family on F16 and Q8_0; a variant
    # that changes only RoPE metadata of its family (the same tensors) on F16.
    types: tuple[str, ...] = ("f16", "q8_0")


VARIANTS: dict[str, Spec] = {
    "llama": Spec("llama"),
    # Llama 3.1's scaling, with an original context short enough that most pairs are rescaled.
    "llama3_rope": Spec("llama", {
        "rope_parameters": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 65536,
    }, types=F16),
    "linear_rope": Spec("llama", {"rope_parameters": {"rope_type": "linear", "factor": 4.0}},
                        types=F16),
    # Qwen 2.5 / 3's long-context scaling; with this original context a third of the pairs blend.
    "yarn_rope": Spec("llama", {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 32768,
    }, types=F16),
    # No window: the converter writes none for Mistral, so with a window shorter than the text the
    # file itself differs from the checkpoint (64 over 256 positions: top-1 0.90, KL 0.058).
    "mistral": Spec("llama", {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
                              "sliding_window": None}, types=F16),
    # transformers loads any Qwen 2 checkpoint's tokenizer as Qwen2Tokenizer (Qwen's split regex
    # over the vocabulary), which the converter knows only by the real Qwen vocabulary's hash.
    "qwen2": Spec("qwen2", layout=layouts.qwen2, pre="qwen2"),
    "qwen3": Spec("qwen3", layout=layouts.qwen3),
    # Phi-4-mini's way of carrying a GPT-2 tokenizer, which the converter honours.
    "phi3": Spec("phi3", layout=layouts.phi3, tokenizer_class="GPT2Tokenizer"),
    "phi3_longrope": Spec("phi3", layout=partial(layouts.phi3, longrope=True),
                          tokenizer_class="GPT2Tokenizer", types=F16),
    "gemma2": Spec("gemma2", vocab="gemma", layout=partial(
        layouts.gemma2, window=GEMMA2_WINDOW, attn_cap=GEMMA2_ATTN_CAP,
        final_cap=GEMMA2_FINAL_CAP)),
    "granite": Spec("granite", layout=layouts.granite),
    "olmo2": Spec("olmo2", layout=layouts.olmo2),
}  # fmt: skip
