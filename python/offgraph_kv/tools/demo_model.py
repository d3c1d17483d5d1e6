"""A deterministic, transformer-shaped workload with no weights to download.

Everything derives from a counter-based generator (splitmix64 over an index),
so the Rust runner (``examples/runner/``) rebuilds the very same weights and
prompts without Python. The model: token embeddings; per layer an RMS norm,
Q/K/V projections into grouped-query heads, attention through the KV cache, an
output projection added to the residual stream; a final RMS norm and an
output head for greedy next-token choice. Layers follow a Gemma-like 5:1
pattern: every sixth layer is flat (global), the others a ring of ``window``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, tag: int, layer: int = 0, index: int = 0) -> np.uint64:
    """The key of one tensor: mixes the seed with what the tensor is."""
    with np.errstate(over="ignore"):
        raw = np.uint64(
            (seed * 0x100000001B3 + tag * 0x10001 + layer * 0x101 + index) & 0xFFFFFFFFFFFFFFFF
        )
        return _mix(np.array([raw], dtype=np.uint64))[0]


def uniform(key: np.uint64, n: int) -> np.ndarray:
    """n float64 values in [-1, 1): value i = mix(key + (i + 1) * GOLDEN)."""
    with np.errstate(over="ignore"):
        idx = np.arange(1, n + 1, dtype=np.uint64)
        bits = _mix(key + idx * GOLDEN)
    return (bits >> np.uint64(40)).astype(np.float64) / float(1 << 24) * 2.0 - 1.0


def integers(key: np.uint64, n: int, bound: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        idx = np.arange(1, n + 1, dtype=np.uint64)
        bits = _mix(key + idx * GOLDEN)
    return (bits % np.uint64(bound)).astype(np.int64)


TAG_EMB, TAG_WQ, TAG_WK, TAG_WV, TAG_WO, TAG_PROMPT, TAG_OUT = 1, 2, 3, 4, 5, 6, 7


@dataclass(frozen=True)
class DemoConfig:
    n_layers: int = 12
    window: int = 128
    hidden: int = 512
    n_q_heads: int = 8
    n_kv_heads: int = 2
    head_dim: int = 64
    vocab: int = 1024
    seed: int = 0

    def is_flat(self, layer: int) -> bool:
        return (layer + 1) % 6 == 0

    def window_of(self, layer: int) -> int | None:
        return None if self.is_flat(layer) else self.window


@dataclass
class Weights:
    emb: np.ndarray  # [vocab, hidden]
    wq: list[np.ndarray]  # [hidden, n_q_heads * head_dim]
    wk: list[np.ndarray]  # [hidden, n_kv_heads * head_dim]
    wv: list[np.ndarray]
    wo: list[np.ndarray]  # [n_q_heads * head_dim, hidden]
    out: np.ndarray  # [hidden, vocab]: the (untied) output head

    def astype(self, dtype) -> Weights:
        return Weights(
            self.emb.astype(dtype),
            *([w.astype(dtype) for w in ws] for ws in (self.wq, self.wk, self.wv, self.wo)),
            self.out.astype(dtype),
        )


def make_weights(cfg: DemoConfig) -> Weights:
    """float64 weights, each scaled by 1/sqrt(fan_in)."""

    def mat(tag: int, layer: int, rows: int, cols: int) -> np.ndarray:
        w = uniform(stream_key(cfg.seed, tag, layer), rows * cols).reshape(rows, cols)
        return w / np.sqrt(rows)

    qd, kd = cfg.n_q_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    emb = uniform(stream_key(cfg.seed, TAG_EMB), cfg.vocab * cfg.hidden)
    return Weights(
        emb=emb.reshape(cfg.vocab, cfg.hidden),
        wq=[mat(TAG_WQ, i, cfg.hidden, qd) for i in range(cfg.n_layers)],
        wk=[mat(TAG_WK, i, cfg.hidden, kd) for i in range(cfg.n_layers)],
        wv=[mat(TAG_WV, i, cfg.hidden, kd) for i in range(cfg.n_layers)],
        wo=[mat(TAG_WO, i, qd, cfg.hidden) for i in range(cfg.n_layers)],
        out=mat(TAG_OUT, 0, cfg.hidden, cfg.vocab),
    )


def prompt_prefix(cfg: DemoConfig, length: int) -> np.ndarray:
    """The shared prefix's token ids."""
    return integers(stream_key(cfg.seed, TAG_PROMPT), length, cfg.vocab)


def fork_token(cfg: DemoConfig, fork: int) -> int:
    """The one token that tells fork ``fork`` apart right after the prefix."""
    return (fork * 7 + 1) % cfg.vocab


def rms_norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)


def heads(x: np.ndarray, n: int, d: int) -> np.ndarray:
    """[T, n*d] -> [n, T, d]."""
    return np.ascontiguousarray(x.reshape(x.shape[0], n, d).transpose(1, 0, 2))


def reference_hidden(cfg: DemoConfig, w: Weights, tokens: np.ndarray) -> np.ndarray:
    """float64 forward of one whole sequence without a cache: the final hidden
    state (after the last layer, before the final norm) at every position."""
    x = w.emb[tokens].astype(np.float64)
    t = len(tokens)
    pos = np.arange(t)
    group = cfg.n_q_heads // cfg.n_kv_heads
    for layer in range(cfg.n_layers):
        h = rms_norm(x)
        q = heads(h @ w.wq[layer], cfg.n_q_heads, cfg.head_dim)
        k = heads(h @ w.wk[layer], cfg.n_kv_heads, cfg.head_dim)
        v = heads(h @ w.wv[layer], cfg.n_kv_heads, cfg.head_dim)
        vis = pos[None, :] <= pos[:, None]
        win = cfg.window_of(layer)
        if win is not None:
            vis &= pos[None, :] > pos[:, None] - win
        out = np.empty_like(q)
        for hq in range(cfg.n_q_heads):
            s = q[hq] @ k[hq // group].T / np.sqrt(cfg.head_dim)
            s = np.where(vis, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[hq] = (p / p.sum(axis=1, keepdims=True)) @ v[hq // group]
        x = x + out.transpose(1, 0, 2).reshape(t, -1) @ w.wo[layer]
    return x


def next_tokens(w_out: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Greedy choice from the final hidden states [T, hidden]: an untied output
    head, so the next token is not simply the most similar embedding (a tied
    head makes every sequence repeat its own token)."""
    return np.argmax(rms_norm(x) @ w_out, axis=-1)
