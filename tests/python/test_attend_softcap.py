"""attend(..., softcap=c) against a float64 numpy reference of Gemma 2's
attention logit soft-capping (c * tanh(score / c) before the mask and
softmax), both backends; bad caps are refused like a bad scale."""

import math

import numpy as np
import offgraph_kv as okv
import pytest


def reference(q, keys, vals, positions, scale, softcap):
    """Causal attention over a flat history: q [H, T, D], keys/vals [Hkv, N, D]."""
    q, keys, vals = (x.astype(np.float64) for x in (q, keys, vals))
    group = q.shape[0] // keys.shape[0]
    visible = np.arange(keys.shape[1])[None, :] <= np.asarray(positions)[:, None]
    out = np.zeros_like(q)
    for h in range(q.shape[0]):
        s = q[h] @ keys[h // group].T * scale
        if softcap is not None:
            s = softcap * np.tanh(s / softcap)
        s = np.where(visible, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[h] = (p @ vals[h // group]) / p.sum(axis=1, keepdims=True)
    return out


def step(t_prefill=12):
    """A flat cache after a causal prefill of `t_prefill` tokens, then the
    spec, query and reference inputs of a one-token decode step."""
    heads, group, dim = 2, 4, 32
    rng = np.random.default_rng(38)
    cfg = okv.CacheConfig(64, 1, okv.LayerConfig(okv.Flat(), heads, dim), max_step=t_prefill)
    kv = okv.KvSequenceCache(cfg)
    ks, vs = [], []
    for t in (t_prefill, 1):
        kv.begin_step(t)
        k, v = (rng.uniform(-1, 1, (heads, t, dim)).astype(np.float32) for _ in range(2))
        ks.append(k)
        vs.append(v)
        spec = kv.update(0, k, v)
    # Scores of magnitude ~20 (q·k / sqrt(dim) with q ~ 60 · U(-1, 1)).
    q = (rng.uniform(-1, 1, (heads * group, 1, dim)) * 60).astype(np.float32)
    return spec, q, np.concatenate(ks, axis=1), np.concatenate(vs, axis=1), dim


@pytest.mark.parametrize("backend", ["native", "xnnpack", "auto"])
def test_softcap_matches_reference(backend):
    spec, q, keys, vals, dim = step()
    positions = list(spec.positions)
    scale = dim**-0.5
    want = reference(q, keys, vals, positions, scale, 5.0)
    plain = reference(q, keys, vals, positions, scale, None)
    tol = 2e-5 * max(1.0, float(np.abs(want).max()))
    assert np.abs(want - plain).max() > 0.05  # the cap matters here
    got = okv.attend(q, spec, backend=backend, softcap=5.0)
    assert np.abs(got - want).max() <= tol
    # A cap far above every score changes nothing; None is no cap.
    huge = okv.attend(q, spec, backend=backend, softcap=1e6)
    none = okv.attend(q, spec, backend=backend, softcap=None)
    assert np.abs(huge - none).max() <= tol
    assert np.abs(none - plain).max() <= tol


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, -math.inf, 1e-60, 1e60])
def test_bad_softcap_is_refused_like_a_bad_scale(bad):
    spec, q, *_ = step()
    with pytest.raises(okv.InvalidArgumentError, match="softcap"):
        okv.attend(q, spec, softcap=bad)
    with pytest.raises(okv.DTypeError, match="softcap"):
        okv.attend(q, spec, softcap="5")
