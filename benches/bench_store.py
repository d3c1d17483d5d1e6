"""Time to first token on Gemma 3 270M with a prefix-store hit against a full prefill.

The prompt is a 2,048-token shared prefix plus 32 new tokens. One process prefills the whole
prompt once and saves its chunks (256 tokens each) to every backend; then, round-robin so they
share the machine's noise (the order rotates every round), each mode starts from an empty
``OffgraphCache`` and runs ``model.generate(..., max_new_tokens=1)``:

* ``full``: prefill all 2,080 tokens;
* ``memory`` / ``redis`` / ``cluster``: ``PrefixStore.load`` (2,048 tokens restored from a
  ``MemoryBackend``, a ``redis-server`` on loopback, a 3-node Redis Cluster on loopback), then
  prefill the 32 new tokens.

Reported: the median time to first token of each mode and its ratio to ``full`` (target: a
Redis hit at least 10x faster), the median ``load`` time alone and its throughput (stored bytes
/ load time, GB/s), and the bytes stored per token (float32 pools, the only dtype today). Every
mode's first token is checked against the full prefill's. The servers are started and stopped
here (Debian's ``redis-server``).

    python benches/bench_store.py [--reps 5] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from offgraph_kv.hf import OffgraphCache
from offgraph_kv.store import MemoryBackend, PrefixStore, RedisBackend
from offgraph_kv.tools.store_demo import demo_prompt, load_gemma

PREFIX, NEW, CHUNK = 2048, 32, 256


def _servers():
    """The loopback server helpers of the store tests."""
    path = Path(__file__).resolve().parent.parent / "tests/python/prefix_store/conftest.py"
    spec = importlib.util.spec_from_file_location("store_servers", path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def first_token(model, tokens, store=None):
    """(seconds to the first generated token, load seconds, tokens restored, token)."""
    ids = torch.tensor([tokens])
    t0 = time.perf_counter()
    cache = OffgraphCache(model.config)
    restored = store.load(cache, tokens) if store is not None else 0
    t1 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            cache=cache,
            max_new_tokens=1,
            do_sample=False,
        )
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, restored, int(out[0, -1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    srv = _servers()
    model = load_gemma()
    model.generation_config.eos_token_id = None
    tokens = demo_prompt(PREFIX + NEW, seed=42)
    with tempfile.TemporaryDirectory() as tmp:
        redis = srv.RedisServer(Path(tmp) / "single")
        cluster = srv.RedisCluster(Path(tmp) / "cluster")
        try:
            stores = {
                "memory": PrefixStore(MemoryBackend(1 << 31), chunk_tokens=CHUNK, model=model),
                "redis": PrefixStore(RedisBackend(redis.url), chunk_tokens=CHUNK, model=model),
                "cluster": PrefixStore(RedisBackend(cluster.url), chunk_tokens=CHUNK, model=model),
            }
            cache = OffgraphCache(model.config)
            with torch.no_grad():
                model(torch.tensor([tokens]), cache=cache, use_cache=True)
            for name, st in stores.items():
                st.clear()
                written = st.save(cache, tokens)
                assert written == PREFIX // CHUNK and not written.failed, (name, written)
            stored = stores["memory"].stats()["bytes"]
            del cache
            modes = ["full", *stores]
            ttft: dict[str, list[float]] = {m: [] for m in modes}
            load: dict[str, list[float]] = {m: [] for m in modes}
            tok: dict[str, set[int]] = {m: set() for m in modes}
            first_token(model, tokens[:300])  # warm-up
            for rep in range(args.reps):
                # Rotated each round, so no mode always runs right after another.
                for m in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
                    t, lt, restored, token = first_token(model, tokens, stores.get(m))
                    assert restored == (0 if m == "full" else PREFIX), (m, restored)
                    ttft[m].append(t)
                    load[m].append(lt)
                    tok[m].add(token)
        finally:
            cluster.stop()
            redis.stop()
    full = statistics.median(ttft["full"])
    rows = []
    print(
        f"Gemma 3 270M, float32 pools, prefix {PREFIX} + {NEW} new tokens, chunks of {CHUNK}, "
        f"{args.reps} runs per mode, {torch.get_num_threads()} torch threads"
    )
    print(f"stored: {stored} bytes for {PREFIX} tokens = {stored / PREFIX:.0f} bytes/token")
    print("| mode | TTFT median (ms) | vs full | load median (ms) | load GB/s | first token |")
    print("|---|---|---|---|---|---|")
    for m in modes:
        t = statistics.median(ttft[m])
        lt = statistics.median(load[m])
        gbs = stored / lt / 1e9 if m != "full" else float("nan")
        same = tok[m] == tok["full"] and len(tok[m]) == 1
        print(
            f"| {m} | {t * 1000:.0f} | {full / t:.1f}x | {lt * 1000:.1f} | {gbs:.2f} | "
            f"{'same' if same else 'DIFFERS'} |"
        )
        rows.append(
            {
                "mode": m,
                "ttft_ms": [x * 1000 for x in ttft[m]],
                "load_ms": [x * 1000 for x in load[m]],
                "median_ttft_ms": t * 1000,
                "speedup_vs_full": full / t,
                "load_gb_s": gbs,
                "first_token_matches": same,
            }
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes_per_token": stored / PREFIX, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
