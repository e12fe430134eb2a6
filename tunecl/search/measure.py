"""Timing by device events: warm-up, repeats up to a minimum measured total, raw samples kept.

Each sample is one launch, waited for, timed from the start of its first event to the end of its last
(:meth:`Device.elapsed`). Launch overhead on the host is therefore not counted — the backend enqueues
without waiting, so device time is what a model pays. A wall-clock sanity check guards against drivers
whose profiling counters are broken (zero, negative or longer than the wall time).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

# Device time may exceed the host's measure of the same launch by this much before it is distrusted
# (event clocks and perf_counter differ in resolution and start at different moments).
_WALL_SLACK_S = 1e-3
_WALL_SLACK_FACTOR = 1.5


@dataclasses.dataclass(frozen=True)
class TimingPolicy:
    """How long and how often to measure one candidate.

    Attributes:
        warmup: launches before measuring (the first launch may compile for the work-group size, fill
            caches, raise clocks).
        min_time: keep measuring until the samples add up to this many seconds ...
        min_repeats: ... and at least this many samples were taken ...
        max_repeats: ... but never more than this many.
        timeout: wall-clock seconds one candidate may spend in warm-up and measurement; past it the
            candidate is a TIMEOUT. A single launch cannot be preempted from the host, so a kernel
            that hangs still hangs; the limit stops slow candidates from eating the budget.
    """

    warmup: int = 1
    min_time: float = 0.1
    min_repeats: int = 3
    max_repeats: int = 200
    timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.min_repeats < 1 or self.max_repeats < self.min_repeats:
            raise ValueError(f"inconsistent timing policy {self}")
        if self.min_time < 0 or self.timeout <= 0:
            raise ValueError(f"inconsistent timing policy {self}")


class MeasureTimeout(Exception):
    """Measuring one candidate took longer than :attr:`TimingPolicy.timeout`."""


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Raw samples of one candidate.

    Attributes:
        times: seconds per launch (device events, or wall clock where events were not trustworthy).
        wall: host seconds per launch, enqueue to completion.
        note: "" or why some samples fell back to the wall clock.
    """

    times: tuple[float, ...]
    wall: tuple[float, ...]
    note: str = ""


def _elapsed(events: Sequence[Any]) -> float:
    first, last = events[0], events[-1]
    last.wait()
    return (last.profile.end - first.profile.start) * 1e-9


def measure(launch: Callable[[], Sequence[Any]], policy: TimingPolicy | None = None,
            clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Time ``launch`` (which enqueues and returns its events) under ``policy`` (default ``TimingPolicy()``).

    Returns:
        The raw samples; take their median (``Result.time``).

    Raises:
        MeasureTimeout: warm-up plus measurement ran past ``policy.timeout``.
        pyopencl.Error: a launch failed.
    """
    policy = policy or TimingPolicy()
    start = clock()
    for _ in range(policy.warmup):
        events = launch()
        if events:
            events[-1].wait()
        if clock() - start > policy.timeout:
            raise MeasureTimeout(f"warm-up alone took more than {policy.timeout:g} s")
    times: list[float] = []
    walls: list[float] = []
    distrusted = 0
    while len(times) < policy.max_repeats:
        t0 = clock()
        events = launch()
        if not events:
            raise ValueError("the plan enqueued nothing (no events to time)")
        device_time = _elapsed(events)
        wall = clock() - t0
        if not 0.0 < device_time <= wall * _WALL_SLACK_FACTOR + _WALL_SLACK_S:
            distrusted += 1
            device_time = wall
        times.append(device_time)
        walls.append(wall)
        if clock() - start > policy.timeout:
            raise MeasureTimeout(f"measuring took more than {policy.timeout:g} s "
                                 f"({len(times)} samples, last {device_time * 1e3:.3g} ms)")
        if len(times) >= policy.min_repeats and sum(times) >= policy.min_time:
            break
    note = (f"{distrusted} of {len(times)} event timings disagreed with the wall clock; used the wall "
            f"clock for those" if distrusted else "")
    return Measurement(tuple(times), tuple(walls), note)
