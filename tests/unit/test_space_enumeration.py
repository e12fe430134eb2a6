"""Space.iter_configs: a lazy enumeration that keeps what it found, so counting up to a limit twice (or
a count, then a search) pays for the configs once, in the same order as a fresh enumeration."""

import itertools

from tunecl.kernels.base import Constraint, Space
from tunecl.search.space import SearchSpace


def _counting_space(size: int = 50):
    calls = []

    def generate():
        for i in range(size):
            calls.append(i)
            yield {"a": i % 10, "b": i // 10}

    space = Space({"a": tuple(range(10)), "b": tuple(range(size // 10))},
                  [Constraint("a_even", lambda c: c["a"] % 2 == 0)], generate)
    return space, calls


def test_a_stopped_enumeration_goes_on_where_it_stopped():
    space, calls = _counting_space()
    first = list(itertools.islice(space.iter_configs(), 5))
    assert len(calls) == 9  # five even values of a among the first nine configs
    again = list(itertools.islice(space.iter_configs(), 7))
    assert again[:5] == first and len(calls) == 13  # replayed, then four more generated
    everything = space.configs()
    assert everything[:7] == again and len(everything) == 25 and len(calls) == 50
    assert list(space.iter_configs()) == everything and len(calls) == 50  # kept


def test_interleaved_iterators_see_the_same_order():
    space, calls = _counting_space()
    one, two = space.iter_configs(), space.iter_configs()
    seen_one = [next(one) for _ in range(3)]
    seen_two = [next(two) for _ in range(6)]
    seen_one += list(one)
    assert seen_two == seen_one[:6] and list(two) == seen_one[6:]
    fresh, _ = _counting_space()
    assert seen_one == fresh.configs() and len(calls) == 50


def test_search_space_count_twice_enumerates_once():
    space, calls = _counting_space()
    search = SearchSpace({"x": space}, {"x": {"a": 0, "b": 0}})
    assert search.count(10) == 11 and search.count(10) == 11
    assert len(calls) == 21  # 11 even configs: up to the 21st generated, once
    assert search.count(100) == 25 and len(calls) == 50


def test_is_valid_answers_what_violations_finds():
    space = Space(params={"A": (1, 2, 4), "B": (8, 16), "C": (0, 1)},
                  constraints=[Constraint("A_divides_B", lambda c: c["B"] % (4 * c["A"]) == 0),
                               Constraint("C_only_with_small_A", lambda c: c["C"] == 0 or c["A"] < 4)],
                  implied={"C": 0})
    cases = [dict(zip("ABC", values)) for values in itertools.product((1, 2, 3, 4), (8, 16, 32), (0, 1))]
    cases += [{"A": 1, "B": 8}, {"A": 1}, {"A": 1, "B": 8, "D": 0}, {"A": 1, "B": 8, "C": 0, "D": 0}, {}]
    for config in cases:
        assert space.is_valid(config) == (not space.violations(config)), config
    assert space.is_valid({"A": 2, "B": 16}) and not space.is_valid({"A": 4, "B": 16, "C": 1})
