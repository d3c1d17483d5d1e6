"""Two ``offgraph-kv serve`` processes on one Redis (``--store``): the prompt chunks the first
saves as its prefill passes each chunk end, the second loads on admission, so the second's
first request reports ``cached_tokens`` and answers as the first did."""

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


def test_two_servers_share_a_prefix_through_redis(start_server, redis_url):
    first = start_server("gemma-3-270m", *ARGS, "--store", redis_url)
    kw = dict(model="gemma-3-270m", prompt=PROMPT, max_tokens=6, temperature=0)
    a = first.client().completions.create(**kw)
    assert a.usage.prompt_tokens > 256
    assert a.usage.prompt_tokens_details.cached_tokens == 0  # a cold store, an empty cache
    second = start_server("gemma-3-270m", *ARGS, "--store", redis_url)
    b = second.client().completions.create(**kw)
    assert b.usage.prompt_tokens_details.cached_tokens == 256  # the chunk the first saved
    assert b.choices[0].text == a.choices[0].text
    assert second.metric("offgraph_kv_cached_tokens_total") == 256
