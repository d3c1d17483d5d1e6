"""SequenceCache from Python: faces, plans, and every refusal with its typed
exception, the message naming the bad value, and the state unchanged."""

import offgraph_kv as okv
import pytest


def snapshot(c):
    def plan_or_err(layer):
        try:
            return repr(c.plan(layer))
        except okv.CacheError as e:
            return type(e).__name__

    return (c.length, c.high_water, c.step_open, repr(c), plan_or_err(0), plan_or_err(2))


def refused(c, exc, fn, *args, match=None):
    before = snapshot(c)
    with pytest.raises(exc, match=match) as info:
        fn(*args)
    assert isinstance(info.value, okv.CacheError)
    assert snapshot(c) == before
    return info.value


def test_exception_tree():
    assert issubclass(okv.ConfigError, ValueError)
    assert issubclass(okv.NotFoundError, KeyError)
    assert issubclass(okv.UnknownSequenceError, KeyError)
    assert issubclass(okv.CapacityError, okv.CacheError)
    assert issubclass(okv.StepError, RuntimeError)
    assert issubclass(okv.DTypeError, TypeError)
    assert issubclass(okv.ShapeError, ValueError)
    for cls in (
        okv.ConfigError,
        okv.NotFoundError,
        okv.CapacityError,
        okv.StepError,
        okv.UnknownSequenceError,
        okv.ShapeError,
        okv.DTypeError,
    ):
        assert issubclass(cls, okv.CacheError)
    # KeyError subclasses print their message plainly.
    assert str(okv.NotFoundError("no cache")) == "no cache"


@pytest.mark.parametrize(
    "kwargs, field, value",
    [
        (dict(capacity=0), "capacity", "0"),
        (dict(n_layers=0), "n_layers", "0"),
        (dict(n_layers=5), "layers", "3"),
        (dict(max_step=0), "max_step", "0"),
        (dict(max_step=65), "max_step", "65"),
        (dict(initial_capacity=0), "initial_capacity", "0"),
        (dict(heads=0), "n_kv_heads", "0"),
        (dict(dim=0), "head_dim", "0"),
    ],
)
def test_bad_config_fields_raise_config_error(kwargs, field, value):
    base = dict(capacity=64, n_layers=3, max_step=4, initial_capacity=2, window=8, heads=2, dim=16)
    base.update(kwargs)
    ring = okv.LayerConfig(okv.Ring(window=base["window"]), base["heads"], base["dim"])
    flat = okv.LayerConfig(okv.Flat(), base["heads"], base["dim"])
    cfg = okv.CacheConfig(
        base["capacity"],
        base["n_layers"],
        [ring, ring, flat],
        initial_capacity=base["initial_capacity"],
        max_step=base["max_step"],
    )
    with pytest.raises(okv.ConfigError, match=field) as info:
        cfg.validate()
    assert value in str(info.value)
    with pytest.raises(okv.ConfigError, match=field):
        okv.SequenceCache(cfg)


def test_negative_and_mistyped_config_fields():
    with pytest.raises(okv.ConfigError, match="capacity must be >= 0, got -1"):
        okv.CacheConfig(-1, 1, okv.LayerConfig(okv.Flat(), 1, 1))
    with pytest.raises(okv.ConfigError, match="window"):
        okv.Ring(window=0)
    with pytest.raises(okv.ConfigError, match="out of range"):
        okv.CacheConfig(2**63, 1, okv.LayerConfig(okv.Flat(), 1, 1))
    with pytest.raises(TypeError, match="policy"):
        okv.LayerConfig("flat", 1, 1)
    with pytest.raises(TypeError, match="capacity: expected an int, got str"):
        okv.CacheConfig("8", 1, okv.LayerConfig(okv.Flat(), 1, 1))
    with pytest.raises(TypeError, match="layers"):
        okv.CacheConfig(8, 1, [1])


def test_config_round_trip_and_repr(cfg):
    assert cfg.capacity == 64 and cfg.n_layers == 3 and cfg.max_step == 4
    assert cfg.layers[0].policy == okv.Ring(window=8)
    assert cfg.layers[2].policy == okv.Flat()
    assert cfg.depth(0) == 8 + 4 - 1 and cfg.depth(2) == 64
    assert "Ring(window=8)" in repr(cfg)
    cfg.validate()


def test_faces_share_one_controller(cfg):
    c = okv.SequenceCache(cfg)
    ctl, pl = c.control(), c.planner()
    assert ctl.begin_step(4) == 0
    assert ctl.length == 4 == c.length == len(c)
    p = pl.plan(0)
    assert (p.position, p.n_tokens, p.write, p.read) == (0, 4, [(0, 4)], [(0, 4)])
    assert p.mask_kind == "causal" and p.window == 8
    assert pl.plan(1) == p  # layers sharing a policy share a plan
    assert pl.plan(2).window is None
    ctl.begin_step(1)
    assert pl.plan(2).mask_kind == "none"
    assert ctl.can_extend(59) and not ctl.can_extend(60)
    assert "length=5" in repr(ctl)


def test_ring_wrap_two_runs_and_read_base(cfg):
    c = okv.SequenceCache(cfg)
    for _ in range(3):
        c.begin_step(4)  # positions 8..12 wrap the 11-slot ring
    p = c.plan(0)
    assert p.write == [(8, 3), (0, 1)]
    assert p.read_base_pos == 1 and p.mask_kind == "window"
    assert sum(n for _, n in p.read) == 11


def test_step_refusals_change_nothing(cfg):
    c = okv.SequenceCache(cfg)
    ctl, pl = c.control(), c.planner()
    refused(c, okv.StepError, pl.plan, 0, match="no open step")
    refused(c, okv.InvalidArgumentError, ctl.begin_step, 0, match="got 0")
    refused(c, okv.InvalidArgumentError, ctl.begin_step, 5, match="got 5")
    refused(c, okv.InvalidArgumentError, ctl.begin_step, -1, match="-1")
    refused(c, TypeError, ctl.begin_step, 1.5, match="float")
    ctl.begin_step(4)
    refused(c, okv.InvalidArgumentError, pl.plan, 3, match="layer 3")
    refused(c, okv.InvalidArgumentError, pl.plan, -1, match="-1")
    refused(c, okv.InvalidArgumentError, pl.plan, 2**64, match="out of range")
    while c.length + 4 <= 64:
        ctl.begin_step(4)
    refused(c, okv.CapacityError, ctl.begin_step, 1, match="capacity 64")
    refused(c, okv.InvalidArgumentError, ctl.rewind, 65, match="65")
    refused(c, okv.InvalidArgumentError, ctl.rewind, -3, match="-3")
    assert c.min_rewind == 60
    refused(c, okv.InvalidArgumentError, ctl.rewind, 59, match="59")
    ctl.rewind(60)
    refused(c, okv.StepError, pl.plan, 0)
    ctl.begin_step(1)
    ctl.clear()
    refused(c, okv.StepError, pl.plan, 2)
    assert c.min_rewind == 0 and c.length == 0


def test_numpy_integers_are_accepted(cfg):
    import numpy as np

    c = okv.SequenceCache(cfg)
    assert c.begin_step(np.int64(2)) == 0
    assert c.plan(np.int32(2)).n_tokens == 2
