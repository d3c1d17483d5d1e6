"""Which path the native kernel takes on this CPU, for tests whose tolerance
depends on it (the integer-dot path rounds q to Q8_0)."""

from __future__ import annotations

import pathlib


def cpu_flags():
    try:
        return set(pathlib.Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


def int8_scores(k_dtype, head_dim):
    """Whether the native kernel's default path scores these q8_0 keys by
    integer dots against q quantized per step (every block of query rows
    alike, so a row's result does not depend on what shares its step; an
    AVX-512 VNNI CPU with head_dim a multiple of 64, or an AVX2 CPU without
    AVX-512): its result is then exactly attention of the Q8_0-rounded q,
    the error GGML accepts."""
    f = cpu_flags()
    vnni = "avx512_vnni" in f and "avx512bw" in f and head_dim % 64 == 0
    avx2 = "avx512f" not in f and {"avx2", "fma", "f16c"} <= f
    return k_dtype == "q8_0" and (vnni or avx2)
