"""Draft length from the measured step cost (``offgraph_kv.batch.draft_length``): the cost
table's estimates (measured, interpolated, spikes damped, fixed), the acceptance estimate, the
length chosen for chunked and flat costs, and refusals of a bad ``step_cost``."""

from __future__ import annotations

import math

import pytest
from offgraph_kv import InvalidArgumentError
from offgraph_kv.batch.draft_length import (
    Acceptance,
    StepCost,
    best_positive,
    choose,
    expected_tokens,
)
from offgraph_kv.batch.speculative import Speculation

# A forward that costs by 4-token chunks (an AVX2 kernel's lockstep rows): each chunk past the
# first costs half a one-token forward more.
CHUNKED = {t: 1.0 + 0.5 * (math.ceil(t / 4) - 1) for t in range(1, 17)}
# Measured on a 2-core AVX-512 VNNI machine, SmolLM2-135M (docs/speculative.md).
VNNI = {2: 1.08, 4: 1.29, 8: 1.54, 12: 1.92, 16: 2.68}


def test_measured_costs_interpolate_and_damp_spikes():
    c = StepCost()
    assert c.seconds(1) is None and c.ratios() == {}
    c.record(1, 0.010)
    c.record(9, 0.050)
    assert c.seconds(1) == 0.010
    assert c.seconds(5) == pytest.approx(0.030)  # halfway between 1 and 9
    assert c.seconds(20) == 0.050  # beyond the largest: its cost (optimistic)
    c.record(1, 1.0)  # an interruption: counted as 1.5x the estimate
    assert c.seconds(1) == pytest.approx(0.010 + 0.25 * (0.015 - 0.010))
    c.record(1, 0.0)  # not a time: ignored
    c.record(0, 0.5)
    assert c.seconds(1) == pytest.approx(0.01125)
    assert c.ratios()[9] == pytest.approx(0.050 / 0.01125)
    below = StepCost()
    below.record(40, 0.2)
    assert below.seconds(1) is None  # nothing at or below 1 measured


def test_fixed_costs_are_ratios_and_ignore_measurements():
    c = StepCost({4: 1.3})
    c.record(4, 9.0)
    assert c.seconds(1) == 1.0 and c.seconds(4) == 1.3
    assert c.seconds(2) == pytest.approx(1.1)
    assert StepCost({}).seconds(7) == 1.0  # no cost given: flat


def test_acceptance_estimate():
    a = Acceptance()
    assert a.p == 0.5
    for _ in range(10):
        a.record(4, 4)
    assert a.p > 0.9
    for _ in range(30):
        a.record(4, 0)
    assert a.p < 0.15


def test_expected_tokens():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_chunked_costs_draft_to_the_chunk_end():
    c = StepCost(CHUNKED)
    assert choose(c, 1, 8, 0.9) == 7  # 5 tokens cost what 8 do
    assert choose(c, 1, 8, 0.6) == 3  # one chunk: 3 drafts are free
    assert choose(c, 1, 2, 0.6) == 2  # capped by room
    assert choose(c, 2, 8, 0.6) == 2  # another sequence's token shares the chunk
    assert choose(c, 4, 8, 0.3) == 0  # a full chunk: a draft would start the next
    assert best_positive(c, 4, 8, 0.3) == 4  # a probe takes the next chunk whole


def test_vnni_costs_draft_long_and_a_poor_acceptance_drafts_nothing():
    c = StepCost(VNNI)
    assert choose(c, 1, 8, 0.9) == 8
    assert choose(c, 1, 8, 0.05) == 0
    assert 0 < choose(c, 1, 8, 0.5) < 8


def test_nothing_measured_drafts_nothing():
    assert choose(StepCost(), 1, 8, 0.99) == 0


@pytest.mark.parametrize(
    "bad", [{0: 1.0}, {2: -1.0}, {2: True}, {True: 1.0}, {"2": 1.0}, [(2, 1.0)], 1.5]
)
def test_bad_step_costs_are_refused(bad):
    with pytest.raises(InvalidArgumentError, match="step_cost"):
        Speculation("ngram", step_cost=bad)
