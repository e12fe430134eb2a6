"""The small parts of the search layer without OpenCL: Result, timing policy, guarded compare."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from tunecl.search.harness import GUARD_BITS, compare_guarded, guarded, reduction_tolerance
from tunecl.search.measure import MeasureTimeout, TimingPolicy, measure
from tunecl.search.result import Result, Status, config_key


def test_result_time_is_the_median_and_failures_are_infinitely_slow():
    assert Result("a", {"X": 1}, Status.OK, (3.0, 1.0, 2.0)).time == 2.0
    assert math.isinf(Result("a", {"X": 1}, Status.OK).time)
    assert math.isinf(Result("a", {"X": 1}, Status.WRONG_RESULT, (1e-9,)).time)
    result = Result("a", {"Y": 2, "X": 1}, Status.TIMEOUT, (0.5,), "slow")
    assert Result.from_dict(result.to_dict()) == result
    assert result.key == config_key("a", {"X": 1, "Y": 2})


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def fake_launch(clock: FakeClock, device_seconds: float, wall_seconds: float):
    """A launch whose single event reports ``device_seconds`` and takes ``wall_seconds`` of host time."""
    def launch():
        clock.now += wall_seconds
        profile = types.SimpleNamespace(start=0, end=int(device_seconds * 1e9))
        return [types.SimpleNamespace(wait=lambda: None, profile=profile)]
    return launch


def test_measure_repeats_until_the_minimum_total_time():
    clock = FakeClock()
    policy = TimingPolicy(warmup=2, min_time=0.01, min_repeats=3, max_repeats=100)
    m = measure(fake_launch(clock, 1e-3, 1.2e-3), policy, clock)
    assert len(m.times) == 10 and all(t == pytest.approx(1e-3) for t in m.times)
    assert m.note == ""
    few = measure(fake_launch(clock, 1.0, 1.0), TimingPolicy(min_time=0.01, min_repeats=3), clock)
    assert len(few.times) == 3
    capped = measure(fake_launch(clock, 1e-6, 1e-6), TimingPolicy(min_time=1.0, max_repeats=7), clock)
    assert len(capped.times) == 7


def test_event_times_that_disagree_with_the_wall_clock_are_replaced():
    clock = FakeClock()
    m = measure(fake_launch(clock, 5.0, 1e-3), TimingPolicy(min_time=0.0), clock)  # 5 s in 1 ms: broken
    assert all(t == pytest.approx(1e-3) for t in m.times)
    assert "wall clock" in m.note


def test_a_slow_candidate_times_out():
    clock = FakeClock()
    with pytest.raises(MeasureTimeout):
        measure(fake_launch(clock, 2.0, 2.0), TimingPolicy(min_time=10.0, timeout=5.0), clock)
    with pytest.raises(MeasureTimeout):
        measure(fake_launch(clock, 9.0, 9.0), TimingPolicy(warmup=1, timeout=5.0), clock)


def test_timing_policy_rejects_nonsense():
    with pytest.raises(ValueError):
        TimingPolicy(min_repeats=5, max_repeats=2)
    with pytest.raises(ValueError):
        TimingPolicy(timeout=0)


def test_tolerance_grows_like_the_square_root_of_the_reduction():
    assert reduction_tolerance(1) < reduction_tolerance(64) < reduction_tolerance(4096)
    assert reduction_tolerance(4096) / reduction_tolerance(64) == pytest.approx((8 * 64 + 8) / (8 * 8 + 8))
    assert reduction_tolerance(4096) < 1e-4  # a missing term (~0.25 of ~1400) stays detectable


def test_guarded_compare_finds_wrong_values_nans_and_out_of_bounds_writes():
    expected = np.arange(6, dtype=np.float64).reshape(2, 3)
    tolerance = np.full((2, 3), 1e-6)
    out = guarded(expected.astype(np.float32), 4)
    assert out.size == 14 and (out[:4].view(np.uint32) == GUARD_BITS).all()
    assert compare_guarded(out, 4, expected, tolerance, "case") is None
    wrong = out.copy()
    wrong[4 + 5] = 7.0
    assert compare_guarded(wrong, 4, expected, tolerance, "case").startswith("1 of 6 elements wrong (case)")
    nan = out.copy()
    nan[4] = np.nan
    assert "1 of 6 elements wrong" in compare_guarded(nan, 4, expected, tolerance, "case")
    spilled = out.copy()
    spilled[-1] = 0.0
    assert "guard region after" in compare_guarded(spilled, 4, expected, tolerance, "case")
    before = out.copy()
    before[0] = np.float32(np.nan)  # a NaN, but not *the* guard NaN: still a write
    assert "guard region before" in compare_guarded(before, 4, expected, tolerance, "case")
