"""The registry from Python: life cycle, builders keyed by the pair, sessions,
and unique keys across threads."""

import gc
import threading

import offgraph_kv as okv
import pytest
from conftest import gemma_like


def test_install_get_erase():
    key = okv.registry.unique_key("t-")
    c = okv.SequenceCache(gemma_like())
    okv.registry.install(key, c)
    assert okv.registry.get(key) is c
    with pytest.raises(okv.KeyExistsError, match=key):
        okv.registry.install(key, object())
    assert okv.registry.get(key) is c
    okv.registry.erase(key)
    with pytest.raises(okv.NotFoundError, match=key):
        okv.registry.get(key)
    with pytest.raises(KeyError):
        okv.registry.erase(key)


def test_builders_keyed_by_pair_and_validate_first():
    calls = []

    def builder(cfg):
        calls.append(cfg)
        return okv.SequenceCache(cfg)

    okv.registry.register_builder("cpu", "sequence", builder)
    c = okv.registry.build("cpu", "sequence", gemma_like())
    assert isinstance(c, okv.SequenceCache) and len(calls) == 1
    with pytest.raises(okv.NotFoundError, match="cpus"):
        okv.registry.build("cpus", "equence", gemma_like())
    with pytest.raises(okv.ConfigError):
        okv.registry.build("cpu", "sequence", gemma_like(capacity=0))
    assert len(calls) == 1  # validation ran before the builder

    def broken(cfg):
        raise RuntimeError("boom")

    okv.registry.register_builder("cpu", "broken", broken)
    with pytest.raises(okv.BackendError, match="boom"):
        okv.registry.build("cpu", "broken", gemma_like())


def test_session_erases_on_exit_and_close():
    c = okv.SequenceCache(gemma_like())
    with okv.CacheSession(c) as s:
        assert okv.registry.get(s.key) is c and s.cache is c
        key = s.key
    assert not okv.registry.contains(key)
    s2 = okv.CacheSession(c, key="explicit-key")
    assert okv.registry.get("explicit-key") is c
    s2.close()
    s2.close()  # idempotent
    assert not okv.registry.contains("explicit-key")
    with pytest.raises(okv.StepError, match="closed"):
        _ = s2.cache
    s3 = okv.CacheSession(c)
    k3 = s3.key
    del s3
    gc.collect()
    assert not okv.registry.contains(k3)


def test_session_never_erases_a_cache_someone_else_installed_under_its_key():
    mine, theirs = okv.SequenceCache(gemma_like()), okv.SequenceCache(gemma_like())
    # close(): the session's entry was erased by hand, then another cache took the key.
    s = okv.CacheSession(mine, key="shared-key")
    okv.registry.erase("shared-key")
    okv.registry.install("shared-key", theirs)
    s.close()
    assert okv.registry.get("shared-key") is theirs
    okv.registry.erase("shared-key")
    # The finaliser, likewise.
    s = okv.CacheSession(mine, key="shared-key")
    okv.registry.erase("shared-key")
    okv.registry.install("shared-key", theirs)
    del s
    gc.collect()
    assert okv.registry.get("shared-key") is theirs
    okv.registry.erase("shared-key")
    # A session whose entry is still its own erases it, and only it.
    s = okv.CacheSession(mine, key="shared-key")
    okv.registry.install("other-key", theirs)
    s.close()
    assert not okv.registry.contains("shared-key")
    assert okv.registry.get("other-key") is theirs
    okv.registry.erase("other-key")


def test_two_threads_take_a_thousand_unique_keys_each():
    out = [[], []]

    def work(i):
        for _ in range(1000):
            k = okv.registry.unique_key("thr-")
            okv.registry.install(k, i)
            out[i].append(k)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    keys = out[0] + out[1]
    assert len(set(keys)) == 2000
    for k in keys:
        okv.registry.erase(k)
