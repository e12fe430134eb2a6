"""tests/draws.py: the day's seed, its override, and which numbered draws a run checks."""

from __future__ import annotations

import datetime

import draws
import pytest


def test_the_seed_is_the_day_of_the_year_unless_named(monkeypatch):
    monkeypatch.delenv(draws.SEED_ENV, raising=False)
    assert draws._seed() == datetime.date.today().timetuple().tm_yday
    monkeypatch.setenv(draws.SEED_ENV, "42")
    assert draws._seed() == 42
    monkeypatch.setenv(draws.SEED_ENV, "tuesday")
    with pytest.raises(ValueError, match=draws.SEED_ENV):
        draws._seed()


def test_picks_are_distinct_repeatable_and_recorded(monkeypatch):
    monkeypatch.setattr(draws, "FULL", False)
    picks = draws.Picks("demo/picks", per_run=4, full=12, pool=50)
    assert len(picks) == 4 and len(set(picks.numbers)) == 4 and all(0 <= n < 50 for n in picks.numbers)
    assert draws.Picks("demo/picks", per_run=4, full=12, pool=50).numbers == picks.numbers
    assert draws.Picks("demo/other", per_run=4, full=12, pool=50).numbers != picks.numbers
    draws.used.clear()
    picks[0]
    assert draws.used == {"demo/picks"} and f"{draws.SEED_ENV}={draws.SEED}" in draws.describe()
    monkeypatch.setattr(draws, "FULL", True)
    assert draws.Picks("demo/picks", per_run=4, full=12).numbers == list(range(12))
    assert draws.count(per_run=1, full=3) == 3
