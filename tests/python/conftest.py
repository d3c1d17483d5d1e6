import offgraph_kv as okv
import pytest


def gemma_like(capacity=64, max_step=4, window=8, heads=2, dim=16):
    ring = okv.LayerConfig(okv.Ring(window=window), heads, dim)
    flat = okv.LayerConfig(okv.Flat(), heads, dim)
    return okv.CacheConfig(capacity, 3, [ring, ring, flat], initial_capacity=2, max_step=max_step)


@pytest.fixture
def cfg():
    return gemma_like()
