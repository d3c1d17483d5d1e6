"""Tool calls in a model's output: which syntax a chat template teaches, and a streaming parser
that turns that syntax back into OpenAI ``tool_calls``.

Syntaxes (:data:`SYNTAXES`):

* ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number, text
  around them is content (Qwen 2/2.5/3, Hermes, and the fallback this server teaches a template
  without tool support);
* ``llama3``: the reply is one JSON object ``{"name": ..., "parameters": {...}}`` (after an
  optional ``<|python_tag|>``; several separated by ``;``), as Llama 3.1-3.3's templates teach;
* ``mistral``: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}`` objects, or the
  newer ``[TOOL_CALLS]name[ARGS]{...}``.

:class:`ToolCallParser` is fed the reply's text in pieces of any size and gives events:
``("content", text)``, ``("call", index, id, name)`` once a call's name is known, and
``("args", index, text)``: the call's arguments as the model writes them (their concatenation is
the call's ``function.arguments``). Feeding the whole text at once gives the same events'
concatenation, so a whole reply and a stream agree. Arguments are the model's own JSON text: as
OpenAI's docs say of theirs, a client validates them (``tool_choice`` ``required`` or a named
function constrains them to the schema).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = ["SYNTAXES", "Call", "ToolCallParser", "new_call_id", "special_pieces", "syntax_for"]

SYNTAXES = ("hermes", "llama3", "mistral")

_WS = " \t\r\n"
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"


def syntax_for(template: str | None) -> tuple[str, bool]:
    """``(syntax, native)``: the tool-call syntax ``template`` teaches, and whether it renders
    ``tools`` itself. A template with no tool support (or one whose syntax is not known here)
    gets ``("hermes", False)``: the server describes the tools in a system block of its own."""
    if not template:
        return "hermes", False
    if MISTRAL_CALLS in template:
        syntax = "mistral"
    elif HERMES_OPEN in template:
        syntax = "hermes"
    elif PYTHON_TAG in template or ("ipython" in template and '"parameters"' in template):
        syntax = "llama3"
    else:
        return "hermes", False
    return syntax, "tools" in _variables(template)


def _variables(template: str) -> set[str]:
    import jinja2
    from jinja2 import meta

    try:
        return set(meta.find_undeclared_variables(jinja2.Environment().parse(template)))
    except jinja2.TemplateError:
        return set()


def special_pieces(syntax: str) -> tuple[str, ...]:
    """The syntax's markers, which a tokenizer may hold as special tokens that decoding drops:
    the reply's text keeps them where the model wrote them."""
    return {
        "hermes": (HERMES_OPEN, HERMES_CLOSE),
        "llama3": (PYTHON_TAG,),
        "mistral": (MISTRAL_CALLS, MISTRAL_ARGS),
    }[syntax]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""


# -- a JSON scanner over a prefix of the text ------------------------------------------------

_INCOMPLETE = -1  # the text ends before the value does


class _Bad(Exception):
    """Not the JSON a call is written in (at this position)."""


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _string_end(s: str, i: int) -> int:
    j = i + 1
    while j < len(s):
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        if c < " ":
            raise _Bad
        j += 1
    return _INCOMPLETE


def _value_end(s: str, i: int) -> int:
    """The end of the JSON value at ``s[i]``, or :data:`_INCOMPLETE`."""
    c = s[i]
    if c == '"':
        return _string_end(s, i)
    if c in "{[":
        stack, j = [], i
        while j < len(s):
            c = s[j]
            if c == '"':
                j = _string_end(s, j)
                if j == _INCOMPLETE:
                    return j
                continue
            if c in "{[":
                stack.append("}" if c == "{" else "]")
            elif c in "}]":
                if c != stack.pop():
                    raise _Bad
                if not stack:
                    return j + 1
            j += 1
        return _INCOMPLETE
    j = i
    while j < len(s) and (s[j].isalnum() or s[j] in "+-."):
        j += 1
    if j == len(s):
        return _INCOMPLETE
    try:
        json.loads(s[i:j])
    except ValueError:
        raise _Bad from None
    return j


@dataclass
class _Scan:
    name: str | None = None
    args: tuple[int, int] | None = None  # the arguments value's span (end: where the text ends)
    args_done: bool = False
    end: int = _INCOMPLETE  # past the object's closing brace


