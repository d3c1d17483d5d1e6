"""The main job: many sequences served end to end through a ``KvCellCache``.

A shared prompt prefix is prefilled once (in chunks), forked with
``seq_clone`` (cells shared, no K/V copied), and every fork then decodes in
batched steps through a Gemma-like mix of ring and flat layers, with attention
read from the pools in place by :func:`offgraph_kv.attend`. Sampled steps are
checked against a float64 NumPy forward of the same tokens without a cache.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .. import _native as n
from .demo_model import (
    DemoConfig,
    fork_token,
    heads,
    make_weights,
    next_tokens,
    prompt_prefix,
    reference_hidden,
    rms_norm,
)


@dataclass
class DemoResult:
    n_seqs: int
    prefix: int
    decode: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    kv_bytes: int
    kv_live_bytes: int
    unshared_bytes: int
    shared_cells: int
    peak_slots_flat: int
    peak_slots_ring: int
    max_error: float
    checked_steps: int
    tokens: list[list[int]] = field(default_factory=list)

    def table(self) -> str:
        mib = 1 / (1 << 20)
        rows = [
            (
                "sequences x decode tokens",
                f"{self.n_seqs} x {self.decode} (shared prefix {self.prefix})",
            ),
            ("prefill", f"{self.prefill_tokens_per_s:,.0f} tokens/s"),
            ("decode", f"{self.decode_tokens_per_s:,.0f} tokens/s"),
            ("KV bytes held (pools)", f"{self.kv_bytes * mib:.2f} MiB"),
            ("KV bytes in live cells", f"{self.kv_live_bytes * mib:.2f} MiB"),
            ("N unshared copies would need", f"{self.unshared_bytes * mib:.2f} MiB"),
            ("pools / unshared", f"{self.kv_bytes / self.unshared_bytes:.2f}x"),
            ("cells shared by forks", f"{self.shared_cells}"),
            ("peak pool slots (flat / ring)", f"{self.peak_slots_flat} / {self.peak_slots_ring}"),
            (
                "spot check vs float64",
                f"max error {self.max_error:.2e} over {self.checked_steps} steps",
            ),
        ]
        return format_table(rows)


def format_table(rows: list[tuple[str, str]]) -> str:
    """``(metric, value)`` rows as a Markdown table, columns padded to their widest cell."""
    w = max(len(k) for k, _ in rows)
    v = max(36, *(len(x) for _, x in rows))
    lines = [f"| {'metric':<{w}} | {'value':<{v}} |", f"|{'-' * (w + 2)}|{'-' * (v + 2)}|"]
    lines += [f"| {k:<{w}} | {x:<{v}} |" for k, x in rows]
    return "\n".join(lines)


class _Progress:
    """A one-line bar on stderr; only when stderr is a terminal (logs stay clean)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()

    def __call__(self, label: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        fill = width * done // max(total, 1)
        sys.stderr.write(f"\r  {label:<8} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def build_cache(cfg: DemoConfig, n_seqs: int, prefix: int, decode: int, chunk: int):
    """The KvCellCache the demo needs, sized for its worst case."""
    capacity = prefix + decode
    max_step = min(max(chunk, n_seqs), capacity)
    layers = [
        n.LayerConfig(
            n.Flat() if cfg.is_flat(i) else n.Ring(window=cfg.window), cfg.n_kv_heads, cfg.head_dim
        )
        for i in range(cfg.n_layers)
    ]
    ccfg = n.CacheConfig(
        capacity, cfg.n_layers, layers, initial_capacity=min(64, capacity), max_step=max_step
    )
    n_cells = n.cells_for_forks(ccfg, prefix, n_seqs, decode)
    return n.KvCellCache(ccfg, n_cells, n_seq_max=max(n_seqs, 1)), ccfg


def run_demo(
    cfg: DemoConfig,
    n_seqs: int = 8,
    prefix: int = 512,
    decode: int = 64,
    chunk: int = 128,
    check_seqs: int = 2,
    threads: int | None = None,
    backend: str = "auto",
    progress: bool = True,
) -> DemoResult:
    w64 = make_weights(cfg)
    w = w64.astype(np.float32)
    kc, ccfg = build_cache(cfg, n_seqs, prefix, decode, chunk)
    b = kc.control()
    bar = _Progress(progress)
    qd = (cfg.n_q_heads, cfg.head_dim)
    kd = (cfg.n_kv_heads, cfg.head_dim)

    def forward(tokens: np.ndarray, ids: list[int], positions: list[int]) -> np.ndarray:
        b.begin_step(ids, positions)
        x = w.emb[tokens]
        for layer in range(cfg.n_layers):
            h = rms_norm(x)
            spec = kc.update(layer, heads(h @ w.wk[layer], *kd), heads(h @ w.wv[layer], *kd))
            o = n.attend(heads(h @ w.wq[layer], *qd), spec, threads=threads, backend=backend)
            x = x + o.transpose(1, 0, 2).reshape(len(tokens), -1) @ w.wo[layer]
        return x

    # Prefill the shared prefix once, in chunks.
    root = b.seq_new()
    prompt = prompt_prefix(cfg, prefix)
    t0 = time.perf_counter()
    x = None
    for start in range(0, prefix, chunk):
        stop = min(prefix, start + chunk)
        x = forward(prompt[start:stop], [root] * (stop - start), list(range(start, stop)))
        bar("prefill", stop, prefix)
    prefill_s = time.perf_counter() - t0
    recorded: dict[tuple[int, int], np.ndarray] = {}
    if x is not None:
        recorded[(0, prefix - 1)] = x[-1]

    # Fork: every other sequence shares the prefix's cells.
    ids = [root] + [b.seq_clone(root) for _ in range(n_seqs - 1)]
    tokens: list[list[int]] = [list(map(int, prompt)) for _ in ids]
    step_tokens = np.array([fork_token(cfg, i) for i in range(n_seqs)])
    checked = set(range(min(check_seqs, n_seqs)))
    t0 = time.perf_counter()
    for m in range(decode):
        for i, t in enumerate(step_tokens):
            tokens[i].append(int(t))
        x = forward(step_tokens, ids, [prefix + m] * n_seqs)
        for i in checked:
            recorded[(i, prefix + m)] = x[i]
        step_tokens = next_tokens(w.out, x)
        bar("decode", m + 1, decode)
    decode_s = time.perf_counter() - t0

    # Spot check: a float64 forward of each checked sequence's tokens.
    max_err, scale = 0.0, 1.0
    for i in checked:
        ref = reference_hidden(cfg, w64, np.array(tokens[i]))
        for (seq, pos), got in recorded.items():
            if seq == i or (seq == 0 and pos < prefix):
                max_err = max(max_err, float(np.abs(got - ref[pos]).max()))
                scale = max(scale, float(np.abs(ref[pos]).max()))

    row_bytes = [2 * cfg.n_kv_heads * cfg.head_dim * 4 for _ in range(cfg.n_layers)]
    unshared = 0
    for layer in range(cfg.n_layers):
        length = prefix + decode
        rows = length if cfg.is_flat(layer) else min(length, ccfg.depth(layer))
        unshared += n_seqs * rows * row_bytes[layer]
    flat_layers = [i for i in range(cfg.n_layers) if cfg.is_flat(i)]
    ring_layers = [i for i in range(cfg.n_layers) if not cfg.is_flat(i)]
    live = sum(
        row_bytes[layer] * (kc.capacity - kc.free_cells_in(kc.table_of(layer)))
        for layer in range(cfg.n_layers)
    )
    result = DemoResult(
        n_seqs=n_seqs,
        prefix=prefix,
        decode=decode,
        prefill_tokens_per_s=prefix / prefill_s if prefill_s > 0 else float("inf"),
        decode_tokens_per_s=n_seqs * decode / decode_s if decode_s > 0 else float("inf"),
        kv_bytes=kc.nbytes(),
        kv_live_bytes=live,
        unshared_bytes=unshared,
        shared_cells=kc.shared_cells(kc.table_of(flat_layers[0]) if flat_layers else 0),
        peak_slots_flat=max((kc.pool_slots(i) for i in flat_layers), default=0),
        peak_slots_ring=max((kc.pool_slots(i) for i in ring_layers), default=0),
        max_error=max_err / scale,
        checked_steps=sum(1 for (s, _) in recorded if s in checked),
        tokens=tokens,
    )
    return result
