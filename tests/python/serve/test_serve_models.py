"""``offgraph-kv serve --engine torch`` (transformers, float32) on the two real models (Gemma 3
270M and SmolLM2-135M from their PyPI packages, one server process each for the module; the
native engine's servers are ``test_serve_native.py``'s), through the official ``openai`` client:
greedy completions and chat completions, whole and streamed, equal ``model.generate``'s; ``n=3``
forks one prefilled prompt; 32 concurrent streaming clients sharing a system prompt, a third
of them leaving mid-stream: the finished streams equal ``generate`` and afterwards the cache
holds only its prefix cache (its audit passes)."""

from __future__ import annotations

import pytest
import torch
from model_helpers import reference
from offgraph_kv.serve.loading import chat_ids, stop_token_ids, with_chat_template
from offgraph_kv.tools.serve_demo import QUESTIONS  # the demo's customer questions

from .serve_helpers import settled_health, stream_chats

torch.set_num_threads(2)

ARGS = ("--engine", "torch", "--n-cells", "8192", "--max-batch-tokens", "256", "--threads", "2")
SYSTEM = (
    "You are a helpful assistant for a small bakery in a quiet town. Answer in one short "
    "sentence, politely, and mention the opening hours (7am to 3pm, closed on Mondays) when "
    "they are relevant. Never invent products: the bakery sells bread, rolls, cakes, pies and "
    "coffee, and takes orders for birthday cakes two days ahead."
)


@pytest.fixture(scope="module")
def servers(start_server):
    """``servers(name)``: the module's server of model ``name``, started on first use."""
    started: dict = {}

    def get(name: str):
        if name not in started:
            started[name] = start_server(name, *ARGS)
        return started[name]

    return get


@pytest.fixture(scope="module")
def gemma(servers, gemma3_270m, gemma3_270m_tokenizer):
    tok = with_chat_template(gemma3_270m_tokenizer, gemma3_270m)
    return servers("gemma-3-270m"), "gemma-3-270m", gemma3_270m, tok


@pytest.fixture(scope="module", params=["gemma-3-270m", "smollm2-135m"])
def served(request, servers):
    """``(server, model name, model, tokenizer)`` for each real model."""
    if request.param == "gemma-3-270m":
        return request.getfixturevalue("gemma")
    model, tok = request.getfixturevalue("smollm2_135m")
    with_chat_template(tok, model)
    return servers(request.param), request.param, model, tok


def expected(model, tok, ids: list[int], n: int) -> str:
    toks, _ = reference(model, ids, n, eos=stop_token_ids(tok))
    return tok.decode(toks, skip_special_tokens=True)


def test_completions_equal_generate_whole_and_streamed(served):
    server, name, model, tok = served
    client = server.client()
    text = "The three primary colours are"
    want = expected(model, tok, tok(text)["input_ids"], 10)
    r = client.completions.create(model=name, prompt=text, max_tokens=10, temperature=0)
    assert r.choices[0].text == want
    assert r.usage.prompt_tokens == len(tok(text)["input_ids"])
    stream = client.completions.create(
        model=name, prompt=text, max_tokens=10, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream) == want


def test_chat_equals_generate_whole_and_streamed(served):
    server, name, model, tok = served
    client = server.client()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    want = expected(model, tok, chat_ids(tok, msgs), 12)
    r = client.chat.completions.create(model=name, messages=msgs, max_tokens=12, temperature=0)
    assert r.choices[0].message.content == want
    assert r.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model=name,
        messages=msgs,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    # The same conversation again: its prompt but the last token comes from shared cells.
    use = chunks[-1].usage
    assert use.prompt_tokens == len(chat_ids(tok, msgs))
    assert use.prompt_tokens_details.cached_tokens == use.prompt_tokens - 1


def test_n3_forks_one_prefilled_prompt(served):
    server, name, model, tok = served
    client = server.client()
    text = "Part 7. " + SYSTEM  # a prompt no earlier test sent
    n_prompt = len(tok(text)["input_ids"])
    before = server.get("/health")
    cached = server.metric("offgraph_kv_cached_tokens_total")
    r = client.completions.create(model=name, prompt=text, max_tokens=4, n=3, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) == 1  # greedy: one answer three times
    assert r.choices[0].text == expected(model, tok, tok(text)["input_ids"], 4)
    # Choices 1 and 2 forked the prompt choice 0 prefilled: the cells held grew by one prompt
    # and three continuations, not three prompts.
    after = server.get("/health")
    assert after["cells_used"] - before["cells_used"] <= n_prompt + 3 * 4
    assert server.metric("offgraph_kv_cached_tokens_total") - cached >= 2 * (n_prompt - 1)


def test_32_concurrent_streams_a_third_leaving(gemma):
    server, name, model, tok = gemma
    convs = [
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (customer {i})"},
        ]
        for i in range(32)
    ]
    leaving = {i for i in range(32) if i % 3 == 2}

    cancelled = server.get("/health")["requests_cancelled"]
    texts = stream_chats(server, name, convs, leaving, stay=6, leave=64)
    for i, text in enumerate(texts):
        if i not in leaving:
            assert text == expected(model, tok, chat_ids(tok, convs[i]), 6), i
    h = settled_health(server)
    assert h["audit"] == "ok", h
    assert h["running"] == 0 and h["waiting"] == 0
    assert h["cells_used"] == h["cells_cached"]  # only the prefix cache is left
    assert h["requests_cancelled"] > cancelled  # the clients that left were cancelled


def test_readme_openai_example_runs(gemma, capsys):
    """The README's ``openai`` example (its ``py`` block), against this module's server."""
    import re
    from pathlib import Path

    server, name, model, tok = gemma
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    (block,) = re.findall(r"```py\n(.*?)```", readme, flags=re.S)
    exec(compile(block.replace("http://127.0.0.1:8000", server.url), "README.md", "exec"), {})
    msgs = [{"role": "user", "content": "Name three colours."}]
    assert capsys.readouterr().out == expected(model, tok, chat_ids(tok, msgs), 32)
