"""What an OpenAI client may send, on one SmolLM2 server for the module, through the official
``openai`` client and raw requests: ``logit_bias`` bans and forces tokens on both endpoints,
whole and streamed; the penalties break a repeating greedy continuation; a list of prompts
answers ``n`` choices per prompt in order (``index = prompt * n + j``), whole and streamed;
``echo``; ``max_completion_tokens``; every parameter the server does not honour, and every
out-of-range value, is a 400 naming it that never reaches the generator; an unknown route or
method answers in OpenAI's error shape; the first streamed chat delta is ``{"role":
"assistant", "content": ""}``; ``system_fingerprint`` is on every response and chunk."""

from __future__ import annotations

import collections
import json
import re
import urllib.error
import urllib.request

import openai
import pytest

from .serve_helpers import settled_health

MODEL = "smollm2-135m"
ARGS = ("--n-cells", "4096", "--max-batch-tokens", "256", "--threads", "2")
REPEATS = "Repeat after me: yes yes yes"  # greedy answers " yes" twelve times
MSGS = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(MODEL, *ARGS)


def token_id(server, text: str) -> int:
    """The one token ``text`` is (checked through /tokenize and /detokenize)."""
    body = json.dumps({"prompt": text, "add_special_tokens": False}).encode()
    ids = server.post("/tokenize", body)
    (tok,) = ids[2]["tokens"]
    assert server.post("/detokenize", json.dumps({"tokens": [tok]}).encode())[2]["prompt"] == text
    return tok


