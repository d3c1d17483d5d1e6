"""Every variant's checkpoint converts, and the file is the family the variant stands for, with
the family's parameters the checkpoint sets (the session's own conversions; no engine)."""

import math

import pytest

from .gguf_keys import scalars
from .variants import GEMMA2_ATTN_CAP, GEMMA2_FINAL_CAP, GEMMA2_WINDOW, VARIANTS

# llama.cpp's file types of the converter's output types.
FILE_TYPES = {"f16": 1, "q8_0": 7}
# Metadata each family's file must carry (keys under the architecture's prefix), and the BPE
# pre-tokenizer it names ("default": a SentencePiece vocabulary).
EXPECTED = {
    "qwen2": ({}, "qwen2"),
    "qwen3": ({"attention.key_length": 64}, "smollm"),
    "phi3": ({"rope.dimension_count": 48, "attention.sliding_window": 0}, "smollm"),
    "gemma2": ({"attn_logit_softcapping": GEMMA2_ATTN_CAP,
                "final_logit_softcapping": GEMMA2_FINAL_CAP,
                "attention.sliding_window": GEMMA2_WINDOW}, "default"),
    "granite": ({"embedding_scale": 2.0, "residual_scale": 0.5, "attention.scale": 0.25,
                 "logit_scale": 1.5}, "smollm"),
    "olmo2": ({}, "smollm"),
    # The converter's LongRoPE attention factor: sqrt(1 + ln 16 / ln 8192).
    "phi3_longrope": ({"rope.dimension_count": 48, "rope.scaling.attn_factor": math.sqrt(17 / 13),
                       "rope.scaling.original_context_length": 8192}, "smollm"),
    "yarn_rope": ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                   "rope.scaling.original_context_length": 8192}, "smollm"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_converts_to_its_family(name, variant_factory):
    variant = variant_factory(name)
    # A real model's predictions: they vary along the text.
    assert len(set(variant.hf_logits.argmax(-1).tolist())) > 20
    arch = VARIANTS[name].arch
    for outtype in VARIANTS[name].types:
        fields = scalars(variant.gguf(outtype))
        assert fields["general.architecture"] == arch
        assert fields["general.file_type"] == FILE_TYPES[outtype]
    keys, pre = EXPECTED.get(name, ({}, "smollm"))
    assert fields["tokenizer.ggml.pre"] == pre
    for key, want in keys.items():
        got = fields[f"{arch}.{key}"]
        assert got == (want if isinstance(want, str) else pytest.approx(want)), key
