"""Logprobs on both OpenAI endpoints, whole and streamed.

In process: a choice's token texts join to its text as it streams, partial UTF-8 characters ride
with the token completing them, tokens held back for a stop-string check come with the chunk
that sends their text, tokens cut by a stop string are not reported, and the streamed entries
equal the whole answer's.

A real ``offgraph-kv serve`` process (a tiny random-weight Llama with SmolLM2's tokenizer and
chat template saved beside it, so random tokens decode to real text, multi-byte characters
included), through the official ``openai`` client: completions ``logprobs`` and chat
``logprobs``/``top_logprobs``, whole and streamed, give token texts joining to the text,
logprobs <= 0, top lists of the asked length sorted with greedy's token first, the streamed
entries equal the whole ones, a stop string cuts the reported tokens where it cuts the text, and
bad values are 400s in OpenAI's error shape that never reach the generator."""

from __future__ import annotations

import json

import openai
import pytest
from model_helpers import tiny_model
from offgraph_kv.batch.sampling import LogprobEntry
from offgraph_kv.serve.choice import Choice
from offgraph_kv.serve.worker import Job

# -- in process: the choice's bookkeeping ---------------------------------------------------


class BytesTok:
    """A tokenizer whose tokens are byte strings (as a byte-level BPE's): a partial UTF-8
    character decodes to U+FFFD until its last byte comes."""

    PIECES = {1: b"Hel", 2: b"lo", 3: b" w", 4: b"\xe2\x82", 5: b"\xac!", 6: b"\n", 7: b"ok"}
    PIECES |= {8: b"x\xe2", 9: b""}

    def decode(self, ids, skip_special_tokens=False):
        return b"".join(self.PIECES[i] for i in ids).decode("utf-8", errors="replace")


def entry(t: int) -> LogprobEntry:
    return LogprobEntry(t, -0.5 * t, [(t, -0.5 * t), (9, -9.0)])


def choice(stops, k=2):
    job = Job([1], 8, 0.0, 1.0, None, frozenset(), None, None, logprobs=k)  # type: ignore[arg-type]
    return Choice(job, BytesTok(), stops)


def streamed(tokens, stops, reason="length"):
    """``(chunks' texts, their logprobs)`` as ``_stream`` sends them."""
    c, texts, lps = choice(stops), [], []
    for t in tokens:
        c.add(t)
        c.add_logprob(entry(t))
        text = c.pending()
        if text or c.reason is not None:
            texts.append(text)
            lps.append(c.take_logprobs())
        if c.reason is not None:
            return c, texts, lps
    c.reason = reason
    texts.append(c.pending())
    lps.append(c.take_logprobs())
    return c, texts, lps


def whole(tokens, stops, reason="length"):
    c = choice(stops)
    for t in tokens:
        if c.reason is None:
            c.add(t)
            c.add_logprob(entry(t))
    c.reason = c.reason or reason
    return c, c.take_logprobs()


@pytest.mark.parametrize(
    "tokens,stops,want_text,want_tokens",
    [
        # the euro sign's two tokens: the first adds nothing, the second the whole character
        ([1, 2, 3, 4, 5, 7], [], "Hello w€!ok", ["Hel", "lo", " w", "", "€!", "ok"]),
        # "\n" stops: its token and the one after are not reported
        ([1, 2, 6, 7], ["\n"], "Hello", ["Hel", "lo"]),
        # "lo w" spans two tokens: "lo" is held back, then cut with " w"
        ([1, 2, 3, 7], ["lo w"], "Hel", ["Hel"]),
        # a stop string inside one token: the token keeps its text up to the cut
        ([1, 2, 3, 4, 5, 7], ["!o"], "Hello w€", ["Hel", "lo", " w", "", "€"]),
        # the generation ends inside a character: the last token carries its U+FFFD
        ([1, 2, 4], [], "Hello\ufffd", ["Hel", "lo", "\ufffd"]),
        ([1, 8], [], "Helx\ufffd", ["Hel", "x\ufffd"]),  # ... in the token's own bytes
        # a character never completed: its U+FFFD comes with the token that shows it broken
        ([1, 8, 2, 3], [], "Helx\ufffdlo w", ["Hel", "x", "\ufffdlo", " w"]),
        ([8, 2, 4, 5], [], "x\ufffdlo€!", ["x", "\ufffdlo", "", "€!"]),
    ],
)
def test_choice_token_texts_join_and_stream_as_the_whole(tokens, stops, want_text, want_tokens):
    c, lps = whole(tokens, stops)
    assert c.text == want_text
    assert [t.text for t in lps] == want_tokens
    assert [t.offset for t in lps] == [sum(map(len, want_tokens[:i])) for i in range(len(lps))]
    assert [t.logprob for t in lps] == [-0.5 * t for t in tokens[: len(lps)]]
    for t in lps:  # the chosen token in the top list under the text it added
        assert t.top[0] == (t.text, t.logprob) and t.top[1] == ("", -9.0)  # token 9: no bytes
    s, texts, chunks = streamed(tokens, stops)
    assert "".join(texts) == want_text
    assert [t for ch in chunks for t in ch] == lps
    for text, ch in zip(texts, chunks):  # each chunk carries the tokens of the text it sends
        assert "".join(t.text for t in ch) == text


