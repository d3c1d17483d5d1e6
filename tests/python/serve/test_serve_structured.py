"""Structured output on one SmolLM2 server for the module, through the official ``openai``
client: ``.parse()`` with a pydantic model returns the parsed object; a ``json_schema`` reply
parses and validates; a ``json_object`` reply is a JSON object; a streamed constrained reply
joins into valid JSON; a ``json_schema`` request and a free one sent together each get the reply
they get alone (temperature 0); the extensions (``response_format`` on completions,
``guided_regex``, ``guided_choice``, llama.cpp's ``grammar``) hold; an invalid
``response_format`` or grammar is a 400 naming it that changes nothing."""

from __future__ import annotations

import json
import re
import threading
import time

import openai
import pytest
from pydantic import BaseModel, Field

from .serve_helpers import settled_health

MODEL = "smollm2-135m"
ARGS = ("--n-cells", "2048", "--max-batch-tokens", "128", "--threads", "2")


class City(BaseModel):
    name: str = Field(max_length=24)
    population: int


SCHEMA = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(MODEL, *ARGS)


def test_parse_with_a_pydantic_model(server):
    r = server.client().chat.completions.parse(
        model=MODEL,
        messages=ask("Name a big city and its population, as JSON."),
        response_format=City,
        max_completion_tokens=48,
        temperature=0,
    )
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.name, r
    assert r.choices[0].finish_reason == "stop"


def test_json_schema_and_json_object_replies(server):
    client = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(
        model=MODEL, messages=ask("Pick a colour."), response_format=fmt, max_tokens=16
    )
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"colour"} and value["colour"] in ("red", "green", "blue")
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("Reply with a JSON object with one key, ok, set to true."),
        response_format={"type": "json_object"},
        max_tokens=24,
        temperature=0,
    )
    # json_object fixes the syntax, not the length: SmolLM2 may write a long
    # string value, which max_tokens then cuts ("length"). Whole or cut, the
    # text is an object's start in the compact layout; a whole one parses.
    text, choice = r.choices[0].message.content, r.choices[0]
    assert text.startswith("{") and "\n" not in text, r
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(text), dict), r
    else:
        assert choice.finish_reason == "length" and r.usage.completion_tokens == 24, r


def test_a_streamed_constrained_reply_joins_into_json(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}
    stream = server.client().chat.completions.create(
        model=MODEL, messages=ask("Pick a colour."), response_format=fmt, max_tokens=16, stream=True
    )
    parts, reasons = [], []
    for chunk in stream:
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert json.loads("".join(parts))["colour"] in ("red", "green", "blue")
    assert reasons[-1] == "stop"


def test_a_constrained_and_a_free_request_together_each_equal_alone(server):
    client = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA, "strict": True}}
    constrained = dict(
        model=MODEL, messages=ask("Pick a colour."), response_format=fmt, max_tokens=16
    )
    free = dict(model=MODEL, messages=ask("Tell me about the sea."), max_tokens=48)
    c_alone = client.chat.completions.create(**constrained, temperature=0).choices[0]
    f_alone = client.chat.completions.create(**free, temperature=0).choices[0]
    assert f_alone.finish_reason == "length"

    # The constrained request goes in once the free one streams, and ends before it does:
    # the two shared steps of one batch.
    done: dict[str, object] = {}

    def send_constrained():
        r = client.chat.completions.create(**constrained, temperature=0)
        done["reply"], done["at"] = r.choices[0], time.monotonic()

    parts, worker = [], threading.Thread(target=send_constrained)
    for chunk in client.chat.completions.create(**free, temperature=0, stream=True):
        for c in chunk.choices:
            parts.append(c.delta.content or "")
        if not worker.is_alive() and "at" not in done and "".join(parts):
            worker.start()
    last = time.monotonic()
    worker.join()
    assert done["at"] < last
    assert "".join(parts) == f_alone.message.content
    assert done["reply"].message.content == c_alone.message.content
    assert json.loads(c_alone.message.content)["colour"] in ("red", "green", "blue")


def test_the_extensions(server):
    client = server.client()
    r = client.completions.create(
        model=MODEL,
        prompt="The colour of the sky:",
        max_tokens=16,
        extra_body={
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "c", "schema": SCHEMA},
            }
        },
    )
    assert json.loads(r.choices[0].text)["colour"] in ("red", "green", "blue")
    r = client.completions.create(
        model=MODEL, prompt="Call me on", max_tokens=12, extra_body={"guided_regex": r"\d{3}-\d{4}"}
    )
    assert re.fullmatch(r"\d{3}-\d{4}", r.choices[0].text) and r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("Is water wet?"),
        max_tokens=8,
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert r.choices[0].message.content in ("yes", "no")
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("Count."),
        max_tokens=8,
        extra_body={"grammar": 'root ::= "n=" [0-9]'},
    )
    assert re.fullmatch(r"n=\d", r.choices[0].message.content)


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"response_format": {"type": "sound"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "sound"}},
                }
            },
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "strict": True,
                        "schema": {"type": "string", "format": "hue"},
                    },
                }
            },
            "response_format",
        ),
        ({"guided_regex": "[a-"}, "guided_regex"),
        ({"grammar": "root ::= missing"}, "grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_an_invalid_constraint_is_a_400_naming_it_that_changes_nothing(server, fields, param):
    before = server.metric("offgraph_kv_prompt_tokens_total")
    body = {"model": MODEL, "messages": ask("Hi"), "max_tokens": 2, **fields}
    status, _, err = server.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 400, err
    assert err["error"]["param"].split(".")[0] == param, err
    assert param in err["error"]["message"]
    assert server.metric("offgraph_kv_prompt_tokens_total") == before
    h = settled_health(server)
    assert h["audit"] == "ok" and h["running"] == 0 and h["waiting"] == 0


def test_the_openai_client_raises_on_a_bad_schema(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client().chat.completions.create(
            model=MODEL,
            messages=ask("Hi"),
            max_tokens=2,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": 3}},
            },
        )
    assert e.value.body["param"] == "response_format"
