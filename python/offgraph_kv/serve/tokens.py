"""The tokenizer face the app uses, the same for both engines: :class:`HfTokens` over a Hugging
Face tokenizer (the torch path), :class:`GgufTokens` over the GGUF's own tokenizer (the native
engine; no transformers). :func:`tokens_for` picks one for a tokenizer object.

Both give: ``encode(text, add_special_tokens=True)``; ``decode(ids)`` without special tokens (a
partial UTF-8 character at the end decodes to U+FFFD, which a stream holds back until the next
token completes it); ``chat_ids(messages)``: the chat template's text (generation prompt
added; it holds the special tokens it wants, BOS included) tokenized without adding more;
``stop_ids``: eos and the chat formats' turn ends; ``token_bytes(id)`` / ``token_text(id)``;
``vocab_size``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .._errors import InvalidArgumentError
from ..gguf_model import family_chat_defaults

__all__ = ["GgufTokens", "HfTokens", "render_chat", "tokens_for"]


@functools.lru_cache(maxsize=4)
def _template(source: str) -> Any:
    # A sandbox as Hugging Face renders chat templates in: a template from a file is data, and
    # trim_blocks/lstrip_blocks give the whitespace the templates are written for.
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def render_chat(template: str, messages: list[dict[str, str]], **special: str | None) -> str:
    """``template`` (Jinja, as a chat template is) rendered for ``messages`` with the
    generation prompt; ``special`` names the tokens it may use (``bos_token``, ``eos_token``).

    Raises:
        ValueError: the template refuses the messages, or is not valid Jinja.
    """
    import jinja2

    try:
        return _template(template).render(messages=messages, add_generation_prompt=True, **special)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template: {e}") from None


def _check_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidArgumentError(f"token ids: expected ints, got {type(t).__name__}")
        if not 0 <= t < vocab_size:
            raise InvalidArgumentError(f"token {t} is outside the vocabulary [0, {vocab_size})")
        out.append(t)
    return out


class GgufTokens:
    """The face of a GGUF's tokenizer (:class:`~offgraph_kv.gguf_model.GgufTokenizer`): its chat
    template is the file's, else ``template`` (the model family's, which the model gives: the
    Gemma 3 GGUF has none); generation stops at eos and the family's turn ends."""

    def __init__(self, tok: Any, template: str | None = None):
        self.tok = tok
        self.template = tok.chat_template or template
        self.vocab_size = int(tok.vocab_size)
        ids = {tok.eos_token_id} | {tok.token_to_id(p) for p in tok.turn_ends}
        self.stop_ids = frozenset(int(i) for i in ids if i is not None)

    def _piece(self, tid: int | None) -> str | None:
        return None if tid is None else self.tok.token_bytes(tid).decode("utf-8", "replace")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(_check_ids(ids, self.vocab_size), True)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        if not self.template:
            raise ValueError("the model has no chat template")
        bos, eos = self._piece(self.tok.bos_token_id), self._piece(self.tok.eos_token_id)
        text = render_chat(self.template, messages, bos_token=bos, eos_token=eos)
        return self.encode(text, add_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        return bytes(self.tok.token_bytes(_check_ids([token_id], self.vocab_size)[0]))

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", "replace")


class HfTokens:
    """The face of a Hugging Face tokenizer (the torch path), as the server always used it."""

    def __init__(self, tok: Any):
        self.tok = tok
        self.vocab_size = len(tok)
        ids = set() if tok.eos_token_id is None else {int(tok.eos_token_id)}
        vocab = tok.get_vocab()
        # Its model is not the engine's: every family's turn ends that the vocabulary has.
        ids |= {int(vocab[t]) for t in family_chat_defaults()[0] if t in vocab}
        self.stop_ids = frozenset(ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        # Unchecked, as the server always decoded: a model's vocabulary may be padded past the
        # tokenizer's, and an id of the padding decodes to nothing rather than failing a stream.
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.encode(text, add_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        return self.tok.decode(_check_ids([token_id], self.vocab_size))

    def token_bytes(self, token_id: int) -> bytes:
        return self.token_text(token_id).encode("utf-8")


def tokens_for(tok: Any, template: str | None = None) -> GgufTokens | HfTokens | None:
    """The face of ``tok``: ``None`` for no tokenizer, a face as it is, a GGUF tokenizer's or a
    Hugging Face one's (``template``: the chat template where the GGUF carries none)."""
    if tok is None or isinstance(tok, (GgufTokens, HfTokens)):
        return tok
    if callable(getattr(tok, "token_bytes", None)) and hasattr(tok, "is_special"):
        return GgufTokens(tok, template)
    if callable(getattr(tok, "apply_chat_template", None)):
        return HfTokens(tok)
    raise TypeError(f"tokenizer: expected a GGUF or Hugging Face tokenizer, got {type(tok)}")
