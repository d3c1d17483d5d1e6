"""``offgraph-kv serve --spec ngram`` through the official ``openai`` client, one server for the
module: a greedy chat that quotes its prompt back is the same speculating, opted out
(``"speculative": false``) and streamed; logprobs come one per token; ``/metrics`` counts the
drafted and accepted tokens; a non-boolean ``speculative`` is a 400 naming it."""

from __future__ import annotations

import json

import pytest

ARGS = ("--n-cells", "2048", "--max-batch-tokens", "64", "--threads", "2")
TOOL_OUTPUT = (
    "$ ls -l src\n-rw-r--r-- 1 dev dev 2048 lib.rs\n-rw-r--r-- 1 dev dev 512 main.rs\n"
    "-rw-r--r-- 1 dev dev 4096 cache.rs\n"
)
MESSAGES = [
    {"role": "user", "content": "Here is a tool output:\n" + TOOL_OUTPUT + "Quote it back exactly."}
]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server("smollm2-135m", *ARGS, "--spec", "ngram", "--spec-max-draft", "6")


def _chat(server, **kw):
    return server.client().chat.completions.create(
        model="smollm2-135m", messages=MESSAGES, max_tokens=48, temperature=0, **kw
    )


def test_speculation_leaves_greedy_replies_unchanged(server):
    spec = _chat(server)
    drafted = server.metric("offgraph_kv_spec_drafted_tokens_total")
    accepted = server.metric("offgraph_kv_spec_accepted_tokens_total")
    assert drafted > 0 and 0 < accepted <= drafted
    assert server.metric("offgraph_kv_spec_acceptance_rate") == pytest.approx(accepted / drafted)
    plain = _chat(server, extra_body={"speculative": False})
    assert plain.choices[0].message.content == spec.choices[0].message.content
    assert server.metric("offgraph_kv_spec_drafted_tokens_total") == drafted  # opted out
    stream = _chat(server, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == spec.choices[0].message.content
    assert server.metric("offgraph_kv_spec_drafted_tokens_total") > drafted


def test_logprobs_one_per_token_while_speculating(server):
    r = _chat(server, logprobs=True, top_logprobs=1)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(c.token for c in content) == r.choices[0].message.content


def test_a_bad_speculative_field_is_refused(server):
    body = {"model": "smollm2-135m", "messages": MESSAGES, "speculative": "no"}
    status, _, err = server.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 400 and err["error"]["param"] == "speculative", err