def test_a_choice_without_logprobs_reports_none():
    c = choice([], k=None)
    c.add(1)
    assert c.take_logprobs() is None


# -- a real server --------------------------------------------------------------------------

SHAPE = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, vocab_size=49152)
SHAPE["max_position_embeddings"] = 1024


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from offgraph_kv.serve.loading import load_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama-smollm2-tok")
    tiny_model("llama", **SHAPE).save_pretrained(path)
    load_tokenizer("smollm2-135m").save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def server(start_server, model_dir):
    return start_server(model_dir, "--n-cells", "2048", "--max-batch-tokens", "64")


@pytest.fixture(scope="module")
def name(model_dir):
    return model_dir.rstrip("/").rsplit("/", 1)[-1]


PROMPT = "The three primary colours are"
# A repeated prompt comes from the prefix cache: its last token is computed in another step
# shape than the first time, which moves float32 logits in the last bits.
TOL = 1e-4
MSGS = [{"role": "user", "content": "Name a colour."}]


def check_completion(choice, k: int):
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) > 0
    for tok, x, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert x <= 0
        # The top k plus the chosen token (OpenAI's "up to logprobs + 1"): greedy's is the first.
        assert len(top) == max(k, 1)
        values = list(top.values())
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert next(iter(top.items())) == (tok, x)


def check_chat(choice, k: int):
    content = choice.logprobs.content
    assert content and "".join(t.token for t in content) == choice_text(choice)
    for t in content:
        assert t.logprob <= 0 and t.bytes == list(t.token.encode())
        assert len(t.top_logprobs) == k
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        for a in t.top_logprobs:
            assert a.bytes == list(a.token.encode())
        if k:
            assert (t.top_logprobs[0].token, t.top_logprobs[0].logprob) == (t.token, t.logprob)


def same_entries(a, b):
    """Chat logprob entries equal up to TOL in their values."""
    assert [(t.token, t.bytes, [x.token for x in t.top_logprobs]) for t in a] == [
        (t.token, t.bytes, [x.token for x in t.top_logprobs]) for t in b
    ]
    for s, t in zip(a, b):
        assert s.logprob == pytest.approx(t.logprob, abs=TOL)
        assert [x.logprob for x in s.top_logprobs] == pytest.approx(
            [x.logprob for x in t.top_logprobs], abs=TOL
        )


def choice_text(choice) -> str:
    return choice.message.content


def test_completions_logprobs_whole_and_streamed(server, name):
    client = server.client()
    for k in (0, 1, 5):
        kw = dict(model=name, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=k)
        r = client.completions.create(**kw)
        check_completion(r.choices[0], k)
        chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw)]
        assert "".join(c.text for c in chunks) == r.choices[0].text
        lps = [c.logprobs for c in chunks if c.logprobs is not None]
        want = r.choices[0].logprobs
        for field in ("tokens", "text_offset"):
            assert [x for lp in lps for x in getattr(lp, field)] == getattr(want, field), field
        got = [x for lp in lps for x in lp.token_logprobs]
        assert got == pytest.approx(want.token_logprobs, abs=TOL)
        tops = [x for lp in lps for x in lp.top_logprobs]
        assert [list(t) for t in tops] == [list(t) for t in want.top_logprobs]
        for a, b in zip(tops, want.top_logprobs):
            assert list(a.values()) == pytest.approx(list(b.values()), abs=TOL)
        for c in chunks:  # a chunk's tokens are the text it carries
            if c.logprobs is not None:
                assert "".join(c.logprobs.tokens) == c.text
            else:
                assert c.text == ""


