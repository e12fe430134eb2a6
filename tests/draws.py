"""Seeded random draws of kernel configs, a different seed each day.

A test that checks configs drawn at random from a kernel's space draws a few of them per run, seeded by
the day of the year, so that successive runs check different configs; ``TUNECL_RANDOM_SEED=N`` repeats
the draws of seed N, and ``TUNECL_RANDOM_CONFIGS=full`` draws each test's full count (as many as before
the draws rotated). A failing test that drew prints its seed and the variables that repeat its draws
(the report section "random draws", added by tests/conftest.py).
"""

from __future__ import annotations

import datetime
import os
import random
from collections.abc import Callable

SEED_ENV = "TUNECL_RANDOM_SEED"
FULL_ENV = "TUNECL_RANDOM_CONFIGS"
FULL = os.environ.get(FULL_ENV, "").strip().lower() == "full"


def _seed() -> int:
    spec = os.environ.get(SEED_ENV, "").strip()
    if spec:
        if not spec.isdigit():
            raise ValueError(f"{SEED_ENV} must be a non-negative integer, not {spec!r}")
        return int(spec)
    return datetime.date.today().timetuple().tm_yday


SEED = _seed()   # once per process: every pytest-xdist worker of a run draws with the same seed
used: set[str] = set()   # names drawn for since the current test began (tests/conftest.py resets it)


def count(per_run: int, full: int) -> int:
    """How many configs a test draws: ``full`` with TUNECL_RANDOM_CONFIGS=full, else ``per_run``."""
    return full if FULL else per_run


def rng(name: str, seed: int | None = None) -> random.Random:
    """The generator of the draws named ``name`` (a test's or its parameters'), for today's seed (or
    ``seed``)."""
    used.add(name)
    return random.Random(f"{name}/{SEED if seed is None else seed}")


def shape_configs(rng: random.Random, shapes: list[str], configs_of: Callable[[str], list[dict[str, int]]],
                  count: int, stride: int = 1) -> list[tuple[str, dict[str, int]]]:
    """``count`` (shape, config) pairs with distinct configs: shapes every ``stride``-th from a start
    drawn by ``rng``, each with a config drawn from ``configs_of(shape)``."""
    start = rng.randrange(len(shapes))
    drawn, seen = [], set()
    for index in range(count):
        shape = shapes[(start + stride * index) % len(shapes)]
        configs = configs_of(shape)
        config = rng.choice(configs)
        while tuple(sorted(config.items())) in seen:
            config = rng.choice(configs)
        seen.add(tuple(sorted(config.items())))
        drawn.append((shape, config))
    return drawn


class Picks:
    """Which of a test's numbered draws (draw ``i`` seeded by ``i``, as ``random.Random(base + i)``) run:
    ``per_run`` numbers of ``range(pool)`` drawn with the day's seed, or ``range(full)`` with
    TUNECL_RANDOM_CONFIGS=full. Tests are parametrized by position (``range(len(picks))``), so the test ids
    stay the same from day to day; ``picks[position]`` is the draw's number."""

    def __init__(self, name: str, per_run: int, full: int, pool: int = 1000):
        self.name = name
        self.numbers = list(range(full)) if FULL else random.Random(f"{name}/{SEED}").sample(range(pool), per_run)

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, position: int) -> int:
        used.add(self.name)
        return self.numbers[position]


def describe() -> str:
    """What repeats the current test's draws."""
    full = f" {FULL_ENV}=full" if FULL else ""
    return (f"drew {', '.join(sorted(used))} with seed {SEED}; repeat with {SEED_ENV}={SEED}{full} "
            f"(every config: {FULL_ENV}=full)")
