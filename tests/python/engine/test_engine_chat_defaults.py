"""A model's chat defaults come from its engine family: the pieces that end a turn (generation
stops at them) and the template used where the file carries none (the Gemma 3 GGUF has none)."""

from __future__ import annotations

import jinja2
from offgraph_kv.gguf_model import family_chat_defaults


def test_gemma3_family_ends_turns_and_renders_a_chat(gemma_engine):
    ends, template = family_chat_defaults("gemma3")
    assert gemma_engine.turn_ends == ends == ("<end_of_turn>",)
    assert gemma_engine.default_chat_template == template
    text = jinja2.Template(template).render(
        bos_token="<bos>",
        add_generation_prompt=True,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi "},
        ],
    )
    # The system text goes into the first user turn (Gemma has no system role).
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    # A turn end that the vocabulary holds stops generation like eos.
    assert gemma_engine.tokenizer.token_to_id("<end_of_turn>") in gemma_engine.eos_token_ids


def test_llama_family_ends_turns_in_every_llama_format(smollm2_engine):
    ends, template = family_chat_defaults("llama")
    assert smollm2_engine.turn_ends == ends
    assert set(ends) == {"<|im_end|>", "<|eot_id|>", "<|endoftext|>"}
    # No fallback template: Llama files carry their own.
    assert template is None and smollm2_engine.default_chat_template is None
    assert smollm2_engine.chat_template
    tok = smollm2_engine.tokenizer
    for piece in ("<|im_end|>", "<|endoftext|>"):
        assert tok.token_to_id(piece) in smollm2_engine.eos_token_ids


FAMILIES = ["llama", "gemma3", "gemma2", "qwen2", "qwen3", "phi3", "granite", "olmo2"]


def test_unknown_or_no_family_gives_every_turn_end_and_no_template():
    every = set().union(*(family_chat_defaults(f)[0] for f in FAMILIES))
    assert {"<|im_end|>", "<end_of_turn>", "<|end|>", "<|end_of_text|>"} <= every
    for name in (None, "mamba", ""):
        ends, template = family_chat_defaults(name)
        assert set(ends) == every
        assert template is None
    # A Hugging Face model_type names its family too.
    assert family_chat_defaults("gemma3_text") == family_chat_defaults("gemma3")


def test_each_family_names_its_own_turn_end():
    own = {"qwen2": "<|im_end|>", "qwen3": "<|im_end|>", "phi3": "<|end|>",
           "gemma2": "<end_of_turn>", "granite": "<|end_of_text|>",
           "olmo2": "<|endoftext|>"}  # fmt: skip
    for family, piece in own.items():
        ends, template = family_chat_defaults(family)
        assert piece in ends, family
        # A fallback template, where the family has one, ends its turns with that piece.
        assert template is None or piece in template, family
