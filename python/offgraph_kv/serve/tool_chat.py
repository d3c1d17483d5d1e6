"""The chat a template renders when a request carries tools: OpenAI's turns in the shape the
template expects, or, for a template without tool support, the tools taught in a system block
of this server's (Hermes-style calls). Apart from :mod:`.tool_prompt`'s checks, which need
pydantic (the serve extra): every chat the native engine renders passes through here, the
demo's included.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["fallback_block", "template_chat"]


def fallback_block(tools: list[dict[str, Any]]) -> str:
    """The system text that teaches a template without tool support the tools and the call
    syntax (:mod:`.tools`' ``hermes``)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\n"
        "You can call the functions described below, in <tools></tools> tags, to help with the "
        "user's request.\n<tools>\n"
        f"{lines}\n</tools>\n\n"
        "To call a function, reply with a JSON object holding its name and its arguments inside "
        "<tool_call></tool_call> tags, one per call:\n"
        '<tool_call>\n{"name": "<function name>", "arguments": {<arguments as JSON>}}\n'
        "</tool_call>\n"
        "A function's result comes back in <tool_response></tool_response> tags."
    )


def _arguments(text: str) -> Any:
    # transformers' templates expect an object; the model's own text if it is not JSON.
    try:
        return json.loads(text)
    except ValueError:
        return text


def _short_id(call_id: str) -> str:
    # Mistral's templates refuse call ids that are not 9 letters or digits; the same id maps
    # to the same short one in the call and in its result.
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def template_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    native: bool,
    syntax: str = "hermes",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` as the template gets them: ``messages`` are OpenAI's (assistant
    ``tool_calls`` with ``arguments`` strings, ``tool`` turns); ``native``: the template renders
    tools itself in ``syntax`` (else the fallback above, and no ``tools`` for the template)."""
    if native:
        ident = _short_id if syntax == "mistral" else str
        out = []
        for m in messages:
            m = dict(m)
            if "tool_calls" in m:
                m["tool_calls"] = [
                    {
                        **c,
                        "id": ident(c["id"]),
                        "function": {
                            **c["function"],
                            "arguments": _arguments(c["function"]["arguments"]),
                        },
                    }
                    for c in m["tool_calls"]
                ]
            if "tool_call_id" in m:
                m["tool_call_id"] = ident(m["tool_call_id"])
            out.append(m)
        return out, tools
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [
                "<tool_call>\n"
                + json.dumps(
                    {
                        "name": c["function"]["name"],
                        "arguments": _arguments(c["function"]["arguments"]),
                    },
                    ensure_ascii=False,
                )
                + "\n</tool_call>"
                for c in m["tool_calls"]
            ]
            text = "\n".join(([m["content"]] if m["content"] else []) + calls)
            out.append({"role": "assistant", "content": text})
        elif m["role"] == "tool":
            result = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("tool_results"):  # one user turn for a call's results
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "tool_results": True})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content")})
    for m in out:
        m.pop("tool_results", None)
    if tools:
        block = fallback_block(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + block}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, None
