"""The OpenAI wire format: request models (validated before anything reaches the generator),
error bodies and response/chunk builders.

Requests are parsed from the raw body here, not by the web framework, so every mistake (a body
that is not UTF-8, not JSON, a wrong type, a value out of range) gets OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}`` with a 4xx status.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any, ClassVar, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from .errors import ApiError
from .params import check_extra
from .structured import constraint_of
from .tool_prompt import Tool, ToolChoice, check_tools, tool_dicts

__all__ = [
    "ApiError",
    "ChatRequest",
    "CompletionRequest",
    "Message",
    "TokenLogprob",
    "chunk",
    "logprobs_body",
    "parse",
    "response",
    "usage",
    "usage_chunk",
]

MAX_N = 16
MAX_STOP = 4
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's legacy completions limit
MAX_TOP_LOGPROBS = 20  # chat's (and the generator's)
MAX_CHOICES = 64  # prompts x n of one completions request
MAX_LOGIT_BIAS = 100.0
MAX_PENALTY = 2.0


class _Strict(BaseModel):
    # Strict types: "5" is not an int and true is not a number. Unknown fields are ignored by
    # the token routes' models (vLLM's and llama-server's shapes); the OpenAI requests refuse
    # them (see _Sampling).
    model_config = ConfigDict(strict=True, extra="ignore")

    def check(self) -> None:
        """Checks across fields, after parsing (400 naming the parameter)."""


class StreamOptions(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = False
    include_obfuscation: Literal[False] = False  # no padding field is sent: false only


class _Sampling(_Strict):
    # Every field a body may carry is declared here or checked by :mod:`.params` (a label, or
    # an OpenAI parameter this server refuses unless it is "off"); anything else is a 400.
    model_config = ConfigDict(strict=True, extra="allow")
    endpoint: ClassVar[str] = "completions"

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None
    frequency_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    presence_penalty: float = Field(default=0.0, ge=-MAX_PENALTY, le=MAX_PENALTY)
    # Structured output (see .structured): OpenAI's response_format, and vLLM's and
    # llama.cpp's extensions; at most one per request, compiled by check().
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    # This server's extension: false opts the request out of speculative decoding (serve
    # --spec); its output is the same either way when greedy.
    speculative: bool = True
    _constraint: Any = PrivateAttr(default=None)

    @property
    def constraint(self) -> Any:
        """The :class:`~offgraph_kv.batch.Constraint` the request asks for (``None``: free)."""
        return self._constraint

    def check(self) -> None:
        """What one field's type and range cannot say: refused and unknown fields, and
        combinations (400 naming the parameter)."""
        check_extra(self.model_extra, self.endpoint)
        self._constraint = constraint_of(self)
        if self.stream_options is not None and not self.stream:
            raise ApiError(
                400,
                "stream_options: only allowed when stream is true",
                param="stream_options",
                code="invalid_value",
            )
        self.stop_strings()
        self.bias(None)

    def bias(self, vocab_size: int | None) -> dict[int, float] | None:
        """``logit_bias`` as token id -> bias (keys are ids as strings in JSON), each in
        [-100, 100] and, given ``vocab_size``, inside the vocabulary."""
        if not self.logit_bias:
            return None
        out: dict[int, float] = {}
        for key, value in self.logit_bias.items():
            if not (key.isascii() and key.isdigit()):
                raise ApiError(
                    400,
                    f"logit_bias: {key!r} is not a token id",
                    param="logit_bias",
                    code="invalid_value",
                )
            tok = int(key)
            if vocab_size is not None and tok >= vocab_size:
                raise ApiError(
                    400,
                    f"logit_bias: token {tok} is outside the vocabulary [0, {vocab_size})",
                    param="logit_bias",
                    code="invalid_value",
                )
            if not (math.isfinite(value) and -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS):
                raise ApiError(
                    400,
                    f"logit_bias: {value} for token {tok} is outside [-100, 100]",
                    param="logit_bias",
                    code="invalid_value",
                )
            out[tok] = value
        return out

    def max_new_tokens(self) -> tuple[int | None, str]:
        """The token limit asked for (``None``: the default) and the parameter that set it."""
        return self.max_tokens, "max_tokens"

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise ApiError(400, f"stop: at most {MAX_STOP} strings", param="stop")
        if any(s == "" for s in stops):
            raise ApiError(400, "stop: empty string", param="stop")
        return stops


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False

    def check(self) -> None:
        super().check()
        if self.echo and self.logprobs is not None:
            # OpenAI's echo + logprobs reports the prompt's tokens' logprobs, which would take
            # a logits row per prompt token: not computed here.
            raise ApiError(
                400,
                "echo: echo together with logprobs is not supported",
                param="echo",
                code="unsupported_parameter",
            )
        prompts = self.prompt_inputs()
        if len(prompts) * self.n > MAX_CHOICES:
            raise ApiError(
                400,
                f"prompt: {len(prompts)} prompts x n={self.n} is more than {MAX_CHOICES} choices",
                param="prompt",
                code="invalid_value",
            )

    def logprob_count(self) -> int | None:
        """Top alternatives per token the generator records (``None``: no logprobs)."""
        return self.logprobs

    def prompt_inputs(self) -> list[str | list[int]]:
        """The prompts, in order: one string, one token list, or a list of either."""
        p = self.prompt
        many: list[Any] = [p] if isinstance(p, str) or p and isinstance(p[0], int) else list(p)
        if not many or any(len(x) == 0 for x in many):
            raise ApiError(400, "prompt: empty", param="prompt")
        return many


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class _Forbid(_Strict):
    model_config = ConfigDict(strict=True, extra="forbid")


class FunctionCall(_Forbid):
    name: str
    arguments: str  # JSON text, as OpenAI's replies carry it


class ToolCall(_Forbid):
    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(_Forbid):
    # Unknown fields are a 400 naming them. ``refusal``, ``function_call`` and ``audio`` are
    # what a client sends back of an earlier reply (``messages.append(choice.message)``): null.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    refusal: None = None
    function_call: None = None
    audio: None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


def check_turns(messages: list[Message]) -> None:
    """What each turn's fields need of each other (400 naming the field): ``tool_calls`` on
    assistant turns only, content null only beside them, a ``tool`` turn's ``tool_call_id``
    answering an earlier call."""
    calls: set[str] = set()
    for i, m in enumerate(messages):
        at = f"messages.{i}"
        if m.tool_calls is not None and m.role != "assistant":
            raise ApiError(
                400, f"{at}.tool_calls: only on assistant turns", param=f"{at}.tool_calls"
            )
        if m.tool_calls is not None and not m.tool_calls:
            raise ApiError(400, f"{at}.tool_calls: empty", param=f"{at}.tool_calls")
        if m.tool_call_id is not None and m.role != "tool":
            raise ApiError(
                400, f"{at}.tool_call_id: only on tool turns", param=f"{at}.tool_call_id"
            )
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ApiError(
                400,
                f"{at}.content: required (null only on an assistant turn with tool_calls)",
                param=f"{at}.content",
            )
        if m.role == "tool" and m.tool_call_id not in calls:
            raise ApiError(
                400,
                f"{at}.tool_call_id: {m.tool_call_id!r} answers no earlier assistant tool call",
                param=f"{at}.tool_call_id",
            )
        calls |= {c.id for c in m.tool_calls or ()}


class ChatRequest(_Sampling):
    endpoint: ClassVar[str] = "chat"

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # Tool calling (see .tool_prompt and .tools).
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def check(self) -> None:
        super().check()
        self.max_new_tokens()
        self.logprob_count()
        check_tools(self.tools, self.tool_choice, self.parallel_tool_calls)
        check_turns(self.messages)

    def tools_on(self) -> bool:
        """Tools are given and may be called (``tool_choice`` is not ``none``)."""
        return bool(self.tools) and self.tool_choice != "none"

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools the template renders (none when ``tool_choice`` is ``none``)."""
        return tool_dicts(self.tools) if self.tools_on() else None

    def max_new_tokens(self) -> tuple[int | None, str]:
        """``max_completion_tokens``, or its older name ``max_tokens``; both given must agree."""
        a, b = self.max_completion_tokens, self.max_tokens
        if a is not None and b is not None and a != b:
            raise ApiError(
                400,
                f"max_completion_tokens: {a} and max_tokens {b} disagree; give one of them",
                param="max_completion_tokens",
                code="invalid_value",
            )
        if a is not None:
            return a, "max_completion_tokens"
        return b, "max_tokens"

    def logprob_count(self) -> int | None:
        """Top alternatives per token (``None``: no logprobs); ``top_logprobs`` needs
        ``logprobs: true``, as OpenAI's API says."""
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise ApiError(
                    400,
                    "top_logprobs: logprobs must be true when top_logprobs is given",
                    param="top_logprobs",
                    code="invalid_value",
                )
            return None
        return self.top_logprobs or 0

    def chat(self) -> list[dict[str, Any]]:
        """The messages as dicts (OpenAI's fields; null content as ``""``)."""
        check_turns(self.messages)
        msgs: list[dict[str, Any]] = []
        for m in self.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.text()}
            if m.role == "developer":  # templates know "system"; OpenAI's newer name
                d["role"] = "system"
            if m.name is not None:
                d["name"] = m.name
            if m.tool_calls:
                d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            msgs.append(d)
        if all(m["content"] == "" and not m.get("tool_calls") for m in msgs):
            raise ApiError(400, "messages: every message is empty", param="messages")
        return msgs


