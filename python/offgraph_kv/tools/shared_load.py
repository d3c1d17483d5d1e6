"""A load of requests queued together on a :class:`~offgraph_kv.batch.BatchGenerator`, stepped to
the end and measured: tokens per second over the whole load, each request's time to first token,
prompt tokens forked from held sequences against those computed, the cells held at the peak
against what unshared sequences would hold, and the K/V bytes behind them (per layer, so the
sliding layers' ring bound and the pools' dtype count). Used by ``offgraph-kv demo`` and
``offgraph-kv serve-demo``."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadResult", "kv_bytes", "run_load"]


@dataclass
class LoadResult:
    """What one load did; times in seconds from the moment every request was queued."""

    prompt_tokens: list[int]
    outputs: list[list[int]]
    seconds: float
    ttft: list[float]
    reused_tokens: int
    computed_tokens: int
    steps: int
    evictions: int
    peak_cells: int
    peak_cells_unshared: int
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else math.inf

    def ttft_quantile(self, q: float) -> float:
        """The nearest-rank ``q`` quantile of the times to first token (1.0: the slowest)."""
        ranked = sorted(self.ttft)
        return ranked[max(0, math.ceil(q * len(ranked)) - 1)]


def _bar(done: int, total: int, width: int = 30) -> str:
    k = width * done // max(total, 1)
    return f"\r[{'#' * k}{'.' * (width - k)}] {done}/{total} tokens"


def run_load(
    gen: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_token_id: Any = None,
    progress: bool = False,
) -> LoadResult:
    """Queue every prompt at once (greedy), step ``gen`` until all are done, and measure.

    A progress bar goes to stderr when ``progress`` and stderr is a terminal."""
    progress = progress and sys.stderr.isatty()
    before = gen.stats
    t0 = time.perf_counter()
    rids = [gen.add(p, max_new_tokens, eos_token_id=eos_token_id) for p in prompts]
    out: dict[int, list[int]] = {r: [] for r in rids}
    first: dict[int, float] = {}
    total, produced = len(rids) * max_new_tokens, 0
    peak_used, peak_unshared = 0, 0
    while gen.has_work:
        stepped = gen.step()
        now = time.perf_counter() - t0
        for rid, t in stepped:
            out[rid].append(t)
            first.setdefault(rid, now)
            produced += 1
        st = gen.stats
        if st["cells_used"] > peak_used:
            peak_used, peak_unshared = st["cells_used"], st["cells_unshared"]
        if progress:
            print(_bar(produced, total), end="", file=sys.stderr, flush=True)
    secs = time.perf_counter() - t0
    if progress:
        print(file=sys.stderr)
    gen.pop_finished()  # the outputs are collected above; keep the generator's record small
    st = gen.stats
    return LoadResult(
        prompt_tokens=[len(p) for p in prompts],
        outputs=[out[r] for r in rids],
        seconds=secs,
        ttft=[first[r] for r in rids],
        reused_tokens=st["prefix_tokens_reused"] - before["prefix_tokens_reused"],
        computed_tokens=st["prefill_tokens"] - before["prefill_tokens"],
        steps=st["steps"] - before["steps"],
        evictions=st["evictions"] - before["evictions"],
        peak_cells=peak_used,
        peak_cells_unshared=peak_unshared,
        stats=st,
    )


def _row_bytes(dtype: str, head_dim: int) -> int:
    """Bytes one head's K or V row of ``head_dim`` values takes in a pool of ``dtype``."""
    if dtype == "q8_0":
        return head_dim // 32 * 34  # blocks of 32 int8 values and a float16 scale
    return head_dim * {"float32": 4, "float16": 2, "bfloat16": 2}[dtype]


def kv_bytes(gen: Any, lengths: Sequence[int]) -> tuple[int, int]:
    """``(held, unshared)``: the bytes ``gen``'s K/V pools hold (every layer's rows up to its
    high-water mark: with no sequence freed, the cells in use), and what sequences of
    ``lengths`` tokens would hold as unshared copies in pools of the same dtypes (a sliding
    layer keeps at most its ring's depth of each)."""
    cfg = gen.kc.config
    unshared = 0
    for lc in gen.model_step.layer_configs():
        per_cell = lc.n_kv_heads * (
            _row_bytes(cfg.k_dtype, lc.head_dim) + _row_bytes(cfg.v_dtype, lc.head_dim)
        )
        window = getattr(lc.policy, "window", None)
        cap = None if window is None else window + gen.max_batch_tokens - 1
        unshared += per_cell * sum(n if cap is None else min(n, cap) for n in lengths)
    return gen.kc.nbytes(), unshared
