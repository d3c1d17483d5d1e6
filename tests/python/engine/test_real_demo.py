"""``offgraph-kv demo`` on the session's Gemma 3 270M (native engine), at a small load: the chat
is answered as text, the conversations fork the shared system prompt (reuse is exactly what
sharing predicts), the K/V held is the unshared copies less the shared cells, and the table
has its rows."""

from __future__ import annotations

import pytest
from offgraph_kv.serve.loading import GEMMA3_TEMPLATE
from offgraph_kv.serve.tokens import GgufTokens
from offgraph_kv.tools.cli import main
from offgraph_kv.tools.real_demo import (
    CONVERSATIONS,
    SYSTEM,
    common_prefix,
    conversation_prompts,
    run_real_demo,
)

N, NEW = 4, 6


@pytest.fixture(scope="module")
def demo(gemma_engine):
    tok = GgufTokens(gemma_engine.tokenizer, GEMMA3_TEMPLATE)
    heard = []
    res = run_real_demo(
        gemma_engine,
        tok,
        "gemma-3-270m",
        n_conversations=N,
        new_tokens=NEW,
        chat_tokens=16,
        on_answer=lambda q, a: heard.append((q, a)),
    )
    return res, tok, heard


def test_the_chat_is_answered_as_text(demo):
    res, _, heard = demo
    assert heard == [(res.question, res.answer)]
    assert 1 <= res.answer_tokens <= 16
    assert sum(c.isalpha() for c in res.answer) >= 2


def test_reuse_is_the_shared_system_prompt_once_per_fork(demo):
    res, tok, _ = demo
    prompts = conversation_prompts(tok, N)
    shared = common_prefix(prompts)
    # The shared part is the chat format's opening and the whole system prompt.
    system_alone = len(tok.encode(SYSTEM, add_special_tokens=False))
    assert shared >= system_alone > 10
    assert res.system_tokens == shared
    ld = res.load
    assert ld.prompt_tokens == [len(p) for p in prompts]
    assert ld.reused_tokens == (N - 1) * shared
    assert ld.computed_tokens == sum(ld.prompt_tokens) - (N - 1) * shared
    assert ld.evictions == 0
    assert len(ld.outputs) == N and all(1 <= len(o) <= NEW for o in ld.outputs)
    assert len(ld.ttft) == N and 0 < min(ld.ttft) <= ld.ttft_quantile(0.5) <= max(ld.ttft)
    assert ld.ttft_quantile(1.0) == max(ld.ttft) < ld.seconds


def test_kv_held_is_unshared_copies_less_the_shared_cells(demo, gemma_engine):
    res, _, _ = demo
    # float32 pools: K and V of every layer's KV heads per token (computed from the model's
    # layer configs, independently of the cache's pools).
    per_token = sum(2 * lc.n_kv_heads * lc.head_dim * 4 for lc in gemma_engine.layer_configs())
    ld = res.load
    lengths = [p + len(o) - 1 for p, o in zip(ld.prompt_tokens, ld.outputs)]
    assert res.kv_unshared_bytes == per_token * sum(lengths)
    assert res.kv_unshared_bytes - res.kv_held_bytes == per_token * (N - 1) * res.system_tokens
    assert res.kv_held_bytes < res.kv_unshared_bytes


def test_the_table_has_every_row(demo):
    res, _, _ = demo
    table = res.table()
    for row in (
        "generated tokens/s (whole load)",
        "time to first token p50 / max",
        "prompt tokens reused / computed",
        f"KV held vs {N} unshared copies",
        "peak resident memory (RSS)",
    ):
        assert row in table
    assert f"{res.load.reused_tokens} / {res.load.computed_tokens}" in table
    assert res.peak_rss_mib > 100  # the model's weights alone are ~250 MB mapped and read


def test_cli_demo_prints_the_answer_the_table_and_how_to_serve(capsys):
    rc = main(["demo", "--conversations", "2", "--new-tokens", "3", "--threads", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "User: What is the capital of France?\nAssistant: " in out
    assert "2 conversations x 3 new tokens" in out and "KV held vs 2 unshared copies" in out
    assert "offgraph-kv serve path/to/model.gguf --port 8000" in out
    assert f"Customer: {CONVERSATIONS[0]}" in out
