"""Tool calling on one SmolLM2 server for the module, through the official ``openai`` client:
a forced call (``tool_choice`` ``required`` or a named function, by constrained decoding) is a
well-formed call whose arguments validate, whole and streamed (a first delta with id and name,
then argument pieces that add up to the whole reply's); the round trip (call, result, answer)
renders through the template and reuses the conversation's prefix, on SmolLM2's template and
Gemma 3's; ``tool_choice: "none"``
answers text from the prompt without tools; malformed tools and tool turns are 400s naming the
field that change nothing in the server; ``auto`` answers text, or a call held to the tools
once it opens (``parallel_tool_calls: false``: one)."""

from __future__ import annotations

import json

import pytest

from .serve_helpers import settled_health

MODEL = "smollm2-135m"
ARGS = ("--n-cells", "4096", "--max-batch-tokens", "256", "--threads", "2")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["C", "F"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "clock", "description": "The time now"}}
TOOLS = [WEATHER, CLOCK]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
KW = dict(model=MODEL, tools=TOOLS, temperature=0, max_tokens=48)


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(MODEL, *ARGS)


def valid_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str), args
    assert args["unit"] in ("C", "F"), args


def valid_call(call) -> None:
    """A call of one of TOOLS whose arguments validate against its schema."""
    if call.function.name == "clock":
        assert json.loads(call.function.arguments) == {}  # no parameters: no arguments
    else:
        assert call.function.name == "get_weather"
        valid_weather(call.function.arguments)


def test_a_forced_call_validates_and_the_round_trip_reuses_the_prefix(server):
    client = server.client()
    r = client.chat.completions.create(
        **KW, messages=ASK, tool_choice="required", parallel_tool_calls=False
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert choice.message.content is None
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) > 10
    valid_call(call)
    # The agent's loop: the reply itself back in the history (its null fields included), then
    # the result; the answer's prompt extends the first one, whose cells are reused.
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}
    answer = client.chat.completions.create(**KW, messages=[*ASK, choice.message, result])
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answer.usage.prompt_tokens > r.usage.prompt_tokens + 10
    assert answer.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens


def test_gemma_forced_call_round_trip(start_server):
    # Gemma 3's template (the family's default: the file carries none) folds the tools'
    # system block into the first user turn; a 270M model still calls well-formed.
    name = "gemma-3-270m"
    client = start_server(name, *ARGS).client()
    kw = {**KW, "model": name}
    r = client.chat.completions.create(
        **kw, messages=ASK, tool_choice="required", parallel_tool_calls=False
    )
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
    for call in r.choices[0].message.tool_calls:
        valid_call(call)
    results = [
        {"role": "tool", "tool_call_id": c.id, "content": "21"}
        for c in r.choices[0].message.tool_calls
    ]
    msgs = [*ASK, r.choices[0].message, *results]
    answer = client.chat.completions.create(**{**kw, "max_tokens": 4}, messages=msgs)
    assert answer.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens


def test_a_named_call_streams_its_arguments(server):
    client = server.client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    kw = dict(**KW, messages=ASK, tool_choice=named)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls"
    calls, deltas, reasons = {}, [], []
    for chunk in client.chat.completions.create(**kw, stream=True):
        c = chunk.choices[0]
        reasons.append(c.finish_reason)
        assert not c.delta.content
        for d in c.delta.tool_calls or []:
            deltas.append(d)
            if d.id is not None:  # a call's first delta: id, type, name, no arguments yet
                assert d.index not in calls and d.type == "function"
                assert d.function.arguments == ""
                calls[d.index] = [d.function.name, ""]
            else:
                assert d.function.name is None
                calls[d.index][1] += d.function.arguments
    assert reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}
    assert len(deltas) > 3  # arguments came in pieces
    assert [tuple(v) for v in calls.values()] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls
    ]
    for t in whole.message.tool_calls:
        assert t.function.name == "get_weather"
        valid_weather(t.function.arguments)


