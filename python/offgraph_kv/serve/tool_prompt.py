"""Tools in a chat request: their definitions and ``tool_choice`` checked, and the grammars of
their calls; the chat a template renders with them is :mod:`.tool_chat`'s (re-exported here).

A template that renders ``tools`` itself (Qwen, Llama 3.1+, Mistral: see
:func:`.tools.syntax_for`) gets transformers' conventions: ``tools=[{"type": "function",
"function": {...}}]``, assistant turns' ``tool_calls`` with ``function.arguments`` as an object,
and ``tool`` turns with ``tool_call_id``. A template without tool support (SmolLM2, Gemma, Phi)
gets the tools in a system block of this server's that teaches Hermes-style calls
(``<tool_call>{"name": ..., "arguments": ...}</tool_call>``), earlier calls written in that
syntax in their assistant turns, and tool results as user turns in ``<tool_response>`` tags.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ..batch.constraint import JSON_LAYOUT
from .errors import ApiError
from .tool_chat import fallback_block, template_chat

__all__ = [
    "Tool",
    "ToolChoice",
    "call_constraint",
    "call_grammar",
    "check_tools",
    "fallback_block",
    "template_chat",
    "tool_dicts",
]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class _Forbid(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionDef(_Forbid):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Forbid):
    type: Literal["function"]
    function: FunctionDef


class _Named(_Forbid):
    name: str


class ToolChoice(_Forbid):
    type: Literal["function"]
    function: _Named


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code="invalid_value")


def _check_schema(schema: Any, where: str) -> None:
    """A function's ``parameters``: a JSON Schema of an object (what OpenAI accepts)."""
    if schema.get("type", "object") != "object":
        raise _bad(where, f"the parameters' schema must be of type object, got {schema['type']!r}")
    props = schema.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(v, dict) for v in props.values()):
        raise _bad(where, "properties must map each name to a schema object")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _bad(where, "required must be a list of property names")
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as e:
        raise _bad(where, f"not JSON: {e}") from None


def check_tools(
    tools: list[Tool] | None, choice: str | ToolChoice | None, parallel: bool | None
) -> None:
    """Across the fields: unique valid names, schemas of objects, a named ``tool_choice`` among
    the tools, no ``tool_choice`` (but ``none``) or ``parallel_tool_calls`` without tools."""
    if tools is None:
        if choice is not None and choice != "none":
            raise _bad("tool_choice", "only allowed when tools are given")
        if parallel is not None:
            raise _bad("parallel_tool_calls", "only allowed when tools are given")
        return
    if not tools:
        raise _bad("tools", "an empty list; omit tools instead")
    seen: set[str] = set()
    for i, t in enumerate(tools):
        f = t.function
        if not _NAME.match(f.name):
            raise _bad(f"tools.{i}.function.name", f"{f.name!r} is not 1-64 of a-z, A-Z, 0-9, _, -")
        if f.name in seen:
            raise _bad(f"tools.{i}.function.name", f"{f.name!r} is given twice")
        seen.add(f.name)
        if f.parameters is not None:
            _check_schema(f.parameters, f"tools.{i}.function.parameters")
    if isinstance(choice, ToolChoice) and choice.function.name not in seen:
        raise _bad("tool_choice", f"function {choice.function.name!r} is not among the tools")


def tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    """The tools as transformers passes them to a template."""
    return [t.model_dump(exclude_none=True) for t in tools]


def _call_schema(f: FunctionDef, key: str) -> dict[str, Any]:
    """One call's JSON: ``{"name": <f's name>, key: <arguments valid for f>}``, in that order
    (the name streams first). The parameters' ``$defs`` move to the root, where their
    ``#/$defs/...`` references point."""
    # No parameters: an empty argument list, as OpenAI reads a function without them.
    params = dict(
        f.parameters or {"type": "object", "properties": {}, "additionalProperties": False}
    )
    root: dict[str, Any] = {"x-guidance": {**JSON_LAYOUT, "lenient": not f.strict}}
    for defs in ("$defs", "definitions"):
        if defs in params:
            root[defs] = params.pop(defs)
    return {
        **root,
        "type": "object",
        "properties": {"name": {"const": f.name}, key: params},
        "required": ["name", key],
        "additionalProperties": False,
    }


EOM = "<|eom_id|>"  # the end of a Llama 3.1+ turn that called tools, a special token

# Free text of an ``auto`` reply: any text (no special tokens, which a regex never matches).
_TEXT = "TEXT: /(?s:.*)/"