def raw(server, method: str, path: str):
    req = urllib.request.Request(server.url + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.headers, json.loads(e.read())


def test_logit_bias_bans_and_forces_on_both_endpoints(server):
    client = server.client()
    r = client.completions.create(model=MODEL, prompt=REPEATS, max_tokens=6, temperature=0)
    assert r.choices[0].text.startswith(" yes")
    yes = token_id(server, " yes")
    kw = dict(model=MODEL, prompt=REPEATS, max_tokens=6, temperature=0, logprobs=0)
    banned = client.completions.create(**kw, logit_bias={str(yes): -100})
    assert " yes" not in banned.choices[0].logprobs.tokens, banned.choices[0].logprobs.tokens
    sampled = client.completions.create(
        **{**kw, "temperature": 1.5}, seed=3, logit_bias={str(yes): -100}
    )
    assert " yes" not in sampled.choices[0].logprobs.tokens
    blue = token_id(server, " blue")
    forced = client.completions.create(**kw, logit_bias={str(blue): 100})
    assert forced.choices[0].logprobs.tokens[0] == " blue"
    # Logprobs stay the model's: the forced token is not its likeliest.
    assert forced.choices[0].logprobs.token_logprobs[0] < -1.0
    chat = client.chat.completions.create(
        model=MODEL, messages=MSGS, max_tokens=3, temperature=0, logit_bias={str(blue): 100}
    )
    assert chat.choices[0].message.content.startswith(" blue")
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MSGS,
        max_tokens=3,
        temperature=0,
        logit_bias={str(blue): 100},
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == (
        chat.choices[0].message.content
    )


def test_a_penalty_breaks_a_repeating_greedy_continuation(server):
    client = server.client()
    kw = dict(model=MODEL, prompt=REPEATS, max_tokens=12, temperature=0, logprobs=0)
    plain = client.completions.create(**kw).choices[0].logprobs.tokens
    assert collections.Counter(plain)[" yes"] >= 8, plain
    for penalty in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        got = client.completions.create(**kw, **penalty).choices[0].logprobs.tokens
        assert got[0] == " yes" and collections.Counter(got)[" yes"] <= 2, (penalty, got)
    mild = client.completions.create(**kw, frequency_penalty=-1.0).choices[0].logprobs.tokens
    assert mild == plain  # a negative penalty only strengthens the repetition


def test_a_list_of_prompts_answers_n_choices_per_prompt_in_order(server):
    client = server.client()
    prompts = ["Bread is made from", "The sky is", "Cats like to"]
    ids = server.post("/tokenize", json.dumps({"prompt": prompts[1]}).encode())[2]["tokens"]
    kw = dict(model=MODEL, max_tokens=3, temperature=0, n=2, echo=True)
    r = client.completions.create(prompt=[prompts[0], prompts[1], prompts[2]], **kw)
    assert [c.index for c in r.choices] == list(range(6))
    for c in r.choices:
        assert c.text.startswith(prompts[c.index // 2]), (c.index, c.text)
        assert len(c.text) > len(prompts[c.index // 2])
    assert r.usage.prompt_tokens == sum(
        len(server.post("/tokenize", json.dumps({"prompt": p}).encode())[2]["tokens"])
        for p in prompts
    )
    # Token lists too, and streamed: each index's chunks join into its choice.
    texts = collections.defaultdict(str)
    reasons = {}
    dogs = server.post("/tokenize", json.dumps({"prompt": "Dogs"}).encode())[2]["tokens"]
    for chunk in client.completions.create(prompt=[ids, dogs], stream=True, **kw):
        (c,) = chunk.choices
        texts[c.index] += c.text
        if c.finish_reason:
            reasons[c.index] = c.finish_reason
        assert chunk.system_fingerprint.startswith("fp_okv_")
    assert sorted(texts) == [0, 1, 2, 3] and len(reasons) == 4
    assert all(texts[i].startswith(prompts[1]) for i in (0, 1))
    assert all(texts[i].startswith("Dogs") for i in (2, 3))


def test_echo_prepends_the_prompt_whole_and_streamed(server):
    client = server.client()
    text = "Bread is made from"
    blue = token_id(server, " blue")  # forced: the same generated text every time
    kw = dict(model=MODEL, prompt=text, max_tokens=3, temperature=0, logit_bias={str(blue): 100})
    plain = client.completions.create(**kw).choices[0].text
    assert plain == " blue blue blue"
    assert client.completions.create(**kw, echo=True).choices[0].text == text + plain
    chunks = list(client.completions.create(**kw, echo=True, stream=True))
    assert chunks[0].choices[0].text == text
    assert "".join(c.choices[0].text for c in chunks) == text + plain
    ids = server.post("/tokenize", json.dumps({"prompt": text}).encode())[2]["tokens"]
    r = client.completions.create(**{**kw, "prompt": ids}, echo=True)
    assert r.choices[0].text == text + plain  # a token prompt echoes its text


def test_max_completion_tokens_and_its_older_name(server):
    client = server.client()
    for kw in ({"max_completion_tokens": 2}, {"max_tokens": 2}):
        r = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, **kw)
        assert r.usage.completion_tokens == 2 and r.choices[0].finish_reason == "length"
    both = {"max_tokens": 2, "max_completion_tokens": 2}  # agreeing: fine
    r = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0, **both)
    assert r.usage.completion_tokens == 2


def test_first_chat_delta_and_the_system_fingerprint(server):
    client = server.client()
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MSGS, max_tokens=3, temperature=0, stream=True
        )
    )
    first = chunks[0].choices[0].delta
    assert (first.role, first.content) == ("assistant", "")
    # On the wire: "content" is there, as a string.
    body = json.dumps({"model": MODEL, "messages": MSGS, "max_tokens": 1, "stream": True}).encode()
    req = urllib.request.Request(
        server.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        raw_first = json.loads(r.readline().decode()[len("data: ") :])
    assert raw_first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    fps = {c.system_fingerprint for c in chunks}
    whole = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=1)
    comp = client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    fps |= {whole.system_fingerprint, comp.system_fingerprint}
    assert len(fps) == 1 and re.fullmatch(r"fp_okv_[0-9a-f]{8}", fps.pop())


CHAT_REFUSED = [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
    ("tool_choice", "required"),  # without tools (tool calls: test_serve_tools.py)
    ("tool_choice", "auto"),
    ("parallel_tool_calls", True),
    ("functions", [{"name": "f", "parameters": {}}]),
    ("function_call", "auto"),
    ("response_format", {"type": "sound"}),  # json_object and json_schema: structured tests
    ("prediction", {"type": "content", "content": "x"}),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("modalities", ["text", "audio"]),
    ("reasoning_effort", "low"),
    ("web_search_options", {}),
    ("service_tier", "flex"),
    ("echo", True),  # completions' only
    ("best_of", 1),
    ("top_k", 5),  # a vendor extension: unknown, so refused
    ("frequency_penalty", 2.5),
    ("presence_penalty", -3),
    ("frequency_penalty", "1"),
    ("logit_bias", {"49152": 1}),  # outside SmolLM2's vocabulary
    ("logit_bias", {"12": 101}),
    ("logit_bias", {"x": 1}),
    ("logit_bias", {"-3": 1}),
    ("logit_bias", {"12": True}),
    ("stream_options", {"include_usage": True}),  # without stream: true
    ("max_completion_tokens", 0),
]
COMPLETIONS_REFUSED = [
    ("best_of", 2),
    ("suffix", "end"),
    ("logprobs", 1, "echo", True),  # echo + logprobs: the echo is what is refused
    ("tools", []),  # chat's only
    ("max_completion_tokens", 4),  # chat's only
    ("logit_bias", {"49152": -1}),
    ("presence_penalty", 2.01),
    ("stream_options", {"include_usage": False}),
]


def _case(extra):
    pairs = dict(zip(extra[::2], extra[1::2]))
    return pairs, extra[-2]


@pytest.mark.parametrize(
    "path,extra",
    [("/v1/chat/completions", e) for e in CHAT_REFUSED]
    + [("/v1/completions", e) for e in COMPLETIONS_REFUSED],
    ids=lambda x: x if isinstance(x, str) else "-".join(map(str, x[::2])),
)
def test_a_parameter_not_honoured_is_a_400_naming_it_that_changes_nothing(server, path, extra):
    fields, name = _case(extra)
    base = {"model": MODEL, "max_tokens": 2}
    base.update({"messages": MSGS} if "chat" in path else {"prompt": "Hi"})
    before = server.metric("offgraph_kv_prompt_tokens_total")
    status, _, err = server.post(path, json.dumps({**base, **fields}).encode())
    assert status == 400, err
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["type"] == "invalid_request_error"
    assert err["error"]["param"].split(".")[0] == name, err
    assert name in err["error"]["message"]
    assert server.metric("offgraph_kv_prompt_tokens_total") == before
    h = settled_health(server)
    assert h["audit"] == "ok" and h["running"] == 0 and h["waiting"] == 0


def test_refusals_through_the_openai_client_and_accepted_labels(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL,
            messages=MSGS,
            max_tokens=2,
            tool_choice={"type": "function", "function": {"name": "g"}},
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    assert e.value.body["param"] == "tool_choice"
    # Labels, and the "off" values of refused parameters, are accepted.
    r = client.chat.completions.create(
        model=MODEL,
        messages=MSGS,
        max_tokens=2,
        temperature=0,
        user="u-1",
        metadata={"k": "v"},
        store=False,
        response_format={"type": "text"},
        tool_choice="none",
        service_tier="auto",
        extra_body={"modalities": ["text"], "reasoning_effort": None},
    )
    assert r.usage.completion_tokens == 2
    r = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, best_of=1, user="u")
    assert r.usage.completion_tokens == 2


@pytest.mark.parametrize(
    "method,path,status",
    [("GET", "/v1/nope", 404), ("POST", "/nope", 404), ("GET", "/v1/completions", 405)],
)
def test_unknown_routes_and_methods_answer_in_openai_shape(server, method, path, status):
    got, headers, body = raw(server, method, path)
    assert got == status
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and path in body["error"]["message"]
    if status == 405:
        assert headers["Allow"] == "POST"
    got, _, body = raw(server, "GET", "/health?audit=maybe")
    assert got == 400 and body["error"]["param"] == "audit"
