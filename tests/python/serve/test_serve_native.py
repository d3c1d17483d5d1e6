"""``offgraph-kv serve`` on the native engine (the default for a ``.gguf`` and the known names)
on both real models, one server process each for the module, through the official ``openai``
client: greedy completions and chat, whole and streamed, equal the engine's own greedy run
in-process (GgufModel + BatchGenerator); ``n=3`` forks one prefill; stop strings; concurrent
streams with clients leaving, after which the cache's audit passes; seeded sampling repeats;
``--api-key`` (and ``--protect-metrics``); ``/tokenize`` and ``/detokenize`` against the GGUF's
tokenizer; logprobs against the engine's logits; a session evicted from the cells restored from the
host tier; the server process never loads torch."""

from __future__ import annotations

import json
import os

import numpy as np
import openai
import pytest
from offgraph_kv.batch import BatchGenerator
from offgraph_kv.gguf_model import GgufModel
from offgraph_kv.serve import loading
from offgraph_kv.tools.serve_demo import QUESTIONS

from .serve_helpers import settled_health, stream_chats

KEY = "okv-test-key-3f9a"
ARGS = ("--n-cells", "8192", "--max-batch-tokens", "256", "--threads", "2")
EXTRA = {"gemma-3-270m": (), "smollm2-135m": ("--protect-metrics",)}
SYSTEM = (
    "You are a helpful assistant for a small bakery in a quiet town. Answer in one short "
    "sentence, politely, and mention the opening hours (7am to 3pm, closed on Mondays) when "
    "they are relevant. Never invent products: the bakery sells bread, rolls, cakes, pies and "
    "coffee, and takes orders for birthday cakes two days ahead."
)
# The engine's logits depend a little on where a sequence's cells lie: attention over a sequence
# whose cells are not contiguous (a fork of a longer sequence, a neighbour's cells in between)
# sums in another order (~1e-6), and the 8-bit rounding of the next matmul's activations
# amplifies that over the layers (measured: up to 0.7 in SmolLM2's logits). A server's cache
# holds other sequences, the in-process reference's does not: a text that differs from the
# reference must do so where the reference's top-2 logits were this close.
NEAR_TIE = 1.0


@pytest.fixture(scope="module")
def servers(start_server):
    started: dict = {}

    def get(name: str):
        if name not in started:
            started[name] = start_server(name, *ARGS, *EXTRA[name], api_key=KEY)
        return started[name]

    return get


class Ref:
    """One model in-process: its engine, the server's tokenizer face, greedy references."""

    def __init__(self, name: str):
        where, gguf, _ = loading.resolve(name)
        self.engine = GgufModel(os.path.join(where, gguf), threads=2)
        _, self.tok, _ = loading.load_native(name, threads=2)
        self.gen = BatchGenerator(self.engine, n_cells=4096, max_batch_tokens=256)
        self._done: dict = {}

    def tokens(self, ids: list[int], n: int) -> list[int]:
        key = (tuple(ids), n)
        if key not in self._done:
            self.gen.clear_prefix_cache()  # alone, from a cold cache: as a fresh server prompt
            (out,) = self.gen.generate([ids], n, eos_token_id=sorted(self.tok.stop_ids))
            self._done[key] = out
        return self._done[key]

    def text(self, ids: list[int], n: int) -> str:
        return self.tok.decode(self.tokens(ids, n))

    def check(self, ids: list[int], n: int, got: str) -> None:
        """``got`` is the reference's text, or differs from it first at a near-tie."""
        toks = self.tokens(ids, n)
        if got == self.tok.decode(toks):
            return
        j = next(
            (j for j in range(len(toks)) if not got.startswith(self.tok.decode(toks[: j + 1]))),
            None,
        )
        assert j is not None, (got, self.tok.decode(toks))
        top = np.sort(self.engine.logits(ids + toks[:j])[-1])[-2:]
        print(f"differs at token {j}: top-2 logit gap {top[1] - top[0]:.4f}")
        assert top[1] - top[0] <= NEAR_TIE, (j, got, self.tok.decode(toks))


@pytest.fixture(scope="module", params=["gemma-3-270m", "smollm2-135m"])
def served(request, servers):
    """``(server, model name, Ref)`` for each real model."""
    return servers(request.param), request.param, Ref(request.param)