def call_grammar(
    tools: list[Tool],
    names: list[str],
    parallel: bool,
    syntax: str,
    markers: dict[str, int],
    lazy: bool = False,
) -> str:
    """A Lark grammar (llguidance's dialect) of a reply that is only calls, in ``syntax``, of
    the functions ``names`` with arguments valid for their schemas; one call, or several
    (``parallel``). ``markers``: the syntax's markers that are single tokens (text -> id).

    ``lazy`` (``tool_choice: "auto"``): the reply may be any text instead; once it writes the
    syntax's opener (``<tool_call>``, ``[TOOL_CALLS]``; Llama 3: a reply that starts with
    ``{`` or ``<|python_tag|>``), the rest must be valid calls, as above."""

    def lit(text: str) -> str:
        return f"<[{markers[text]}]>" if text in markers else json.dumps(text)

    key = "parameters" if syntax == "llama3" else "arguments"
    rules = [
        f"b{i}: %json {json.dumps(_call_schema(t.function, key), ensure_ascii=False)}"
        for i, t in enumerate(tools)
        if t.function.name in names
    ]
    body = "body: " + " | ".join(r.split(":", 1)[0] for r in rules)
    if syntax == "llama3":
        call = "call: body"
        calls = 'call ("; " call)*' if parallel else "call"
        if EOM in markers:  # Llama 3.1+ ends a turn of calls with <|eom_id|>
            calls += f" {lit(EOM)}?"
        if not lazy:
            return "\n".join([f"start: {calls}", call, body, *rules])
        # Text is a reply that does not open like a call (Llama's templates teach a bare object).
        opener = "<|python_tag|>"
        not_call = "\\{" if opener in markers else "(\\{|<\\|python_tag\\|>)"
        text = f"TEXT: /(?s:.*)/ & ~/{not_call}(?s:.*)/"
        start = f"start: TEXT | {lit(opener)}? {calls}"
        return "\n".join([start, text, call, body, *rules])
    if syntax == "hermes":
        opener, rest = "<tool_call>", f'"\\n" body "\\n" {lit("</tool_call>")}'
        one = f"call: {lit(opener)} {rest}"
        # A newline after the last call may end the reply (small models write one).
        more = ' ("\\n" call)* "\\n"?' if parallel else ""
    else:
        opener, rest = "[TOOL_CALLS]", '"[" body'
        one = ""
        rest += ' (", " body)* "]"' if parallel else ' "]"'
        more = ""
    if not lazy:
        first = "call" if syntax == "hermes" else f"{lit(opener)} {rest}"
        return "\n".join(r for r in [f"start: {first}{more}", one, body, *rules] if r)
    # Written as text, the opener ends the shortest text that holds it (llguidance's lazy
    # lexeme); as a special token (which no text holds), the text ends where it comes. A
    # marker token that is not special is text too, so the lazy form covers it.
    head = f"head: TEXT {lit(opener)} | head_text" if opener in markers else "head: head_text"
    head += f"\nhead_text[lazy]: TEXT {json.dumps(opener)}"
    start = f"start: TEXT | head {rest}{more}"
    return "\n".join(r for r in [start, head, _TEXT, one, body, *rules] if r)


def call_constraint(req: Any, face: Any) -> Any:
    """The :class:`~offgraph_kv.batch.Constraint` that ``req``'s tools ask of its reply
    (``None``: none), compiled for ``face``'s syntax: ``required`` or a named function, only
    calls; ``auto`` (or no ``tool_choice``), text or calls, a call valid once it opens (not
    when ``response_format`` constrains the reply: it wins). A 400 naming ``tool_choice``
    when a forced call and ``response_format`` both constrain the reply, naming ``tools``
    when a schema does not compile."""
    choice = req.tool_choice
    if not req.tools or choice == "none":
        return None
    forced = choice == "required" or isinstance(choice, ToolChoice)
    if req.constraint is not None:
        if forced:
            raise _bad("tool_choice", "a forced call and response_format both constrain the reply")
        return None
    from .._errors import InvalidArgumentError
    from ..batch.constraint import Constraint

    names = (
        [choice.function.name]
        if isinstance(choice, ToolChoice)
        else [t.function.name for t in req.tools]
    )
    syntax = face.tool_syntax[0]
    markers = {text: tid for tid, text in face.marker_ids().items()}
    if syntax == "llama3" and (eom := face._piece_id(EOM)) is not None:
        markers[EOM] = eom
    # A named function is called once; otherwise one or more unless parallel is false.
    parallel = not isinstance(choice, ToolChoice) and req.parallel_tool_calls is not False
    grammar = call_grammar(req.tools, names, parallel, syntax, markers, lazy=not forced)
    try:
        return Constraint.lark(grammar)
    except InvalidArgumentError as e:
        raise _bad("tools", f"a function's parameters do not compile: {e}") from None
    except ImportError as e:
        if not forced:  # auto promises no call; without the grammar engine it runs free
            return None
        raise ApiError(
            400, f"tool_choice: {e}", param="tool_choice", code="unsupported_parameter"
        ) from None
