"""The joint search space of one problem: every applicable algorithm with its valid configs.

A strategy sees one :class:`SearchSpace`; the first choice is the algorithm, the others are the
algorithm's own parameters. Spaces can be huge (a CLBlast-like GEMM space has millions of valid
configs), so nothing here enumerates a space unless asked to: counting stops at a limit, the nearest
valid config is found by a bounded breadth-first walk over the parameter grid, and random valid
configs come from rejection sampling.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import random
from collections.abc import Container, Iterable, Iterator, Mapping

from tunecl.kernels.base import Space
from tunecl.search.result import Config, config_key

NEAREST_CHECKS = 20_000  # grid points the nearest-valid walk may visit (~0.5 s at worst)
SAMPLE_DRAWS = 2_000  # raw draws before a random sample falls back to the nearest valid config


@dataclasses.dataclass
class SearchSpace:
    """Algorithms in preference order, each with its :class:`Space` and heuristic default.

    Attributes:
        spaces: algorithm name -> its space for this problem and device.
        defaults: algorithm name -> its default config (evaluated first by every strategy).
        seeds: configs asked for by name (``tunecl tune --try``), evaluated right after the defaults.
        hints: the winners of similar problems (a warm start), evaluated after the seeds.
    """

    spaces: dict[str, Space]
    defaults: dict[str, Config]
    seeds: tuple[tuple[str, Config], ...] = ()
    hints: tuple[tuple[str, Config], ...] = ()

    def __post_init__(self) -> None:
        different = set(self.spaces) ^ set(self.defaults)
        if different:
            raise ValueError(f"spaces and defaults name different algorithms: {sorted(different)}")

    @property
    def algorithms(self) -> list[str]:
        return list(self.spaces)

    def count(self, limit: int) -> int:
        """Valid configs over all algorithms, counted up to ``limit + 1`` (cheap for huge spaces: lazily;
        a count that reaches a space's end leaves it enumerated for everyone after it)."""
        total = 0
        for space in self.spaces.values():
            total += sum(1 for _ in itertools.islice(space.iter_configs(), limit + 1 - total))
            if total > limit:
                break
        return total

    def size(self) -> int:
        """Number of valid configs over all algorithms (enumerates every space: small spaces only)."""
        return sum(len(space.configs()) for space in self.spaces.values())

    def is_valid(self, algorithm: str, config: Mapping[str, int]) -> bool:
        return algorithm in self.spaces and self.spaces[algorithm].is_valid(config)

    def violations(self, algorithm: str, config: Mapping[str, int]) -> list[str]:
        if algorithm not in self.spaces:
            return [f"unknown algorithm {algorithm}"]
        return self.spaces[algorithm].violations(config)

    def candidates(self) -> Iterator[tuple[str, Config]]:
        """Every valid (algorithm, config), algorithm by algorithm in each space's own order."""
        for name, space in self.spaces.items():
            for config in space.configs():
                yield name, dict(config)

    def nearest(self, algorithm: str, config: Mapping[str, int],
                exclude: Container[tuple[str, tuple[tuple[str, int], ...]]] = (),
                max_checks: int = NEAREST_CHECKS) -> Config | None:
        """The valid config of ``algorithm`` nearest to ``config`` whose key is not in ``exclude``.

        Distance counts the steps between values in each parameter's ordered value list (tile sizes
        16 → 32 → 64 ...), summed over parameters. A breadth-first walk from ``config`` visits grid
        points in order of distance (ties: parameter order, smaller value first) and stops at the first
        valid one, or after ``max_checks`` points (then None, as when everything valid is excluded).
        """
        params = self.spaces[algorithm].params
        names = list(params)
        start = tuple(_position(params[n], config.get(n)) for n in names)
        queue = collections.deque([start])
        visited = {start}
        while queue and len(visited) <= max_checks:
            point = queue.popleft()
            candidate = {n: params[n][i] for n, i in zip(names, point)}
            if config_key(algorithm, candidate) not in exclude and self.spaces[algorithm].is_valid(candidate):
                return candidate
            for axis, step in itertools.product(range(len(names)), (-1, 1)):
                index = point[axis] + step
                if 0 <= index < len(params[names[axis]]):
                    neighbour = point[:axis] + (index,) + point[axis + 1:]
                    if neighbour not in visited:
                        visited.add(neighbour)
                        queue.append(neighbour)
        return None

    def sample(self, rng: random.Random, exclude: Container[tuple] = ()) -> tuple[str, Config] | None:
        """A random valid (algorithm, config) not in ``exclude``: an algorithm uniformly, then uniform
        draws from its raw value lists until one is valid (the nearest valid one after too many)."""
        algorithm = rng.choice(self.algorithms)
        params = self.spaces[algorithm].params
        draw: Config = {}
        for _ in range(SAMPLE_DRAWS):
            draw = {name: rng.choice(values) for name, values in params.items()}
            if config_key(algorithm, draw) not in exclude and self.spaces[algorithm].is_valid(draw):
                return algorithm, draw
        nearest = self.nearest(algorithm, draw, exclude)
        return (algorithm, nearest) if nearest is not None else None

    def samples(self, seed: int, exclude: Container[tuple] = ()) -> Iterable[tuple[str, Config]]:
        """Random valid configs forever (None-free; stops when sampling finds nothing new)."""
        rng = random.Random(seed)
        while True:
            found = self.sample(rng, exclude)
            if found is None:
                return
            yield found


def parse_named(spec: str) -> tuple[str, dict[str, int]]:
    """``NAME[:KEY=VALUE,...]`` -> (algorithm name, parameter overrides of its default).

    Raises:
        ValueError: an item without ``=`` or a value that is not an integer.
    """
    name, _, rest = spec.partition(":")
    overrides = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{spec!r}: expected KEY=VALUE after the algorithm name, got {item!r}")
        try:
            overrides[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"{spec!r}: {key.strip()} must be an integer, got {value!r}") from None
    return name.strip(), overrides


def _position(values: tuple[int, ...], value: int | None) -> int:
    """Where ``value`` sits in ``values`` (the closest entry for a value that is not listed)."""
    if value in values:
        return values.index(value)
    if value is None or not values:
        return 0
    return min(range(len(values)), key=lambda i: abs(values[i] - value))
