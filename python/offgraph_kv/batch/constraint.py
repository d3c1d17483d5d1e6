"""What a constrained request may generate: :class:`Constraint` (a JSON schema, any JSON object,
a regular expression or a Lark grammar), checked when it is built.

A constraint is compiled by llguidance (the grammar engine llama.cpp and vLLM use; the ``serve``
extra installs it) into a grammar that :mod:`.guide` turns into a token mask per step. Building
one checks it: a schema, regex or grammar llguidance cannot compile raises
:class:`~offgraph_kv.InvalidArgumentError` naming what is wrong, before any request exists.

JSON is generated in one layout: no newlines or indentation, ``", "`` between items and
``": "`` after keys (what ``json.dumps`` writes). A small model left free to choose whitespace
can write newlines forever inside an object; one layout also makes a reply's length depend on
its content only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._errors import InvalidArgumentError

__all__ = ["JSON_LAYOUT", "Constraint", "require_llguidance"]

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options every JSON constraint is compiled with (see the module's text)."""


def require_llguidance() -> Any:
    """The ``llguidance`` module, or :class:`ImportError` naming the extra that installs it."""
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - the serve extra installs it
        raise ImportError(
            "constrained decoding needs llguidance: pip install 'offgraph-kv[serve]' "
            "(or pip install llguidance)"
        ) from e
    return llguidance


@dataclass(frozen=True)
class Constraint:
    """A grammar a request's output must match; build one with a class method.

    ``kind`` is ``"json_schema"``, ``"json_object"``, ``"regex"`` or ``"lark"``; ``source`` what
    it was built from (the schema as JSON text, the pattern, the grammar); ``grammar`` the
    compiled llguidance grammar the matcher runs.

    Usage::

        c = Constraint.json_schema({"type": "object", "properties": {"n": {"type": "integer"}}})
        rid = gen.add(ids, max_new_tokens=64, constraint=c)
    """

    kind: str
    source: str
    grammar: str

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, strict: bool = True) -> Constraint:
        """Output is JSON valid against ``schema`` (a dict or its JSON text).

        ``strict``: every keyword of the schema is enforced, and one llguidance does not
        support (an unknown ``format``, say) raises. ``strict=False``: unsupported keywords
        are ignored and the rest enforced (OpenAI's non-strict mode promises less than that)."""
        text = schema if isinstance(schema, str) else _dumps(schema, "schema")
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidArgumentError(f"schema: not valid JSON: {e}") from None
        if not isinstance(parsed, dict):
            raise InvalidArgumentError(
                f"schema: expected a JSON object, got {type(parsed).__name__}"
            )
        opts = {**JSON_LAYOUT, "lenient": not strict}
        return cls._compiled("json_schema", text, _json_grammar(parsed, opts))

    @classmethod
    def json_object(cls) -> Constraint:
        """Output is one JSON object (any keys and values)."""
        return cls._compiled("json_object", "", _json_grammar({"type": "object"}, JSON_LAYOUT))

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """Output matches ``pattern`` as a whole (Rust ``regex`` syntax, no lookaround or
        backreferences)."""
        if not isinstance(pattern, str):
            raise InvalidArgumentError(f"regex: expected a string, got {type(pattern).__name__}")
        llg = require_llguidance()
        return cls._compiled("regex", pattern, llg.LLMatcher.grammar_from_regex(pattern))

    @classmethod
    def lark(cls, grammar: str) -> Constraint:
        """Output is derived from ``grammar``'s ``start`` rule (llguidance's Lark dialect:
        Lark syntax, plus ``%json {schema}`` and regex terminals)."""
        if not isinstance(grammar, str):
            raise InvalidArgumentError(f"grammar: expected a string, got {type(grammar).__name__}")
        llg = require_llguidance()
        return cls._compiled("lark", grammar, llg.LLMatcher.grammar_from_lark(grammar))

    @classmethod
    def _compiled(cls, kind: str, source: str, grammar: str) -> Constraint:
        llg = require_llguidance()
        error = llg.LLMatcher.validate_grammar(grammar)
        if error:
            name = "schema" if kind.startswith("json") else kind
            raise InvalidArgumentError(f"{name}: {error.strip()}")
        return cls(kind, source, grammar)


def _dumps(value: Any, name: str) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{name}: not JSON: {e}") from None


def _json_grammar(schema: dict[str, Any], options: dict[str, Any]) -> str:
    llg = require_llguidance()
    try:
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=options)
    except ValueError as e:
        raise InvalidArgumentError(f"schema: {e}") from None
