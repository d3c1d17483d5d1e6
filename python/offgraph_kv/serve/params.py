"""Which OpenAI request parameters this server honours, accepts as labels, or refuses.

A parameter the server does not honour is refused with a 400 that names it, never accepted and
ignored. The request models (:mod:`.protocol`) declare what is honoured; every other field of a
body lands here:

* :data:`LABELS`: opaque labels whose whole meaning is to be carried along (``user``,
  ``metadata``, ...); accepted, and nothing depends on them;
* :data:`REFUSED`: OpenAI parameters this server does not implement; accepted only when null or
  given the value that means "off" (``modalities: ["text"]``,
  ``function_call: "none"``, ...), else a 400 ``unsupported_parameter``;
* anything else: a 400 ``unknown_parameter``, as OpenAI answers an unrecognized argument
  (vendor extensions too: a sampling knob silently dropped changes the output unseen).
"""

from __future__ import annotations

from typing import Any

from .errors import ApiError

__all__ = ["LABELS", "REFUSED", "check_extra"]

CHAT, COMPLETIONS = "chat", "completions"
BOTH = (CHAT, COMPLETIONS)

LABELS: dict[str, tuple[str, ...]] = {
    "user": BOTH,  # an end-user id for the caller's own books
    "safety_identifier": BOTH,
    "prompt_cache_key": BOTH,  # prefixes are shared automatically, with or without it
    "metadata": (CHAT,),  # stored-completions labels: nothing is stored here
    "store": (CHAT,),
}

# name -> (endpoints, the values that mean "off" besides null, why it is refused)
REFUSED: dict[str, tuple[tuple[str, ...], tuple[Any, ...], str]] = {
    "functions": ((CHAT,), (), "functions (deprecated) is not supported: use tools"),
    "function_call": ((CHAT,), ("none",), "function_call (deprecated): use tool_choice"),
    "prediction": ((CHAT,), (), "predicted outputs are not supported"),
    "audio": ((CHAT,), (), "audio output is not supported"),
    "modalities": ((CHAT,), (["text"],), "only text output is supported"),
    "reasoning_effort": ((CHAT,), (), "this model does not reason in a separate channel"),
    "verbosity": ((CHAT,), (), "verbosity is not supported"),
    "web_search_options": ((CHAT,), (), "web search is not supported"),
    "service_tier": (BOTH, ("auto", "default"), "this server has one service tier"),
    "best_of": ((COMPLETIONS,), (1,), "best_of > 1 is not supported"),
    "suffix": ((COMPLETIONS,), (), "suffix (insertion) is not supported"),
}


def check_extra(extra: dict[str, Any] | None, endpoint: str) -> None:
    """Refuse (400, naming it) the first field of ``extra`` (the body's fields the request
    model does not declare) that is not a label nor a refused parameter's "off" value."""
    for name, value in (extra or {}).items():
        if endpoint in LABELS.get(name, ()):
            continue
        refused = REFUSED.get(name)
        if refused is not None and endpoint in refused[0]:
            off = refused[1]
            if value is None or any(_same(value, v) for v in off):
                continue
            raise ApiError(
                400,
                f"{name}: {refused[2]} by this server (got {value!r})",
                param=name,
                code="unsupported_parameter",
            )
        raise ApiError(
            400,
            f"Unrecognized request argument supplied: {name}",
            param=name,
            code="unknown_parameter",
        )


def _same(value: Any, off: Any) -> bool:
    # 1 is the "off" best_of, True is not; JSON types compared exactly.
    return type(value) is type(off) and value == off