def _scan_object(s: str, arg_keys: tuple[str, ...], first_keys: tuple[str, ...] | None) -> _Scan:
    """What the call object at the start of ``s`` says so far (raises :class:`_Bad`)."""
    out = _Scan()
    i = _ws(s, 0)
    if i == len(s):
        return out
    if s[i] != "{":
        raise _Bad
    i, first = i + 1, True
    while True:
        i = _ws(s, i)
        if i == len(s):
            return out
        if s[i] == "}" and first:
            out.end = i + 1
            return out
        if s[i] != '"':
            raise _Bad
        k = _string_end(s, i)
        if k == _INCOMPLETE:
            return out
        key = json.loads(s[i:k])
        if first and first_keys is not None and key not in first_keys:
            raise _Bad
        first = False
        i = _ws(s, k)
        if i == len(s):
            return out
        if s[i] != ":":
            raise _Bad
        i = _ws(s, i + 1)
        if i == len(s):
            return out
        v = _value_end(s, i)
        if key == "name":
            if v == _INCOMPLETE:
                return out
            name = json.loads(s[i:v])
            if not isinstance(name, str) or not name:
                raise _Bad
            out.name = name
        elif key in arg_keys:
            out.args = (i, len(s) if v == _INCOMPLETE else v)
            out.args_done = v != _INCOMPLETE
        if v == _INCOMPLETE:
            return out
        i = _ws(s, v)
        if i == len(s):
            return out
        if s[i] == "}":
            out.end = i + 1
            return out
        if s[i] != ",":
            raise _Bad
        i += 1


