"""Every variant's checkpoint converts, and the file is the family the variant stands for, with
the family's parameters the checkpoint sets (the session's own conversions; no engine)."""

import pytest
from gguf import GGUFReader

from .variants import GEMMA2_ATTN_CAP, GEMMA2_FINAL_CAP, GEMMA2_WINDOW, VARIANTS

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
}  # fmt: skip


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_converts_to_its_family(name, variant_factory):
    variant = variant_factory(name)
    # A real model's predictions: they vary along the text.
    assert len(set(variant.hf_logits.argmax(-1).tolist())) > 20
    fields = GGUFReader(variant.gguf("f16")).fields
    arch = VARIANTS[name].arch
    assert fields["general.architecture"].contents() == arch
    keys, pre = EXPECTED.get(name, ({}, "smollm"))
    assert fields["tokenizer.ggml.pre"].contents() == pre
    for key, want in keys.items():
        assert fields[f"{arch}.{key}"].contents() == pytest.approx(want), key
