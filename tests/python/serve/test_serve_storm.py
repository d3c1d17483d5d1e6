"""Server memory under a storm: rounds of mixed clients against one ``offgraph-kv serve
smollm2-135m`` process (streams, clients leaving after the first chunk, ``n=3``, slow readers,
stop strings, bad requests including a 200K-token prompt). Every client is answered as
documented, greedy answers are the same in every round, the server goes idle by itself after
each round and its audit passes, and after three warm-up rounds its resident memory grows by at
most 2 MiB per round on average beyond what the K/V pools committed (the prefix cache keeps
each round's new prompts, so the pools commit pages as more cells are used)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx2 as httpx  # the HTTP client the openai package is built on

MODEL = "smollm2-135m"
ARGS = ("--engine", "torch", "--n-cells", "8192", "--max-batch-tokens", "256", "--threads", "2")
WARMUP, ROUNDS = 3, 10
MIB = 1 << 20
TIMEOUT = 60.0  # every request
LONG = 200_000  # tokens of the prompt no cache holds

GREEDY = [
    "The three primary colours are",
    "A good breakfast starts with",
    "The capital of France is",
    "Bread is made from",
]
CHAT = ["What time do you open?", "Do you sell birthday cakes?"]


def body(prompt, max_tokens: int, **kw) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **kw}


async def sse_texts(r: httpx.Response, pause: float = 0.0) -> str:
    """The text of a streamed completion; sleeps ``pause`` after the first chunk."""
    text, first = [], True
    async for line in r.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("choices"):
            text.append(chunk["choices"][0].get("text") or "")
        if first and pause:
            first = False
            await asyncio.sleep(pause)
    return "".join(text)


async def one_round(url: str, r: int) -> dict:
    """16 clients at once; returns what the greedy ones answered (same every round)."""
    import openai

    oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)
    http = httpx.AsyncClient(base_url=url, timeout=TIMEOUT)

    async def greedy(i: int):
        res = await oa.completions.create(
            model=MODEL, prompt=GREEDY[i], max_tokens=6, temperature=0
        )
        return ("greedy", i), res.choices[0].text

    async def chat(i: int):
        stream = await oa.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": CHAT[i]}],
            max_tokens=6,
            temperature=0,
            stream=True,
        )
        parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        return ("chat", i), "".join(parts)

    async def leave(i: int):
        # A prompt new in every round: the prefix cache keeps it, the pools commit its cells.
        req = body(f"Round {r}, customer {i}: tell me a long story about", 8, stream=True)
        async with http.stream("POST", "/v1/completions", json=req) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    break  # leaves: the connection closes under the stream
        return None, None

    async def n3():
        res = await oa.completions.create(
            model=MODEL, prompt=f"Round {r}: my favourite cake is", max_tokens=4, n=3, temperature=0
        )
        texts = {c.text for c in res.choices}
        assert [c.index for c in res.choices] == [0, 1, 2] and len(texts) == 1, res
        return None, None

    async def slow(i: int):
        req = body(GREEDY[i], 6, stream=True)
        async with http.stream("POST", "/v1/completions", json=req) as resp:
            assert resp.status_code == 200
            return ("slow", i), await sse_texts(resp, pause=1.0)

    async def stop(i: int):
        res = await oa.completions.create(
            model=MODEL,
            prompt=f"Round {r}, list {i}: apples, pears,",
            max_tokens=6,
            stop=[","],
            temperature=0,
        )
        assert "," not in res.choices[0].text, res
        return None, None

    async def bad_long():
        resp = await http.post("/v1/completions", json=body([1] * LONG, 4))
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "context_length_exceeded"
        return None, None

    async def bad_value():
        resp = await http.post("/v1/completions", json=body("x", -1))
        assert resp.status_code == 400, resp.text
        resp = await http.post(
            "/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert resp.status_code == 400, resp.text
        return None, None

    clients = [
        *(greedy(i) for i in range(4)),
        *(chat(i) for i in range(2)),
        *(leave(i) for i in range(3)),
        n3(),
        *(slow(i) for i in range(2)),
        *(stop(i) for i in range(2)),
        bad_long(),
        bad_value(),
    ]
    assert len(clients) == 16
    try:
        done = await asyncio.wait_for(asyncio.gather(*clients), 3 * TIMEOUT)
    finally:
        await oa.close()
        await http.aclose()
    return {k: v for k, v in done if k is not None}


def idle_figures(server) -> tuple[int, int]:
    """``(resident, committed)`` bytes once the server has gone idle by itself (bounded wait)
    and its audit passes."""
    deadline = time.monotonic() + 60
    while True:
        h = server.get("/health")
        if h["running"] == 0 and h["waiting"] == 0:
            break
        assert time.monotonic() < deadline, f"the server did not go idle: {h}"
        time.sleep(0.1)
    h = server.get("/health?audit=true")
    assert h["audit"] == "ok", h
    time.sleep(0.6)  # an idle engine publishes the pools' committed bytes every 0.5 s
    resident = server.metric("offgraph_kv_process_resident_bytes")
    committed = server.metric("offgraph_kv_pool_committed_bytes")
    return int(resident), int(committed)


def test_storm_rounds_settle(start_server):
    t0 = time.monotonic()
    server = start_server(MODEL, *ARGS)
    print(f"server up in {time.monotonic() - t0:.1f} s")
    want = None
    figures = []
    for r in range(WARMUP + ROUNDS):
        t1 = time.monotonic()
        got = asyncio.run(one_round(server.url, r))
        print(f"round {r}: {time.monotonic() - t1:.1f} s")
        if want is None:
            want = got
            assert got[("slow", 0)] == got[("greedy", 0)]
        assert got == want, f"round {r}: greedy answers changed"
        figures.append(idle_figures(server))
    grown = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(figures, figures[1:])]
    for r, ((res, com), (d_res, d_com)) in enumerate(zip(figures[1:], grown), start=1):
        print(
            f"round {r}: resident {res / MIB:.1f} MiB ({d_res / MIB:+.2f}), "
            f"pools committed {com / MIB:.1f} MiB ({d_com / MIB:+.2f})"
        )
    measured = grown[WARMUP - 1 :]  # the growth of each round after the warm-up rounds
    assert len(measured) == ROUNDS
    unexplained = sum(d_res - d_com for d_res, d_com in measured) / ROUNDS
    assert unexplained <= 2 * MIB, (
        f"resident memory grew {unexplained / MIB:.2f} MiB per round beyond the pools' "
        f"committed bytes: {[(a / MIB, b / MIB) for a, b in measured]}"
    )
