"""Low-precision pools through the Python surface: config names, pool bytes
against numpy/torch rounding and a GGML Q8_0 quantizer written here from its
definition, views, dequantize, attention against a float64 reference over the
rounded rows, and refusals that change nothing."""

import ml_dtypes
import numpy as np
import offgraph_kv as okv
import pytest
import torch
from cpu_helpers import int8_scores

DTYPES = ["float32", "float16", "bfloat16", "q8_0"]


def ggml_q8_0(x):
    """GGML's quantize_row_q8_0_ref over the last axis (a multiple of 32)."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (blocks * inv).astype(np.float32)
    # roundf: half away from zero (numpy's round is half to even).
    q = (np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=-1)
    return out.reshape(*x.shape[:-1], -1)


def ggml_dequant(b, head_dim):
    b = np.asarray(b, np.uint8).reshape(*b.shape[:-1], head_dim // 32, 34)
    d = b[..., :2].copy().view(np.float16).astype(np.float32)
    q = b[..., 2:].view(np.int8).astype(np.float32)
    return (d * q).reshape(*b.shape[:-2], head_dim)


def bf16_bits(x):
    t = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16)


def expected_view(x, dtype):
    """What the pool holds for float32 rows x, as the view's dtype."""
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        return bf16_bits(x).view(ml_dtypes.bfloat16)
    return ggml_q8_0(x)


def widen(view, dtype, head_dim):
    """A view's rows as float64, from the formats (not okv.dequantize)."""
    if dtype == "q8_0":
        return ggml_dequant(np.asarray(view), head_dim).astype(np.float64)
    if dtype == "bfloat16":
        bits = np.asarray(view).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return np.asarray(view).astype(np.float64)


def cache(dtype="float32", k_dtype=None, v_dtype=None, heads=2, dim=64, window=None, max_step=8):
    pol = okv.Ring(window=window) if window else okv.Flat()
    cfg = okv.CacheConfig(
        64,
        1,
        okv.LayerConfig(pol, heads, dim),
        initial_capacity=4,
        max_step=max_step,
        dtype=dtype,
        k_dtype=k_dtype,
        v_dtype=v_dtype,
    )
    return okv.KvSequenceCache(cfg)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pool_bytes_are_the_formats(dtype):
    rng = np.random.default_rng(1)
    kv = cache(dtype)
    kv.control().begin_step(5)
    k = (rng.standard_normal((2, 5, 64)) * 3).astype(np.float32)
    v = (rng.standard_normal((2, 5, 64)) * 3).astype(np.float32)
    k[0, 0, :32] = 0.0  # an all-zero q8_0 block
    k[1, 1, 7] = 1e-30  # underflows in float16
    spec = kv.update(0, k, v)
    assert spec.k_dtype == dtype and spec.v_dtype == dtype
    got_k, got_v = spec.k[:, :5], spec.v[:, :5]
    want_k, want_v = expected_view(k, dtype), expected_view(v, dtype)
    assert got_k.dtype == want_k.dtype
    assert got_k.view(np.uint8).tobytes() == np.ascontiguousarray(want_k).view(np.uint8).tobytes()
    assert got_v.view(np.uint8).tobytes() == np.ascontiguousarray(want_v).view(np.uint8).tobytes()
    assert not spec.k.flags.writeable
    row = {"float32": 256, "float16": 128, "bfloat16": 128, "q8_0": 68}[dtype]
    assert spec.k.shape[-1] == (row if dtype == "q8_0" else 64)
    assert kv.nbytes() == 2 * 2 * 5 * row  # K and V, 2 heads, the 5 rows written


@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_matches_the_format(dtype):
    rng = np.random.default_rng(2)
    kv = cache(dtype)
    kv.control().begin_step(3)
    k = rng.standard_normal((2, 3, 64)).astype(np.float32)
    spec = kv.update(0, k, k)
    d = okv.dequantize(spec.k, dtype)
    assert d.dtype == np.float32 and d.shape == (2, spec.slots, 64)
    np.testing.assert_array_equal(d, widen(spec.k, dtype, 64).astype(np.float32))
    tol = {"float32": 0, "float16": 1e-3, "bfloat16": 8e-3, "q8_0": 2e-2}[dtype]
    np.testing.assert_allclose(d[:, :3], k, atol=tol * 4, rtol=tol)
    with pytest.raises(okv.DTypeError):
        okv.dequantize(spec.k, "int4")