def parse(body: bytes, model: type[_Strict]) -> Any:
    """``body`` as ``model``, or :class:`ApiError` (400) naming what is wrong."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the body is not UTF-8: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(x) for x in err["loc"]) or None
        raise ApiError(400, f"{param}: {err['msg']}", param=param, code="invalid_value") from None
    req.check()
    return req


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class TokenLogprob(NamedTuple):
    """One reported token: its text (what it added to the choice's text), the offset of that
    text in the choice's text, its logprob, and the top alternatives ``(text, logprob)``, most
    likely first."""

    text: str
    offset: int
    logprob: float
    top: list[tuple[str, float]]


def _lp(x: float) -> float:
    # JSON has no -inf (a masked logit); OpenAI reports such a token's logprob as -9999.
    return x if math.isfinite(x) else -9999.0


def logprobs_body(chat: bool, tokens: list[TokenLogprob] | None) -> dict[str, Any] | None:
    """A choice's ``logprobs`` for ``tokens`` (``None`` when logprobs were not asked for).

    Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`` with the top
    ``top_logprobs`` alternatives. Completions (OpenAI's legacy shape): parallel lists
    ``tokens``, ``token_logprobs``, ``top_logprobs`` (``{text: logprob}``: the top ``logprobs``
    plus the chosen token, as OpenAI's "up to logprobs + 1") and ``text_offset``."""
    if tokens is None:
        return None
    if chat:
        return {
            "content": [
                {
                    "token": t.text,
                    "logprob": _lp(t.logprob),
                    "bytes": list(t.text.encode("utf-8")),
                    "top_logprobs": [
                        {"token": a, "logprob": _lp(x), "bytes": list(a.encode("utf-8"))}
                        for a, x in t.top
                    ],
                }
                for t in tokens
            ]
        }
    tops = []
    for t in tokens:
        top: dict[str, float] = {}
        for a, x in t.top:
            top.setdefault(a, _lp(x))  # two tokens of one text: the likelier one's
        top.setdefault(t.text, _lp(t.logprob))
        tops.append(top)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [_lp(t.logprob) for t in tokens],
        "top_logprobs": tops,
        "text_offset": [t.offset for t in tokens],
    }


def response(
    chat: bool,
    rid: str,
    model: str,
    choices: list[tuple[str, str | None]],
    use: dict[str, Any],
    logprobs: list[dict[str, Any] | None] | None = None,
    fingerprint: str | None = None,
    tool_calls: list[list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """A whole (non-streamed) completion: ``choices`` are ``(text, finish_reason)``,
    ``logprobs`` each choice's :func:`logprobs_body` (``None``: none asked), ``tool_calls``
    each chat choice's calls (a choice with calls has ``content`` null when it has no text)."""
    out = []
    for i, (text, reason) in enumerate(choices):
        lps = None if logprobs is None else logprobs[i]
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls and tool_calls[i]:
                message = {
                    "role": "assistant",
                    "content": text or None,
                    "tool_calls": tool_calls[i],
                }
            out.append(
                {
                    "index": i,
                    "message": message,
                    "finish_reason": reason,
                    "logprobs": lps,
                }
            )
        else:
            out.append({"index": i, "text": text, "finish_reason": reason, "logprobs": lps})
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": out,
        "usage": use,
    }


def chunk(
    chat: bool,
    rid: str,
    model: str,
    index: int,
    text: str | None,
    reason: str | None,
    first: bool = False,
    logprobs: dict[str, Any] | None = None,
    fingerprint: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One streamed chunk of choice ``index``: a text delta and/or its finish reason, and the
    :func:`logprobs_body` of the tokens whose text it carries. A chat choice's first delta is
    ``{"role": "assistant", "content": ""}``, as OpenAI's (clients index ``content``);
    ``tool_calls``: the delta's tool-call pieces (a call's index, id and name, then pieces of
    its arguments)."""
    if chat:
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
            delta["content"] = text or ""
        elif text:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
    else:
        choice = {"index": index, "text": text or "", "finish_reason": reason}
    choice["logprobs"] = logprobs
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [choice],
    }


def usage_chunk(
    chat: bool, rid: str, model: str, use: dict[str, Any], fingerprint: str | None = None
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [],
        "usage": use,
    }
