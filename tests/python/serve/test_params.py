"""The parameter policy in process (no model): labels pass, a refused parameter passes only as
null or its "off" value (compared with its JSON type: ``true`` is not ``best_of: 1``), anything
else is a 400 naming it; and docs/serving.md's table names every parameter the policy knows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from offgraph_kv.serve import protocol as P
from offgraph_kv.serve.params import LABELS, REFUSED, check_extra

DOCS = Path(__file__).resolve().parents[3] / "docs" / "serving.md"


def parse(endpoint: str, **fields):
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    model = P.ChatRequest
    if endpoint == "completions":
        base, model = {"model": "m", "prompt": "x"}, P.CompletionRequest
    return P.parse(json.dumps({**base, **fields}).encode(), model)


@pytest.mark.parametrize(
    "endpoint,fields",
    [
        ("chat", {"user": "u", "metadata": {"a": "b"}, "store": True, "prompt_cache_key": "k"}),
        ("chat", {"tools": None, "tool_choice": "none", "response_format": {"type": "text"}}),
        ("chat", {"modalities": ["text"], "service_tier": "default", "function_call": "none"}),
        ("completions", {"best_of": 1, "suffix": None, "user": "u", "service_tier": "auto"}),
    ],
)
def test_labels_and_off_values_pass(endpoint, fields):
    parse(endpoint, **fields)


@pytest.mark.parametrize(
    "endpoint,name,value,code",
    [
        ("completions", "best_of", True, "unsupported_parameter"),
        ("completions", "best_of", 1.0, "unsupported_parameter"),
        ("chat", "response_format", {"type": "text", "x": 1}, "invalid_value"),
        ("chat", "tools", [], "invalid_value"),
        ("chat", "tool_choice", "auto", "invalid_value"),
        ("completions", "metadata", {}, "unknown_parameter"),
        ("completions", "tools", [], "unknown_parameter"),
        ("chat", "repetition_penalty", 1.1, "unknown_parameter"),
    ],
)
def test_anything_else_is_a_400_naming_it(endpoint, name, value, code):
    with pytest.raises(P.ApiError) as e:
        parse(endpoint, **{name: value})
    assert (e.value.status, e.value.param, e.value.code) == (400, name, code)


def test_the_docs_table_names_every_parameter_the_policy_knows():
    table = DOCS.read_text()
    for name in [*LABELS, *REFUSED, "logit_bias", "frequency_penalty", "presence_penalty"]:
        assert f"`{name}`" in table, name
    check_extra(None, "chat")  # nothing extra: nothing to refuse
