"""``offgraph-kv serve`` on a tiny random-weight Llama saved to a local directory (MODEL as a
transformers directory; no tokenizer, so prompts are token ids and texts are the ids joined by
spaces): greedy outputs equal ``model.generate``, every bad input is an OpenAI-shaped 4xx that
never reaches the generator, the queue limit answers 503 with Retry-After, a client that
disconnects cancels its request and the cache's audit passes after, SIGTERM mid-stream exits 0."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest
import torch
from model_helpers import reference, tiny_model

from .serve_helpers import Server

# Wide enough that a 1,900-token generation takes seconds (the queue test needs a request that
# runs while others wait), small enough to load in a moment.
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, head_dim=32)
SHAPE["max_position_embeddings"] = 2048


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", **SHAPE)


@pytest.fixture(scope="module")
def model_dir(model, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def server(start_server, model_dir):
    # 2,000 cells: one 1,900-token request at a time; at most one request waits for its first
    # token, a second one is refused.
    return start_server(
        model_dir, "--n-cells", "2000", "--max-queue", "1", "--max-batch-tokens", "64"
    )


def ids(text: str) -> list[int]:
    return [int(t) for t in text.split()]


def prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 128, (n,), generator=g).tolist()


def name(model_dir: str) -> str:
    return model_dir.rstrip("/").rsplit("/", 1)[-1]


def test_models_lists_the_served_name(server, model_dir):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [name(model_dir)]


def test_metrics_and_health_name_what_they_count(server):
    text = server.text("/metrics")
    for name in [
        "offgraph_kv_requests_running",
        "offgraph_kv_requests_waiting",
        "offgraph_kv_cells_used",
        "offgraph_kv_cells_free",
        "offgraph_kv_cells_cached",
        "offgraph_kv_prompt_tokens_total",
        "offgraph_kv_cached_tokens_total",
        "offgraph_kv_generated_tokens_total",
        "offgraph_kv_step_seconds_bucket",
        "offgraph_kv_time_to_first_token_seconds_bucket",
        "offgraph_kv_pool_committed_bytes",
        "offgraph_kv_process_resident_bytes",
    ]:
        assert f"\n{name}" in text, name
    # The pools hold some pages (each head's first, at least); the process holds more. The
    # engine publishes the figure between steps (at once when idle): bounded wait for the first.
    deadline = time.monotonic() + 10
    while (committed := server.metric("offgraph_kv_pool_committed_bytes")) == 0:
        assert time.monotonic() < deadline, "the pools' committed bytes were never published"
        time.sleep(0.1)
    assert 0 < committed < server.metric("offgraph_kv_process_resident_bytes")
    h = server.get("/health?audit=true")
    assert h["status"] == "ok" and h["audit"] == "ok"
    assert h["cells_used"] + h["cells_free"] == h["cells_total"] == 2000


def test_greedy_completion_equals_generate_whole_and_streamed(server, model, model_dir):
    client = server.client()
    p = prompt(20, 1)
    want, _ = reference(model, p, 12)
    r = client.completions.create(model=name(model_dir), prompt=p, max_tokens=12, temperature=0)
    assert ids(r.choices[0].text) == want
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 20 and r.usage.completion_tokens == 12
    chunks = list(
        client.completions.create(
            model=name(model_dir),
            prompt=p,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert ids(text) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # The same prompt again: all but its last token come from the cells the first one left.
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 19


def test_logprobs_without_a_tokenizer_are_the_models_whole_and_streamed(server, model, model_dir):
    client = server.client()
    p = prompt(16, 5)
    want, logits = reference(model, p, 10)
    kw = dict(model=name(model_dir), prompt=p, max_tokens=10, temperature=0, logprobs=3)
    r = client.completions.create(**kw).choices[0]
    lp = r.logprobs
    # Without a tokenizer a token's text is its id, with the space the text puts before it.
    assert "".join(lp.tokens) == r.text and [int(t) for t in lp.tokens] == want
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(want))]
    for i, (tok, x, top) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)):
        ref = torch.log_softmax(logits[i].double(), -1)
        assert abs(x - float(ref[want[i]])) < 1e-4 and abs(x - float(ref.max())) < 1e-4
        assert len(top) == 3 and next(iter(top)) == tok
        best = torch.topk(ref, 3)
        assert [int(t) for t in top] == best.indices.tolist()
        assert list(top.values()) == pytest.approx(best.values.tolist(), abs=1e-4)
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw)]
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == lp.tokens
    got = [x for c in chunks if c.logprobs for x in c.logprobs.token_logprobs]
    assert got == pytest.approx(lp.token_logprobs, abs=1e-4)


def test_n_forks_one_prompt_and_seeded_sampling_repeats(server, model_dir):
    client = server.client()
    p = prompt(30, 2)
    before = server.metric("offgraph_kv_cached_tokens_total")
    r = client.completions.create(model=name(model_dir), prompt=p, max_tokens=5, n=3, temperature=0)
    assert len(r.choices) == 3 and len({c.text for c in r.choices}) == 1
    # Choices 2 and 3 fork the prompt the first one prefilled (all but its last token).
    assert server.metric("offgraph_kv_cached_tokens_total") - before >= 2 * 29
    kw = dict(model=name(model_dir), prompt=p, max_tokens=8, temperature=1.0, top_p=0.9, seed=7)
    assert client.completions.create(**kw).choices[0].text == (
        client.completions.create(**kw).choices[0].text
    )


BAD = [
    (b"{not json", 400, None),
    (b'\xff\xfe{"model": 1}', 400, None),  # not UTF-8
    (b"[1, 2]", 400, None),  # not an object
    (json.dumps({"prompt": [1, 2]}).encode(), 400, None),  # no model
    (json.dumps({"model": "M", "prompt": [1, 2], "max_tokens": "5"}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "max_tokens": -1}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "max_tokens": 0}).encode(), 400, None),
    (
        json.dumps({"model": "M", "prompt": [1, 2], "max_tokens": 10**9}).encode(),
        400,
        "context_length_exceeded",
    ),
    (
        json.dumps({"model": "M", "prompt": [1] * 2100, "max_tokens": 10}).encode(),
        400,
        "context_length_exceeded",
    ),
    (json.dumps({"model": "M", "prompt": [1, 2], "temperature": "hot"}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "temperature": -1}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "top_p": 0}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "n": 0}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "stream": "yes"}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "stop": ["a"] * 5}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": ""}).encode(), 400, None),  # empty
    (json.dumps({"model": "M", "prompt": []}).encode(), 400, None),  # empty
    (json.dumps({"model": "M", "prompt": [1, 5000]}).encode(), 400, None),  # outside the vocab
    (json.dumps({"model": "M", "prompt": "text"}).encode(), 400, None),  # no tokenizer here
    (json.dumps({"model": "M", "prompt": [1, 2], "logprobs": 6}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "logprobs": -1}).encode(), 400, None),
    (json.dumps({"model": "M", "prompt": [1, 2], "logprobs": True}).encode(), 400, None),
    (json.dumps({"model": "nope", "prompt": [1, 2]}).encode(), 404, "model_not_found"),
]


@pytest.mark.parametrize("body,status,code", BAD)
def test_bad_input_is_an_openai_error_and_never_reaches_the_generator(
    server, model_dir, body, status, code
):
    body = body.replace(b'"M"', json.dumps(name(model_dir)).encode())
    prompt_tokens = server.metric("offgraph_kv_prompt_tokens_total")
    got, headers, err = server.post("/v1/completions", body)
    assert got == status, err
    assert set(err["error"]) == {"message", "type", "param", "code"} and err["error"]["message"]
    if code:
        assert err["error"]["code"] == code
    assert server.metric("offgraph_kv_prompt_tokens_total") == prompt_tokens
    # Chat on a model without a tokenizer, and a chat body without messages.
    bad_chat = {"model": name(model_dir), "messages": []}
    assert server.post("/v1/chat/completions", json.dumps(bad_chat).encode())[0] == 400
    # ... and the server still serves.
    r = server.client().completions.create(model=name(model_dir), prompt=[3, 4, 5], max_tokens=2)
    assert len(ids(r.choices[0].text)) == 2


def wait_for(cond, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_queue_limit_503_and_a_disconnect_cancels(server, model_dir):
    client = server.client()
    m = name(model_dir)
    # A: 1,900 tokens; it holds most cells, so B (as many) waits: the queue (limit 1) is full.
    stream = client.completions.create(
        model=m, prompt=prompt(8, 3), max_tokens=1900, temperature=0, stream=True
    )
    it = iter(stream)
    next(it)
    results: dict = {}

    def b():
        results["b"] = server.post(
            "/v1/completions",
            json.dumps({"model": m, "prompt": prompt(8, 4), "max_tokens": 1900}).encode(),
        )

    t = threading.Thread(target=b)
    t.start()
    wait_for(lambda: server.metric("offgraph_kv_requests_waiting") == 1)
    status, headers, err = server.post(
        "/v1/completions", json.dumps({"model": m, "prompt": [1, 2], "max_tokens": 2}).encode()
    )
    assert status == 503 and err["error"]["code"] == "queue_full", err
    assert int(headers["Retry-After"]) >= 1
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=m, prompt=[1, 2], max_tokens=2)
    assert e.value.status_code == 503
    # A's client goes away mid-stream: A is cancelled, its cells freed, B runs to its end.
    stream.close()
    t.join(300)
    assert results["b"][0] == 200 and len(ids(results["b"][2]["choices"][0]["text"])) == 1900
    wait_for(lambda: server.get("/health")["running"] == 0)
    h = server.get("/health?audit=true")
    assert h["audit"] == "ok", h
    assert h["waiting"] == 0 and h["cells_used"] == h["cells_cached"]
    assert h["requests_cancelled"] >= 1


def test_sigterm_mid_stream_finishes_the_stream_and_exits_0(model_dir):
    # In-flight requests may finish for up to --shutdown-timeout seconds (then they are cut).
    s = Server(model_dir, "--max-batch-tokens", "64", "--shutdown-timeout", "600")
    try:
        stream = s.client().completions.create(
            model=name(model_dir), prompt=[5, 6, 7], max_tokens=100, temperature=0, stream=True
        )
        it = iter(stream)
        next(it)
        s.proc.send_signal(15)
        rest = list(it)  # the in-flight request finishes, [DONE] ends it
        assert rest and rest[-1].choices[0].finish_reason == "length"
        assert s.proc.wait(120) == 0, s.output()
    finally:
        s.stop()


def test_engine_native_refuses_a_transformers_directory(model_dir):
    import subprocess
    import sys

    from .serve_helpers import free_port

    cmd = [sys.executable, "-m", "offgraph_kv", "serve", model_dir, "--engine", "native"]
    out = subprocess.run(
        [*cmd, "--port", str(free_port())], capture_output=True, text=True, timeout=300
    )
    assert out.returncode != 0
    assert "native engine runs .gguf files" in out.stderr and "--engine torch" in out.stderr
