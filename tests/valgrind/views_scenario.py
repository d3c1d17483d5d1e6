"""View lifetime scenario, run under valgrind memcheck by test_valgrind.py:
take views, force many doublings, clear, drop the cache, collect, read."""

import gc

import numpy as np
import offgraph_kv as okv

ring = okv.LayerConfig(okv.Ring(window=8), 2, 4)
flat = okv.LayerConfig(okv.Flat(), 2, 4)
cfg = okv.CacheConfig(256, 2, [ring, flat], initial_capacity=1, max_step=4)
kv = okv.KvSequenceCache(cfg)
kv.begin_step(2)
first = np.arange(16, dtype=np.float32).reshape(2, 2, 4)
views = []
spec = kv.update(1, first, first + 100)
views.append((spec.k, spec.v))
kv.update(0, first, first)
for step in range(60):
    kv.begin_step(4)
    rows = np.full((2, 4, 4), step, np.float32)
    for layer in range(2):
        s = kv.update(layer, rows, rows)
        if step % 7 == 0:
            views.append((s.k, s.v))
k0, v0 = views[0]
# growth never moved the pool: the first view still sees its rows
assert (k0[:, :2] == first).all() and (v0[:, :2] == first + 100).all()
reserved = kv.pool_memory == "reserve"
kv.rewind(kv.length - 2)
kv.clear()
del kv, spec, s
gc.collect()
# alive after clear and the cache's end: a reserved pool's pages went back to the OS
# (they read zeros), a pool grown by copies keeps its old bytes
if reserved:
    assert not k0.any() and not v0.any()
else:
    assert (k0[:, :2] == first).all() and (v0[:, :2] == first + 100).all()
total = sum(float(k.sum()) + float(v.sum()) for k, v in views)
print("views ok", len(views), total)