def test_half_inputs_round_once():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 64)).astype(np.float32)
    h = x.astype(np.float16)
    # float16 rows into float16 pools are stored bit for bit.
    kv = cache("float16")
    kv.control().begin_step(4)
    spec = kv.update(0, h, h)
    assert spec.k[:, :4].tobytes() == h.tobytes()
    # bfloat16 rows (ml_dtypes, and raw torch bits) into bfloat16 pools likewise.
    b = bf16_bits(x)
    for arr, bits in [
        (b.view(ml_dtypes.bfloat16), None),
        (b, "bfloat16"),
        (b.view(np.int16), "bfloat16"),
    ]:
        kv = cache("bfloat16")
        kv.control().begin_step(4)
        spec = kv.update(0, arr, arr, bits=bits)
        assert spec.k[:, :4].view(np.uint16).tobytes() == b.tobytes()
    # float16 rows into a q8_0 / bfloat16 pool: exact widening, then one rounding.
    kv = cache(k_dtype="q8_0", v_dtype="bfloat16")
    kv.control().begin_step(4)
    spec = kv.update(0, h, h)
    wide = h.astype(np.float32)
    assert spec.k[:, :4].tobytes() == ggml_q8_0(wide).tobytes()
    assert spec.v[:, :4].view(np.uint16).tobytes() == bf16_bits(wide).tobytes()


def test_config_names():
    cfg = okv.CacheConfig(8, 1, okv.LayerConfig(okv.Flat(), 1, 32), dtype="float16", v_dtype="q8_0")
    assert (cfg.k_dtype, cfg.v_dtype) == ("float16", "q8_0")
    assert okv.CacheConfig(8, 1, okv.LayerConfig(okv.Flat(), 1, 32)).k_dtype == "float32"
    assert "q8_0" in repr(cfg)


def test_refusals():
    with pytest.raises(okv.ConfigError, match="int4"):
        okv.CacheConfig(8, 1, okv.LayerConfig(okv.Flat(), 1, 32), dtype="int4")
    with pytest.raises(okv.ConfigError, match="k_dtype"):
        okv.CacheConfig(8, 1, okv.LayerConfig(okv.Flat(), 1, 32), k_dtype="fp8")
    bad = okv.CacheConfig(8, 1, okv.LayerConfig(okv.Flat(), 1, 48), v_dtype="q8_0")
    with pytest.raises(okv.ConfigError, match="multiple of 32"):
        bad.validate()
    with pytest.raises(okv.ConfigError):
        okv.KvSequenceCache(bad)
    with pytest.raises(okv.ConfigError):
        okv.KvCellCache(bad, 8)
    # Wrong input dtypes write nothing and leave the step open.
    kv = cache("q8_0")
    ctl = kv.control()
    ctl.begin_step(2)
    x = np.ones((2, 2, 64), np.float32)
    spec = kv.update(0, x, x)
    before = (spec.k.tobytes(), spec.v.tobytes(), ctl.length, kv.nbytes())
    for k, bits in [
        (x.astype(np.float64), None),
        (x.astype(np.int32), None),
        (x.astype(np.uint16), None),
        (x.astype(np.float16), "bfloat16"),
    ]:
        with pytest.raises(okv.DTypeError):
            kv.update(0, k, x, bits=bits)
    with pytest.raises(okv.InvalidArgumentError):
        kv.update(0, x.astype(np.uint16), x.astype(np.uint16), bits="float8")
    with pytest.raises(okv.ShapeError):
        kv.update(0, np.ones((2, 2, 32), np.float16), x)
    after = kv.spec(0)
    assert (after.k.tobytes(), after.v.tobytes(), ctl.length, kv.nbytes()) == before


