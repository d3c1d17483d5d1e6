"""Two ``offgraph-kv serve`` processes on one Redis (``--store``), on each engine: the prompt
chunks the first saves as its prefill passes each chunk end, the second loads on admission, so
the second's first request reports ``cached_tokens`` and answers as the first did. The keys bind
the model identity: the torch path's (a weights digest) and the native engine's (the GGUF file's
digest) differ, so one engine's rows are never served to the other."""

from __future__ import annotations

import pytest
from prefix_store.conftest import RedisServer

ARGS = ("--n-cells", "4096", "--max-batch-tokens", "256", "--threads", "2")
PROMPT = " ".join(
    f"Entry {i}: the bakery's ledger notes {i * 7 % 13} loaves of rye and {i * 5 % 11} pies."
    for i in range(20)
)  # about 400 tokens: one whole 256-token chunk


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv.url
    srv.stop()


@pytest.mark.parametrize("engine", ["torch", "native"])
def test_two_servers_share_a_prefix_through_redis(start_server, redis_url, engine):
    first = start_server("gemma-3-270m", *ARGS, "--engine", engine, "--store", redis_url)
    kw = dict(model="gemma-3-270m", prompt=PROMPT, max_tokens=6, temperature=0)
    a = first.client().completions.create(**kw)
    assert a.usage.prompt_tokens > 256
    # A cold store for this engine (the other engine's run saved this prompt under its own
    # identity), an empty cache.
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    second = start_server("gemma-3-270m", *ARGS, "--engine", engine, "--store", redis_url)
    b = second.client().completions.create(**kw)
    assert b.usage.prompt_tokens_details.cached_tokens == 256  # the chunk the first saved
    assert b.choices[0].text == a.choices[0].text
    assert second.metric("offgraph_kv_cached_tokens_total") == 256
    for s in (first, second):  # the next engine's servers need the memory
        assert s.stop() == 0, s.output()