def _held(buf: str, marker: str) -> int:
    """How many characters at the end of ``buf`` may be the start of ``marker``."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


# -- the streaming parser -------------------------------------------------------------------------


class ToolCallParser:
    """The tool calls in a reply written in ``syntax``, fed in pieces (see the module's doc).
    ``max_calls`` (``parallel_tool_calls: false``: 1) ends the reply after that many calls:
    :attr:`closed` tells the caller to stop generating."""

    def __init__(self, syntax: str, max_calls: int | None = None):
        if syntax not in SYNTAXES:
            raise ValueError(f"tool-call syntax: expected one of {SYNTAXES}, got {syntax!r}")
        self.syntax = syntax
        self.max_calls = max_calls
        self.calls: list[Call] = []
        self.content = ""
        self.closed = False
        self._buf = ""  # text not consumed yet
        self._mode = "start" if syntax == "llama3" else "content"
        self._ws = ""  # content's trailing whitespace, held: dropped if a call follows
        self._named = False  # the current call's name was given out
        self._raw = ""  # the marker the current call started with (content, if it is not one)
        self._sent = 0  # characters of the current call's arguments text given out
        self._array = False  # mistral: the calls are a JSON array (else name[ARGS]{...})
        self._out: list[tuple[Any, ...]] = []

    # -- events ----------------------------------------------------------------------------------

    def _text(self, text: str) -> None:
        body = text.rstrip(_WS)
        if not body:
            self._ws += text
            return
        text, self._ws = self._ws + body, text[len(body) :]
        self.content += text
        if self._out and self._out[-1][0] == "content":
            self._out[-1] = ("content", self._out[-1][1] + text)
        else:
            self._out.append(("content", text))

    def _call(self, name: str) -> None:
        self._ws = ""
        self.calls.append(Call(new_call_id(), name))
        self._named, self._sent = True, 0
        self._out.append(("call", len(self.calls) - 1, self.calls[-1].id, name))

    def _args(self, text: str) -> None:
        if text:
            self.calls[-1].arguments += text
            self._out.append(("args", len(self.calls) - 1, text))

    # -- feeding ---------------------------------------------------------------------------------

    def feed(self, text: str) -> list[tuple[Any, ...]]:
        """The events ``text`` (the next piece of the reply) completes."""
        if not self.closed:
            self._buf += text
            self._run(final=False)
        out, self._out = self._out, []
        return out

    def finish(self) -> list[tuple[Any, ...]]:
        """The events of what is left once the reply is over."""
        if not self.closed:
            self._run(final=True)
        self.closed = True
        if not self.calls and self._ws:  # held whitespace was content after all
            self.content += self._ws
            self._out.append(("content", self._ws))
        self._ws = ""
        out, self._out = self._out, []
        return out

    def _run(self, final: bool) -> None:
        while not self.closed:
            before = (self._mode, len(self._buf))
            getattr(self, f"_{self._mode}")(final)
            if (self._mode, len(self._buf)) == before:
                return

    def _give_back(self) -> None:
        """A call that started is not one: its marker and its text so far are content."""
        self._text(self._raw + self._buf)
        self._buf, self._raw = "", ""
        self._mode = "plain" if self.syntax == "llama3" else "content"

    def _open(self, raw: str, rest: str, mode: str = "object") -> None:
        self._raw, self._buf, self._mode, self._named = raw, rest, mode, False

    def _start(self, final: bool) -> None:  # llama3: a reply that opens with a JSON object
        s = self._buf.lstrip(_WS)
        if s.startswith(PYTHON_TAG):
            self._open(self._buf[: len(self._buf) - len(s) + len(PYTHON_TAG)], s[len(PYTHON_TAG) :])
        elif s.startswith("{"):
            self._open(self._buf[: len(self._buf) - len(s)], s)
        elif final or (s and not PYTHON_TAG.startswith(s)):
            self._mode = "content"

    def _content(self, final: bool) -> None:
        m = {"hermes": HERMES_OPEN, "llama3": PYTHON_TAG, "mistral": MISTRAL_CALLS}[self.syntax]
        i = self._buf.find(m)
        if i >= 0:
            self._text(self._buf[:i])
            self._open(
                m, self._buf[i + len(m) :], "mistral" if self.syntax == "mistral" else "object"
            )
            return
        keep = 0 if final else _held(self._buf, m)
        self._text(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]

    def _plain(self, final: bool) -> None:  # everything left is content
        self._text(self._buf)
        self._buf = ""

    def _object(self, final: bool) -> None:
        first = ("name", "type") if self.syntax == "llama3" else None
        keys = ("parameters", "arguments") if self.syntax == "llama3" else ("arguments",)
        try:
            scan = _scan_object(self._buf, keys, first)
        except _Bad:
            scan = None
        if scan is None or (final and scan.end == _INCOMPLETE):
            if self._named:
                self._end_call(None)
            else:
                self._give_back()
            return
        if scan.name is None:
            return
        if not self._named:
            self._call(scan.name)
        self._stream_args(scan)
        if scan.end != _INCOMPLETE:
            self._end_call(scan.end)

    def _stream_args(self, scan: _Scan) -> None:
        if scan.args is None:
            if scan.end != _INCOMPLETE:
                self._args("{}")
            return
        a, b = scan.args
        self._value(self._buf[a:b], scan.args_done)

    def _value(self, text: str, done: bool) -> None:
        """The arguments' text so far: an object's text as it grows; a JSON string (arguments
        written as a string) whole and decoded."""
        if text.startswith('"'):
            if done and self._sent == 0:
                decoded = json.loads(text)
                self._args(decoded if isinstance(decoded, str) and decoded else "{}")
                self._sent = len(text)
            return
        self._args(text[self._sent :])
        self._sent = len(text)

    def _end_call(self, end: int | None) -> None:
        """The current call is over (``end``: past its object; ``None``: malformed, and its rest
        up to a closing marker is dropped)."""
        self._raw, self._named = "", False
        if end is None or self.syntax == "llama3" or not self._array and self.syntax == "mistral":
            self._full()  # else once the call's closing marker is read
        if end is None:
            i = self._buf.find(HERMES_CLOSE) if self.syntax == "hermes" else -1
            self._buf = "" if i < 0 else self._buf[i + len(HERMES_CLOSE) :]
            self._mode = "plain" if self.syntax == "llama3" else "content"
            return
        self._buf = self._buf[end:]
        if self.syntax == "mistral":
            self._mode = "mistral_array" if self._array else "content"
        else:
            self._mode = {"hermes": "close", "llama3": "next"}[self.syntax]

    def _full(self) -> None:
        """No more calls once ``max_calls`` are read (their closing markers included: a
        constrained reply ends at the same token)."""
        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            self.closed = True

    def _close(self, final: bool) -> None:  # hermes: after a call's object, its closing tag
        s = self._buf.lstrip(_WS)
        if s.startswith(HERMES_CLOSE):
            self._buf, self._mode = s[len(HERMES_CLOSE) :], "content"
            self._full()
        elif final or (s and not HERMES_CLOSE.startswith(s)):
            self._mode = "content"
            self._full()

    def _next(self, final: bool) -> None:  # llama3: ";" and another call, or the rest is text
        s = self._buf.lstrip(_WS + ";")
        if s.startswith("{"):
            self._open("", s)
        elif s or final:
            self._mode = "plain"

    def _mistral(self, final: bool) -> None:  # after [TOOL_CALLS]
        s = self._buf.lstrip(_WS)
        if s.startswith("["):
            self._array = True
            self._open(self._raw + self._buf[: len(self._buf) - len(s) + 1], s[1:])
            return
        i = s.find(MISTRAL_ARGS)
        if i < 0:
            if final or len(s) > 64 or any(c in s for c in _WS + '{"'):
                self._give_back()
            return
        name = s[:i]
        if not name or not all(c.isalnum() or c in "_-." for c in name):
            self._give_back()
            return
        self._array = False
        self._call(name)
        self._buf, self._mode = s[i + len(MISTRAL_ARGS) :], "mistral_args"

    def _mistral_args(self, final: bool) -> None:  # the JSON after [ARGS]
        s = self._buf.lstrip(_WS)
        lead = len(self._buf) - len(s)
        try:
            end = _value_end(s, 0) if s else _INCOMPLETE
        except _Bad:
            end = None
        if end is None or (final and end == _INCOMPLETE):
            self._end_call(None)
            return
        self._value(s if end == _INCOMPLETE else s[:end], end != _INCOMPLETE)
        if end != _INCOMPLETE:
            self._end_call(lead + end)

    def _mistral_array(self, final: bool) -> None:  # after an object of the array: "," or "]"
        s = self._buf.lstrip(_WS)
        if s.startswith(","):
            self._full()
            self._open("", s[1:])
        elif s.startswith("]"):
            self._buf, self._mode = s[1:], "content"
            self._full()
        elif s or final:
            self._mode = "content"
            self._full()