def reference(q, spec, mask_rows):
    kd, vd = spec.k_dtype, spec.v_dtype
    k = widen(spec.k, kd, spec.head_dim)
    v = widen(spec.v, vd, spec.head_dim)
    nq, t, hd = q.shape
    g = nq // spec.n_kv_heads
    out = np.zeros((nq, t, hd))
    for i in range(t):
        rows = mask_rows(i)
        for h in range(nq):
            s = k[h // g, rows] @ q[h, i].astype(np.float64) / np.sqrt(hd)
            w = np.exp(s - s.max())
            out[h, i] = (w / w.sum()) @ v[h // g, rows]
    return out


def q8_rounded(q):
    """q as the integer-dot path sees it: GGML's Q8_0 rounding per 32 values
    (scale kept in float32, as the kernel keeps it)."""
    blocks = np.asarray(q, np.float32).reshape(*q.shape[:-1], -1, 32)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(d != 0, blocks * (np.float32(1) / d), np.float32(0))
    r = np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))
    return (r * d).astype(np.float32).reshape(q.shape)


def seq_rows(spec):
    rows = [s for a, n in spec.read for s in range(a, a + n)]

    def visible(i):
        p = spec.positions[i]
        keep = []
        for r, s in enumerate(rows):
            pos = spec.read_base_pos + r
            if pos <= p and (spec.window is None or pos > p - spec.window):
                keep.append(s)
        return keep

    return visible


@pytest.mark.parametrize("k_dtype", DTYPES)
@pytest.mark.parametrize("v_dtype", DTYPES)
@pytest.mark.parametrize("window", [None, 6])
def test_attend_every_pair_against_float64(k_dtype, v_dtype, window):
    rng = np.random.default_rng(4)
    kv = cache(k_dtype=k_dtype, v_dtype=v_dtype, window=window, max_step=5)
    for t in [5, 1, 4, 1, 1]:
        kv.control().begin_step(t)
        k = rng.standard_normal((2, t, 64)).astype(np.float32)
        v = rng.standard_normal((2, t, 64)).astype(np.float32)
        spec = kv.update(0, k, v)
        q = rng.standard_normal((8, t, 64)).astype(np.float32)
        want = reference(q, spec, seq_rows(spec))
        want_native = (
            reference(q8_rounded(q), spec, seq_rows(spec)) if int8_scores(k_dtype, 64) else want
        )
        for threads in [1, 2]:
            got = okv.attend(q, spec, threads=threads, backend="native")
            np.testing.assert_allclose(got, want_native, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(okv.attend(q, spec), want_native, atol=2e-5, rtol=1e-4)
        if k_dtype == v_dtype == "float32":
            got = okv.attend(q, spec, backend="xnnpack")
            np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
        else:
            with pytest.raises(okv.BackendError, match="float32"):
                okv.attend(q, spec, backend="xnnpack")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cell_attend_against_float64(dtype):
    rng = np.random.default_rng(5)
    cfg = okv.CacheConfig(
        64, 1, okv.LayerConfig(okv.Flat(), 1, 32), initial_capacity=2, max_step=6, dtype=dtype
    )
    kc = okv.KvCellCache(cfg, 32)
    b = kc.control()
    a = b.seq_new()
    b.begin_step([a] * 4, [0, 1, 2, 3])
    x = rng.standard_normal((1, 4, 32)).astype(np.float32)
    kc.update(0, x, x)
    c = b.seq_clone(a, upto=2)
    b.begin_step([a, c], [4, 2])
    k = rng.standard_normal((1, 2, 32)).astype(np.float32)
    spec = kc.update(0, k, k)
    q = rng.standard_normal((4, 2, 32)).astype(np.float32)
    mask = np.asarray(spec.mask)
    # A cell block is one token's 4 query heads: q8_0 keys may take the integer dots.
    qr = q8_rounded(q) if int8_scores(dtype, 32) else q
    want = reference(qr, spec, lambda i: list(np.nonzero(mask[i])[0]))
    np.testing.assert_allclose(okv.attend(q, spec), want, atol=2e-5, rtol=1e-4)