def test_tool_choice_none_answers_text_from_a_prompt_without_tools(server):
    client = server.client()
    plain = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, temperature=0)
    none = client.chat.completions.create(
        **{**KW, "max_tokens": 8}, messages=ASK, tool_choice="none"
    )
    assert none.choices[0].message.tool_calls is None
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    auto = client.chat.completions.create(**{**KW, "max_tokens": 8}, messages=ASK)
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tools' system block


def test_auto_answers_text_or_makes_a_valid_call(server):
    # auto: text stays free; once the reply opens a call, the call is held to the tools.
    client = server.client()
    hello = client.chat.completions.create(
        **KW, messages=[{"role": "user", "content": "Say hello to me."}]
    ).choices[0]
    assert hello.finish_reason == "stop" and hello.message.tool_calls is None
    assert "<tool_call>" not in hello.message.content and hello.message.content.strip()
    say = "Call the get_weather function for Paris. Reply with a <tool_call>."
    asked = [{"role": "user", "content": say}]
    kw = dict(**KW, messages=asked, tool_choice="auto", parallel_tool_calls=False)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    (call,) = whole.message.tool_calls  # parallel_tool_calls false: one call, then the end
    valid_call(call)
    args, reasons = "", []
    for chunk in client.chat.completions.create(**kw, stream=True):
        c = chunk.choices[0]
        reasons.append(c.finish_reason)
        for d in c.delta.tool_calls or []:
            assert d.index == 0
            args += d.function.arguments
    assert reasons[-1] == "tool_calls" and args == call.function.arguments


CALL = {"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
BAD = [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": []}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
    ({"tools": [CLOCK, CLOCK]}, "tools.1.function.name"),
    ({"tools": [{"type": "custom", "function": {"name": "a"}}]}, "tools.0.type"),
    (
        {
            "tools": [
                {"type": "function", "function": {"name": "a", "parameters": {"type": "array"}}}
            ]
        },
        "tools.0.function.parameters",
    ),
    ({"tools": [{"type": "function", "function": {"name": "a", "x": 1}}]}, "tools.0.function.x"),
    (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "b"}}},
        "tool_choice",
    ),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"parallel_tool_calls": True}, "parallel_tool_calls"),
    (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
    ),
    ({"messages": [{"role": "user", "content": "hi", "colour": "red"}]}, "messages.0.colour"),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    (
        {"messages": [{"role": "user", "content": "hi", "tool_calls": [CALL]}]},
        "messages.0.tool_calls",
    ),
    ({"messages": [*ASK, {"role": "tool", "content": "1"}]}, "messages.1.tool_call_id"),
    (
        {"messages": [*ASK, {"role": "tool", "tool_call_id": "call_9", "content": "1"}]},
        "messages.1.tool_call_id",
    ),
    (
        {
            "messages": [
                *ASK,
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "call_1"},
            ]
        },
        "messages.2.content",
    ),
    (
        {
            "messages": [
                *ASK,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{**CALL, "function": {"name": "clock", "arguments": {}}}],
                },
            ]
        },
        "messages.1.tool_calls.0.function.arguments",
    ),
    (
        {"messages": [*ASK, {"role": "assistant", "content": "x", "refusal": "no"}]},
        "messages.1.refusal",
    ),
]


def test_malformed_tools_and_tool_turns_are_400s_that_change_nothing(server):
    before = settled_health(server)
    for fields, param in BAD:
        body = {"model": MODEL, "messages": ASK, "max_tokens": 4, **fields}
        status, _, err = server.post("/v1/chat/completions", json.dumps(body).encode())
        assert status == 400, (fields, err)
        assert err["error"]["param"].startswith(param), (fields, err)
        assert err["error"]["type"] == "invalid_request_error"
    after = settled_health(server)
    assert after["audit"] == "ok" and after == before
