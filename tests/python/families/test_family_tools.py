"""Tool calling on each family whose template teaches calls (Qwen 2.5's Hermes ``<tool_call>``,
Llama 3.1's bare JSON, Mistral v0.3's ``[TOOL_CALLS]``), each on a tiny checkpoint of the family
converted by llama.cpp's converter, given the family's real template (tool_templates.py), served
by ``offgraph-kv serve`` and driven by the official ``openai`` client: a named call (forced by
its grammar in the template's syntax) validates against the tool's schema, whole and streamed
(argument deltas adding up to the whole call's); the round trip (the call, its result, an
answer) renders through the family's template, which puts the call and the result in the
prompt, the server's prompt being exactly the template's rendering of the conversation."""

from __future__ import annotations

import json

import pytest
from serve.serve_helpers import Server

from .gguf_template import with_chat_template
from .tool_templates import TOOL_TEMPLATES

ARGS = ("--n-cells", "2048", "--max-batch-tokens", "128", "--threads", "2")
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
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
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module", params=list(TOOL_TEMPLATES))
def family(request, families_dir, variant_factory):
    """``(variant, its GGUF, a server of it)``: the variant's F16 file (the families tests'
    conversion) with its family's template; one server per family, stopped after it."""
    name = request.param
    src = variant_factory(name).gguf("f16")
    gguf = with_chat_template(src, families_dir / f"{name}-tools.gguf", TOOL_TEMPLATES[name][0])
    server = Server(str(gguf), *ARGS)
    yield name, gguf, server
    assert server.stop() == 0, server.output()


def served(server: Server) -> str:
    return server.get("/v1/models")["data"][0]["id"]


def valid_weather(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str), args
    assert len(args["city"]) <= 12 and args["unit"] in ("C", "F"), args


def test_the_template_teaches_the_family_syntax(family):
    from offgraph_kv.gguf_model import GgufModel
    from offgraph_kv.serve.tokens import GgufTokens

    name, gguf, _ = family
    model = GgufModel(str(gguf), threads=1)
    face = GgufTokens(model.tokenizer, model.default_chat_template)
    assert face.template == TOOL_TEMPLATES[name][0]  # the converter wrote it into the file
    assert face.tool_syntax == (TOOL_TEMPLATES[name][1], True)


def test_a_named_call_validates_whole_and_streamed_and_round_trips(family):
    from offgraph_kv.gguf_model import GgufModel
    from offgraph_kv.serve.tokens import GgufTokens

    name, gguf, server = family
    client = server.client()
    kw = dict(model=served(server), tools=TOOLS, temperature=0, max_tokens=64)
    whole = client.chat.completions.create(**kw, messages=ASK, tool_choice=NAMED).choices[0]
    assert whole.finish_reason == "tool_calls", whole
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    valid_weather(call.function.arguments)

    calls, reasons = {}, []
    stream = client.chat.completions.create(**kw, messages=ASK, tool_choice=NAMED, stream=True)
    for chunk in stream:
        c = chunk.choices[0]
        reasons.append(c.finish_reason)
        assert not c.delta.content
        for d in c.delta.tool_calls or []:
            if d.id is not None:
                calls[d.index] = [d.function.name, d.function.arguments]
            else:
                calls[d.index][1] += d.function.arguments
    assert reasons[-1] == "tool_calls"
    assert list(calls.values()) == [["get_weather", call.function.arguments]]

    # The agent's loop: the call back in the history, its result, and an answer. The server's
    # prompt is the family template's rendering, which carries the call and the result.
    call_turn = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": call.function.arguments},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}
    history = [*ASK, call_turn, result]
    answer = client.chat.completions.create(**{**kw, "max_tokens": 6}, messages=history)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    model = GgufModel(str(gguf), threads=1)
    face = GgufTokens(model.tokenizer, model.default_chat_template)
    ids = face.chat_ids(history, TOOLS)
    assert answer.usage.prompt_tokens == len(ids)
    prompt = face.decode(ids)
    assert TOOL_TEMPLATES[name][2] in prompt and '"temperature": 21' in prompt
    assert json.loads(call.function.arguments)["city"] in prompt