def test_chat_logprobs_whole_and_streamed(server, name):
    client = server.client()
    for k in (None, 0, 3, 20):
        kw = dict(model=name, messages=MSGS, max_tokens=24, temperature=0, logprobs=True)
        if k is not None:
            kw["top_logprobs"] = k
        r = client.chat.completions.create(**kw)
        check_chat(r.choices[0], k or 0)
        chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **kw)]
        assert "".join(c.delta.content or "" for c in chunks) == choice_text(r.choices[0])
        streamed = [t for c in chunks if c.logprobs is not None for t in c.logprobs.content]
        same_entries(streamed, r.choices[0].logprobs.content)
    # Without logprobs: none, whole and streamed.
    r = client.chat.completions.create(model=name, messages=MSGS, max_tokens=4, temperature=0)
    assert r.choices[0].logprobs is None
    stream = client.chat.completions.create(
        model=name, messages=MSGS, max_tokens=4, temperature=0, stream=True
    )
    assert all(c.choices[0].logprobs is None for c in stream)


def test_a_stop_string_cuts_the_reported_tokens_with_the_text(server, name):
    client = server.client()
    kw = dict(model=name, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=2)
    full = client.completions.create(**kw).choices[0]
    stop = full.text[len(full.text) // 2 :][:3]  # a piece of the middle of the text
    cut = full.text[: full.text.find(stop)]
    r = client.completions.create(stop=[stop], **kw).choices[0]
    assert r.text == cut and r.finish_reason == "stop"
    if cut:
        check_completion(r, 2)
    n = len(r.logprobs.tokens)
    assert r.logprobs.token_logprobs == pytest.approx(full.logprobs.token_logprobs[:n], abs=TOL)
    assert r.logprobs.tokens[:-1] == full.logprobs.tokens[: n - 1]  # the last may be cut short
    chunks = [c.choices[0] for c in client.completions.create(stream=True, stop=[stop], **kw)]
    assert [t for c in chunks if c.logprobs for t in c.logprobs.tokens] == r.logprobs.tokens


def test_sampled_tokens_report_the_models_distribution(server, name):
    client = server.client()
    kw = dict(model=name, prompt=PROMPT, max_tokens=16, logprobs=5, seed=3)
    greedy = client.completions.create(temperature=0, **kw).choices[0].logprobs
    hot = client.completions.create(temperature=2.0, top_p=1.0, **kw).choices[0].logprobs
    # The first token's distribution is the prompt's, whatever the sampling: the same top 5
    # (then the sampled token, when it is not among them: "up to logprobs + 1").
    top = list(hot.top_logprobs[0].items())
    assert [t for t, _ in top[:5]] == list(greedy.top_logprobs[0])
    assert [x for _, x in top[:5]] == pytest.approx(list(greedy.top_logprobs[0].values()), abs=TOL)
    for tok, x, top in zip(hot.tokens, hot.token_logprobs, hot.top_logprobs):
        assert x <= 0 and top[tok] == x and len(top) in (5, 6)
    assert hot.tokens != greedy.tokens  # temperature 2 over 49,152 random logits


BAD = [
    ("/v1/completions", {"logprobs": 6}),
    ("/v1/completions", {"logprobs": -1}),
    ("/v1/completions", {"logprobs": "2"}),
    ("/v1/completions", {"logprobs": True}),
    ("/v1/completions", {"logprobs": 1.5}),
    ("/v1/chat/completions", {"logprobs": 1}),
    ("/v1/chat/completions", {"logprobs": "true"}),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": "3"}),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": True}),
    ("/v1/chat/completions", {"top_logprobs": 2}),  # without logprobs: true
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}),
]


@pytest.mark.parametrize("path,extra", BAD)
def test_bad_logprobs_are_a_400_that_never_reaches_the_generator(server, name, path, extra):
    base = {"model": name, "max_tokens": 2}
    base.update({"messages": MSGS} if "chat" in path else {"prompt": PROMPT})
    before = server.metric("offgraph_kv_prompt_tokens_total")
    status, _, err = server.post(path, json.dumps({**base, **extra}).encode())
    assert status == 400, err
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["type"] == "invalid_request_error"
    assert "logprobs" in err["error"]["param"]
    assert server.metric("offgraph_kv_prompt_tokens_total") == before
    with pytest.raises(openai.BadRequestError):  # the official client hears a 400 too
        if "chat" in path:
            server.client().chat.completions.create(**base, **extra)
        else:
            server.client().completions.create(**base, **extra)