def test_completions_whole_and_streamed(served):
    server, name, ref = served
    client = server.client()
    text = "The three primary colours are"
    ids = ref.tok.encode(text)
    r = client.completions.create(model=name, prompt=text, max_tokens=10, temperature=0)
    ref.check(ids, 10, r.choices[0].text)
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens <= 10
    stream = client.completions.create(
        model=name, prompt=text, max_tokens=10, temperature=0, stream=True
    )
    ref.check(ids, 10, "".join(c.choices[0].text for c in stream))


def test_chat_whole_and_streamed(served):
    server, name, ref = served
    client = server.client()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    ids = ref.tok.chat_ids(msgs)
    r = client.chat.completions.create(model=name, messages=msgs, max_tokens=12, temperature=0)
    assert r.choices[0].message.role == "assistant"
    ref.check(ids, 12, r.choices[0].message.content)
    chunks = list(
        client.chat.completions.create(
            model=name,
            messages=msgs,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    ref.check(ids, 12, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    use = chunks[-1].usage  # the same conversation again: all but its last token shared
    assert use.prompt_tokens == len(ids)
    assert use.prompt_tokens_details.cached_tokens == use.prompt_tokens - 1


def test_n3_forks_one_prefill(served):
    server, name, ref = served
    client = server.client()
    text = "Part 7. " + SYSTEM  # a prompt no earlier test sent
    ids = ref.tok.encode(text)
    before = server.get("/health")
    cached = server.metric("offgraph_kv_cached_tokens_total")
    r = client.completions.create(model=name, prompt=text, max_tokens=4, n=3, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:  # greedy: one answer three times (up to a near-tie, see NEAR_TIE)
        ref.check(ids, 4, c.text)
    after = server.get("/health")
    assert after["cells_used"] - before["cells_used"] <= len(ids) + 3 * 4
    assert server.metric("offgraph_kv_cached_tokens_total") - cached >= 2 * (len(ids) - 1)


def test_stop_strings_cut_whole_and_streamed(served):
    server, name, ref = served
    client = server.client()
    text = "A short list of breads: rye,"
    want = ref.text(ref.tok.encode(text), 24)
    stop = want[len(want) // 2 : len(want) // 2 + 3]
    assert stop.strip(), want
    cut = want[: want.find(stop)]
    kw = dict(model=name, prompt=text, max_tokens=24, temperature=0, stop=[stop, "\x07never"])
    r = client.completions.create(**kw)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (cut, "stop")
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_runs(served):
    # A seed repeats a request's draws (tests/python/engine/test_engine_sampling.py); over a
    # server whose cache changed between two requests the logits may not (see NEAR_TIE), so
    # here sampling is only checked to run and to honour its limits.
    server, name, _ = served
    client = server.client()
    kw = dict(model=name, prompt="Bread is made from", max_tokens=8, temperature=0.9, seed=11)
    for extra in ({}, {"top_p": 0.5}, {"n": 2}):
        r = client.completions.create(**kw, **extra)
        assert len(r.choices) == extra.get("n", 1)
        assert all(c.text and c.finish_reason in ("stop", "length") for c in r.choices)
        assert r.usage.completion_tokens <= 8 * len(r.choices)


def test_concurrent_streams_some_leaving(servers):
    name = "gemma-3-270m"
    server, ref = servers(name), Ref(name)
    convs = [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (table {i})"},
        ]
        for i in range(12)
    ]
    leaving = {i for i in range(12) if i % 3 == 2}

    cancelled = server.get("/health")["requests_cancelled"]
    texts = stream_chats(server, name, convs, leaving, stay=6, leave=48)
    for i, text in enumerate(texts):
        if i not in leaving:
            ref.check(ref.tok.chat_ids(convs[i]), 6, text)
    h = settled_health(server)
    assert h["audit"] == "ok", h
    assert h["running"] == 0 and h["waiting"] == 0 and h["cells_used"] == h["cells_cached"]
    assert h["requests_cancelled"] > cancelled


def test_api_key_accepted_and_refused(servers):
    for name in ("gemma-3-270m", "smollm2-135m"):
        server = servers(name)
        assert [m.id for m in server.client().models.list().data] == [name]
        # A refused request reaches neither the generator nor the counters.
        counters = ("offgraph_kv_prompt_tokens_total", "offgraph_kv_generated_tokens_total")
        before = (settled_health(server), [server.metric(c) for c in counters])
        for bad in ("wrong", KEY + "x", KEY[:-1]):
            wrong = server.client(api_key=bad)
            with pytest.raises(openai.AuthenticationError) as e:
                wrong.completions.create(model=name, prompt="Hi", max_tokens=2)
            assert e.value.status_code == 401
            assert e.value.body == {
                "message": e.value.body["message"],
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
            with pytest.raises(openai.AuthenticationError):
                wrong.models.list()
        body = json.dumps({"prompt": "Hi"}).encode()
        for path in ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"):
            status, _, err = server.post(path, body, key="")
            assert status == 401 and err["error"]["code"] == "invalid_api_key", (path, err)
        assert (settled_health(server), [server.metric(c) for c in counters]) == before
        # /health and /metrics: open, unless --protect-metrics (the SmolLM2 server).
        import urllib.error
        import urllib.request

        for path in ("/health", "/metrics"):
            if name == "gemma-3-270m":
                with urllib.request.urlopen(server.url + path, timeout=60) as r:
                    assert r.status == 200
            else:
                with pytest.raises(urllib.error.HTTPError) as e:
                    urllib.request.urlopen(server.url + path, timeout=60)
                assert e.value.code == 401
                assert server.text(path)  # with the key


def test_api_key_from_the_environment(monkeypatch):
    from offgraph_kv.tools.cli import build_parser

    monkeypatch.setenv("OFFGRAPH_KV_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "smollm2-135m"])
    assert args.api_key == "from-env" and args.engine is None and not args.protect_metrics
    args = build_parser().parse_args(["serve", "m", "--api-key", "k", "--engine", "torch"])
    assert (args.api_key, args.engine) == ("k", "torch")
    monkeypatch.delenv("OFFGRAPH_KV_API_KEY")
    assert build_parser().parse_args(["serve", "m"]).api_key is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--engine", "cuda"])


def test_tokenize_detokenize_round_trip(served):
    server, name, ref = served
    tok = ref.engine.tokenizer
    text = "The bakery opens at seven. Café 😀 <|im_start|>"
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}]
    for body, want in [
        ({"model": name, "prompt": text}, tok.encode(text)),
        ({"content": text}, tok.encode(text)),
        ({"prompt": text, "add_special_tokens": False}, tok.encode(text, False)),
        ({"messages": msgs}, ref.tok.chat_ids(msgs)),
    ]:
        status, _, out = server.post("/tokenize", json.dumps(body).encode())
        assert status == 200, out
        assert out == {
            "tokens": want,
            "count": len(want),
            "max_model_len": ref.engine.max_positions,
        }
        status, _, back = server.post("/detokenize", json.dumps({"tokens": want}).encode())
        assert status == 200, back
        assert back == {"prompt": tok.decode(want, True), "content": tok.decode(want, True)}
    assert server.post("/detokenize", json.dumps({"tokens": tok.encode(text)}).encode())[2][
        "prompt"
    ] == tok.decode(tok.encode(text), True)


BAD_TOKENIZE = [
    b"{not json",
    b"[1]",
    b"{}",  # nothing to tokenize
    json.dumps({"prompt": 5}).encode(),
    json.dumps({"prompt": ["a"]}).encode(),
    json.dumps({"prompt": "a", "content": "b"}).encode(),  # two sources
    json.dumps({"messages": []}).encode(),
    json.dumps({"messages": [{"role": "robot", "content": "hi"}]}).encode(),
    json.dumps({"prompt": "a", "add_special_tokens": "yes"}).encode(),
    json.dumps({"prompt": "a", "model": 3}).encode(),
]
BAD_DETOKENIZE = [
    b"\xff\xfe",
    b"{}",
    json.dumps({"tokens": "1 2"}).encode(),
    json.dumps({"tokens": [-1]}).encode(),
    json.dumps({"tokens": [10**7]}).encode(),  # outside either vocabulary
    json.dumps({"tokens": [True]}).encode(),
    json.dumps({"tokens": [1.5]}).encode(),
    json.dumps({"tokens": ["1"]}).encode(),
]


def test_bad_token_requests_are_openai_errors(served):
    server, name, _ = served
    prompt_tokens = server.metric("offgraph_kv_prompt_tokens_total")
    for path, bodies in (("/tokenize", BAD_TOKENIZE), ("/detokenize", BAD_DETOKENIZE)):
        for body in bodies:
            status, _, err = server.post(path, body)
            assert status == 400, (path, body, err)
            assert set(err["error"]) == {"message", "type", "param", "code"}
            assert err["error"]["message"] and err["error"]["type"] == "invalid_request_error"
        status, _, err = server.post(path, json.dumps({"model": "nope", "tokens": [1]}).encode())
        assert status == 404 and err["error"]["code"] == "model_not_found"
    assert server.metric("offgraph_kv_prompt_tokens_total") == prompt_tokens
    # A vocabulary edge: the last id decodes, one past it is refused.
    n = server.post("/tokenize", b'{"prompt": "x"}')[2]["max_model_len"]
    assert n > 0


def test_the_native_server_never_loads_torch(servers):
    for name in ("gemma-3-270m", "smollm2-135m"):
        server = servers(name)
        with open(f"/proc/{server.proc.pid}/maps") as f:
            maps = f.read()
        assert "libtorch" not in maps and "_native" in maps
        rss = server.metric("offgraph_kv_process_resident_bytes")
        print(f"{name}: native server resident {rss / 2**20:.0f} MiB")
        assert 0 < rss < 1 << 30


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


# A server's sequence may lie over non-contiguous cells (see NEAR_TIE): its logprobs agree with
# a private forward up to the Q8 activations' rounding noise (test_engine_logprobs.py's bound).
Q8_LOGPROB_TOL = 0.6


def test_logprobs_follow_the_engines_logits(served):
    """Each token's logprob and top alternatives, whole and streamed, against ``log_softmax`` of
    ``GgufModel.logits`` over the prompt and the tokens before it (teacher-forced)."""
    server, name, ref = served
    client = server.client()
    text = "Part 9. A list of the planets, from the sun outwards:"
    ids = ref.tok.encode(text)
    r = client.completions.create(model=name, prompt=text, max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    chat = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": text}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=4,
    )
    content = chat.choices[0].logprobs.content
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    streamed = client.completions.create(
        model=name, prompt=text, max_tokens=6, temperature=0, logprobs=3, stream=True
    )
    chunks = [c.choices[0] for c in streamed if c.choices]
    s_lps = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
    assert len(s_lps) == len(lp.token_logprobs)
    assert np.allclose(s_lps, lp.token_logprobs, atol=Q8_LOGPROB_TOL)
    # The tokens the server chose, by id: the engine's own tokenizer over the text it sent.
    gen = ref.tokens(ids, 6)
    if ref.tok.decode(gen) != r.choices[0].text:
        return  # a near-tie took another path (checked by the greedy tests): nothing to compare
    want = log_softmax(ref.engine.logits(ids + gen[:-1])[len(ids) - 1 :])
    for i, (tok_id, got, top) in enumerate(zip(gen, lp.token_logprobs, lp.top_logprobs)):
        assert got <= 0.0
        assert abs(got - want[i, tok_id]) <= Q8_LOGPROB_TOL, (i, got, want[i, tok_id])
        assert abs(got - want[i].max()) <= Q8_LOGPROB_TOL  # greedy: the chosen is the top-1
        assert len(top) >= 3 and max(top.values()) == pytest.approx(got, abs=1e-6)


def test_an_evicted_session_is_restored_from_the_host_tier(start_server):
    """Two sessions that do not fit the cells at once: the second evicts the first's cached
    sequence, whose chunks go to the host tier; the first session's next turn is restored from
    there (cached tokens, the tier's counters) and generates what a never-evicted run does."""
    name = "smollm2-135m"
    server = start_server(name, "--n-cells", "1000", "--max-batch-tokens", "256", "--threads", "2")
    ref = Ref(name)
    client = server.client()
    words = "bread rye oven flour butter sugar yeast crust dough morning market river".split()

    def user(seed: int, n: int) -> str:
        return " ".join(words[(seed * 7 + i * 5) % len(words)] for i in range(n))

    a = [{"role": "system", "content": user(1, 500) + " " + SYSTEM}]
    b = [{"role": "system", "content": user(2, 500) + " " + SYSTEM}]
    for conv in (a, b):
        conv.append({"role": "user", "content": "Which cakes do you sell?"})
        r = client.chat.completions.create(model=name, messages=conv, max_tokens=4, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens < 16  # the template's opening only
    assert server.metric("offgraph_kv_host_cache_bytes") > 0
    hits = server.metric("offgraph_kv_host_cache_hits_total")
    follow = a + [{"role": "user", "content": "And do you open on Mondays?"}]
    ids = ref.tok.chat_ids(follow)
    r = client.chat.completions.create(model=name, messages=follow, max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.prompt_tokens_details.cached_tokens >= 512  # whole 256-token chunks
    assert server.metric("offgraph_kv_host_cache_hits_total") == hits + 1
    assert server.metric("offgraph_kv_host_cache_tokens_restored_total") >= 512
    ref.check(ids, 8, r.choices[0].message.content)
    assert server.get("/health?audit=true")["audit"] == "ok"
