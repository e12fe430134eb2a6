"""How far ``tunecl tune --net`` is through a net's problems, and about how long the rest will take."""

from __future__ import annotations

import time
from collections.abc import Callable


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``: a remaining time, as precise as it is worth being."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Eta:
    """Progress over a fixed number of problems, with an estimate of the time left.

    The estimate is the mean wall time of the problems finished so far times the problems left. A
    problem found already tuned takes a fraction of a second and counts like the rest, so while many
    of the remaining ones are stored the estimate runs high, never low. With a total time limit no
    problem starts after it, so the time left is at most the limit's remainder plus one more problem.

    Args:
        total: how many problems the run has.
        total_time_limit: the seconds after which no new problem starts (None: no limit).
        clock: the time source (``time.monotonic``; tests pass their own).
    """

    def __init__(self, total: int, total_time_limit: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.total_time_limit = total_time_limit
        self.clock = clock
        self.started = clock()
        self.done = 0

    def finished_one(self) -> None:
        self.done += 1

    def seconds_left(self) -> float | None:
        """The estimate (None before the first problem has finished: nothing to go by yet)."""
        if not self.done:
            return None
        elapsed = self.clock() - self.started
        each = elapsed / self.done
        left = each * (self.total - self.done)
        if self.total_time_limit is not None:
            left = min(left, max(0.0, self.total_time_limit - elapsed) + each)
        return left

    def status(self) -> str:
        """``12 s elapsed, about 1 min 40 s left`` (only the first part before any problem finished)."""
        elapsed = f"{format_duration(self.clock() - self.started)} elapsed"
        left = self.seconds_left()
        return elapsed if left is None else f"{elapsed}, about {format_duration(left)} left"
