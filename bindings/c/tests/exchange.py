"""Snapshots cross languages: builds through Python the state
bindings/c/tests/exchange.c builds through the C API, checks that the C
snapshots in DIR are byte for byte Python's, loads them into Python caches,
and writes Python's own snapshots to DIR for ``exchange --load DIR``.

    python bindings/c/tests/exchange.py DIR
"""

import sys
from pathlib import Path

import numpy as np
import offgraph_kv as okv

HEADS, HD, CAP, N_SEQ = 2, 32, 64, 10


def rows(t0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens [t0, t0 + n) as [HEADS, n, HD] float32 (the values of rows.h)."""
    h, t, d = np.meshgrid(np.arange(HEADS), np.arange(t0, t0 + n), np.arange(HD), indexing="ij")
    k = ((h * 7 + t * 3 + d) % 16 - 8) * 0.125
    v = ((h * 5 + t + d * 3) % 16 - 8) * 0.0625
    return k.astype(np.float32), v.astype(np.float32)


def config(k_dtype: str, v_dtype: str) -> okv.CacheConfig:
    layers = [
        okv.LayerConfig(okv.Ring(window=4), HEADS, HD),
        okv.LayerConfig(okv.Flat(), HEADS, HD),
    ]
    return okv.CacheConfig(CAP, 2, layers, max_step=3, k_dtype=k_dtype, v_dtype=v_dtype)


def seq_state() -> okv.KvSequenceCache:
    kv = okv.KvSequenceCache(config("float16", "q8_0"))
    t = 0
    while t < N_SEQ:
        n = 3 if t == 0 else 1
        kv.control().begin_step(n)
        k, v = rows(t, n)
        for layer in range(2):
            kv.update(layer, k, v)
        t += n
    return kv


def cell_state() -> tuple[okv.KvCellCache, int]:
    kc = okv.KvCellCache(config("bfloat16", "bfloat16"), 32, n_seq_max=4)
    b = kc.control()
    a = b.seq_new()
    for t, n in ((0, 3), (3, 2)):
        b.begin_step([a] * n, list(range(t, t + n)))
        k, v = rows(t, n)
        for layer in range(2):
            kc.update(layer, k, v)
    s = b.seq_clone(a)
    for t in (5, 6):
        b.begin_step([a, s], [t, t])
        ka, va = rows(t, 1)
        kb, vb = rows(t + 20, 1)
        k, v = np.concatenate([ka, kb], axis=1), np.concatenate([va, vb], axis=1)
        for layer in range(2):
            kc.update(layer, k, v)
    return kc, s


def main(out: Path) -> int:
    kv = seq_state()
    kc, s = cell_state()
    py_seq, py_cell = kv.save_state(), kc.save_seq(s)
    c_seq, c_cell = (out / "c-seq.snap").read_bytes(), (out / "c-cell.snap").read_bytes()
    failures = 0
    for name, py, c in (("sequence", py_seq, c_seq), ("cell", py_cell, c_cell)):
        if py != c:
            first = next((i for i, (x, y) in enumerate(zip(py, c)) if x != y), min(len(py), len(c)))
            print(f"FAILED: {name} snapshots differ: {len(py)} vs {len(c)} bytes, first at {first}")
            failures += 1
    # The C bytes load into Python caches and restore the state.
    kv2 = okv.KvSequenceCache(config("float16", "q8_0"))
    kv2.load_state(c_seq)
    failures += kv2.control().length != N_SEQ or kv2.save_state() != py_seq
    kc2 = okv.KvCellCache(config("bfloat16", "bfloat16"), 32, n_seq_max=4)
    got = kc2.load_seq(c_cell)
    failures += kc2.control().seq_len(got) != 7 or kc2.save_seq(got) != py_cell
    (out / "py-seq.snap").write_bytes(py_seq)
    (out / "py-cell.snap").write_bytes(py_cell)
    print(f"exchange.py: {len(py_seq)} + {len(py_cell)} snapshot bytes compared, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
