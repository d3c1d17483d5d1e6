"""The host tier on agent-like sessions: six sessions share a 2,000-token system prompt, the cells
hold about one at a time, so each is evicted into the tier; then a follow-up of the first session
is restored from the tier or prefilled afresh.

Prints the tier's bytes against a full copy per evicted sequence (what a host cache without
deduplication keeps) and the follow-up's time to first token both ways.

    python benches/bench_host_tier.py MODEL.gguf [--cells 2400] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from offgraph_kv.gguf_model import GgufModel
from offgraph_kv.hf import BatchGenerator
from offgraph_kv.store import HostTier

CHUNK = 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--cells", type=int, default=2400)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=6)
    args = ap.parse_args()
    m = GgufModel(args.model, threads=args.threads)
    rng = np.random.default_rng(0)
    system = rng.integers(1000, 30000, 2000).tolist()
    sessions = [system + rng.integers(1000, 30000, 120).tolist() for _ in range(args.sessions)]
    tier = HostTier(8 << 30, chunk_tokens=CHUNK)
    gen = BatchGenerator(m, n_cells=args.cells, max_batch_tokens=512, host_cache_bytes=tier)
    for s in sessions:
        gen.generate([s], 8)
    gen.clear_prefix_cache()  # the last one leaves through the tier too
    st = gen.stats
    per_chunk = st["host_cache_bytes"] / st["host_cache_chunks"]
    copies = sum((len(s) + 7) // CHUNK for s in sessions) * per_chunk
    print(
        f"tier: {st['host_cache_bytes'] / 2**20:.1f} MiB in {st['host_cache_chunks']} chunks; "
        f"a full copy per evicted sequence: {copies / 2**20:.1f} MiB"
    )
    follow = sessions[0] + [1234] * 20
    t = time.perf_counter()
    gen.generate([follow], 1)
    restored = time.perf_counter() - t
    n = gen.stats["host_cache_tokens_restored"] - st["host_cache_tokens_restored"]
    fresh = BatchGenerator(m, n_cells=args.cells, max_batch_tokens=512)
    t = time.perf_counter()
    fresh.generate([follow], 1)
    prefilled = time.perf_counter() - t
    print(
        f"follow-up of {len(follow)} tokens, time to first token: {restored:.2f} s with "
        f"{n} tokens from the tier, {prefilled:.2f} s prefilled ({prefilled / restored:.1f}x)"
    )


if __name__ == "__main__":
    main()
