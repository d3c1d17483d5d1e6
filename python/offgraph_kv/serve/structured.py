"""Structured output: the request fields that constrain a reply, as one
:class:`~offgraph_kv.batch.Constraint` (or ``None``), or a 400 naming the field.

* ``response_format`` (OpenAI's; on ``/v1/completions`` too, as an extension):
  ``{"type": "text"}`` (free), ``{"type": "json_object"}``, or
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``.
* Extensions, under the names vLLM and llama.cpp's server give them: ``guided_json`` (a
  schema), ``guided_regex``, ``guided_choice`` (a list of strings: the reply is one of them),
  ``guided_grammar`` (a Lark grammar, llguidance's dialect), llama.cpp's ``json_schema`` and
  ``grammar`` (GBNF, translated to Lark by llguidance).

At most one of them per request. Each is compiled here, on the request's way in: a schema,
regex or grammar that does not compile is a 400 before anything is queued.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .._errors import InvalidArgumentError
from ..batch.constraint import Constraint, require_llguidance
from .errors import ApiError

__all__ = ["FIELDS", "constraint_of"]

FIELDS = (
    "response_format",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "json_schema",
    "grammar",
)
"""The request fields that constrain a reply (declared by the request models)."""


def constraint_of(req: Any) -> Constraint | None:
    """The constraint ``req``'s fields ask for (``None``: a free reply), or :class:`ApiError`."""
    given = [(name, getattr(req, name, None)) for name in FIELDS]
    given = [(n, v) for n, v in given if v is not None and not _is_text_format(n, v)]
    if not given:
        return None
    if len(given) > 1:
        names = " and ".join(n for n, _ in given)
        raise _bad(given[1][0], f"{names} both constrain the reply; give one of them")
    name, value = given[0]
    try:
        return _BUILDERS[name](name, value)
    except ImportError as e:
        raise ApiError(400, f"{name}: {e}", param=name, code="unsupported_parameter") from None
    except InvalidArgumentError as e:
        raise _bad(name, str(e)) from None


def _bad(name: str, why: str) -> ApiError:
    return ApiError(400, f"{name}: {why}", param=name, code="invalid_value")


def _is_text_format(name: str, value: Any) -> bool:
    return name == "response_format" and isinstance(value, dict) and value == {"type": "text"}


def _response_format(name: str, value: Any) -> Constraint:
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidArgumentError("expected an object with a type")
    kind = value["type"]
    extra = set(value) - {"type", "json_schema"}
    if extra:
        raise InvalidArgumentError(f"unknown field {sorted(extra)[0]!r}")
    if kind == "json_object":
        return Constraint.json_object()
    if kind != "json_schema":
        raise InvalidArgumentError(
            f"type must be 'text', 'json_object' or 'json_schema', got {kind!r}"
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidArgumentError("json_schema: expected an object with name and schema")
    unknown = set(spec) - {"name", "schema", "strict", "description"}
    if unknown:
        raise InvalidArgumentError(f"json_schema: unknown field {sorted(unknown)[0]!r}")
    if not isinstance(spec.get("name"), str) or not re.fullmatch(
        r"[A-Za-z0-9_-]{1,64}", spec["name"]
    ):
        raise InvalidArgumentError("json_schema.name: expected 1 to 64 letters, digits, '_' or '-'")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidArgumentError(f"json_schema.strict: expected a boolean, got {strict!r}")
    schema = spec.get("schema", {})  # OpenAI's default: any JSON
    if not isinstance(schema, dict):
        raise InvalidArgumentError("json_schema.schema: expected a JSON schema object")
    return Constraint.json_schema(schema, strict=bool(strict))


def _schema(name: str, value: Any) -> Constraint:
    if not isinstance(value, (dict, str)):
        raise InvalidArgumentError("expected a JSON schema (an object)")
    return Constraint.json_schema(value, strict=False)


def _regex(name: str, value: Any) -> Constraint:
    if not isinstance(value, str):
        raise InvalidArgumentError("expected a regular expression (a string)")
    return Constraint.regex(value)


def _choice(name: str, value: Any) -> Constraint:
    if not (isinstance(value, list) and value and all(isinstance(v, str) for v in value)):
        raise InvalidArgumentError("expected a non-empty list of strings")
    # Lark's string literals take JSON's escapes: each choice verbatim.
    return Constraint.lark("start: " + " | ".join(json.dumps(v) for v in value))


def _lark(name: str, value: Any) -> Constraint:
    if not isinstance(value, str):
        raise InvalidArgumentError("expected a Lark grammar (a string)")
    return Constraint.lark(value)


def _gbnf(name: str, value: Any) -> Constraint:
    if not isinstance(value, str):
        raise InvalidArgumentError("expected a GBNF grammar (a string)")
    require_llguidance()
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        lark = gbnf_to_lark(value)
    except Exception as e:  # the translator's own parse errors
        raise InvalidArgumentError(str(e)) from None
    return Constraint.lark(lark)


_BUILDERS = {
    "response_format": _response_format,
    "guided_json": _schema,
    "guided_regex": _regex,
    "guided_choice": _choice,
    "guided_grammar": _lark,
    "json_schema": _schema,
    "grammar": _gbnf,
}
