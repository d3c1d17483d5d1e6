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
import json
from collections.abc import Sequence
from typing import Any

from .._errors import InvalidArgumentError
from ..gguf_model import family_chat_defaults
from .tool_chat import template_chat
from .tools import special_pieces, syntax_for

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
    # transformers' tojson: plain JSON in the given key order (jinja's own escapes HTML and
    # sorts keys, which templates that render tools and arguments with it do not expect).
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    **special: str | None,
) -> str:
    """``template`` (Jinja, as a chat template is) rendered for ``messages`` with the
    generation prompt; ``tools`` as transformers passes them (left out when ``None``);
    ``special`` names the tokens it may use (``bos_token``, ``eos_token``).

    Raises:
        ValueError: the template refuses the messages, or is not valid Jinja.
    """
    import jinja2

    extra = {} if tools is None else {"tools": tools}
    try:
        return _template(template).render(
            messages=messages, add_generation_prompt=True, **extra, **special
        )
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template: {e}") from None


class _ToolFace:
    """What both faces do for tools: the syntax their template teaches, the chat the template
    gets (:func:`~.tool_chat.template_chat`), and the syntax's markers as token ids."""

    template: str | None

    @functools.cached_property
    def tool_syntax(self) -> tuple[str, bool]:
        """``(syntax, native)`` of :func:`~.tools.syntax_for` for this face's template."""
        return syntax_for(self.template if isinstance(self.template, str) else None)

    def _chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        syntax, native = self.tool_syntax
        return template_chat(messages, tools, native, syntax)

    def marker_ids(self) -> dict[int, str]:
        """The tool-call syntax's markers that are single tokens here: id -> text."""
        out = {}
        for piece in special_pieces(self.tool_syntax[0]):
            tid = self._piece_id(piece)
            if tid is not None:
                out[tid] = piece
        return out

    def _piece_id(self, piece: str) -> int | None:
        raise NotImplementedError


def _check_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidArgumentError(f"token ids: expected ints, got {type(t).__name__}")
        if not 0 <= t < vocab_size:
            raise InvalidArgumentError(f"token {t} is outside the vocabulary [0, {vocab_size})")
        out.append(t)
    return out


class GgufTokens(_ToolFace):
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

    def chat_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        if not self.template:
            raise ValueError("the model has no chat template")
        bos, eos = self._piece(self.tok.bos_token_id), self._piece(self.tok.eos_token_id)
        messages, tools = self._chat(messages, tools)
        text = render_chat(self.template, messages, tools, bos_token=bos, eos_token=eos)
        return self.encode(text, add_special_tokens=False)

    def _piece_id(self, piece: str) -> int | None:
        return self.tok.token_to_id(piece)

    def token_bytes(self, token_id: int) -> bytes:
        return bytes(self.tok.token_bytes(_check_ids([token_id], self.vocab_size)[0]))

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", "replace")


class HfTokens(_ToolFace):
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

    @property
    def template(self) -> str | None:
        return getattr(self.tok, "chat_template", None)

    def chat_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        messages, tools = self._chat(messages, tools)
        text = self.tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        return self.encode(text, add_special_tokens=False)

    def _piece_id(self, piece: str) -> int | None:
        tid = self.tok.get_vocab().get(piece)
        return None if tid is None else int(tid)

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
