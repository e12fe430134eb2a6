"""What every kernel family provides: an :class:`Algorithm` with a parameter :class:`Space`, a heuristic
default and a ``build`` that returns a :class:`Plan`.

The search layer sees only this vocabulary, so a new family plugs into the tuner by implementing it.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Protocol

from tunecl.problems import Problem
from tunecl.runtime import Device

Config = dict[str, int]


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([\w.-]+\.cl)"[^\n]*$', re.MULTILINE)

KERNEL_FOLDERS = ("gemm", "conv", "ops", "")
"""The folders of ``tunecl/kernels`` that hold ``.cl`` files (``""``: the folder itself), in the order
:func:`read_source` searches them. A ``.cl`` file's name is unique across them."""


def kernel_folders() -> list[Traversable]:
    """The folders of :data:`KERNEL_FOLDERS` that exist, in that order."""
    root = resources.files(__package__)
    folders = [root.joinpath(name) if name else root for name in KERNEL_FOLDERS]
    return [folder for folder in folders if folder.is_dir()]


def read_source(package: str, filename: str) -> str:
    """The text of a ``.cl`` file that lives next to a family's module (``read_source(__package__, ...)``),
    with its ``#include "other.cl"`` lines replaced by the text of those files.

    A file is looked up in the folder of the file that names it (``package``'s folder for ``filename``,
    the including file's folder for an include), else in the kernel folders in :data:`KERNEL_FOLDERS`'
    order: a family's ``.cl`` file includes the shared files of its own folder and of the GEMM core by
    name alone.

    The expansion happens here, not in the OpenCL compiler, so the program text that the build caches
    (ours, pyopencl's, the driver's) key on holds every included line: editing a shared ``.cl`` file
    can never serve a stale binary. Each file is expanded once per program (later includes of it are
    dropped), as with an include guard.

    Raises:
        FileNotFoundError: a file is in none of those folders.
    """
    seen: set[str] = set()

    def locate(folder: Traversable, name: str) -> Traversable:
        for candidate in (folder, *kernel_folders()):
            if candidate.joinpath(name).is_file():
                return candidate
        raise FileNotFoundError(f"{name}: neither in {folder} nor in the kernel folders {KERNEL_FOLDERS}")

    def expand(folder: Traversable, name: str) -> str:
        seen.add(name)
        here = locate(folder, name)
        text = here.joinpath(name).read_text()

        def include(match: re.Match[str]) -> str:
            other = match.group(1)
            if other in seen:
                return f"// {other}: included above"
            return f"// ---- {other} ----\n{expand(here, other)}\n// ---- end of {other} ----"
        return _INCLUDE.sub(include, text)

    return expand(resources.files(package), filename)


def build_options(config: Mapping[str, int | bool], extra: Iterable[str] = ()) -> list[str]:
    """``-DNAME=VALUE`` options for a config, in a stable order so equal configs hit the same cache entry."""
    return [f"-D{name}={int(value)}" for name, value in sorted(config.items())] + list(extra)


@dataclasses.dataclass(frozen=True)
class Constraint:
    """A named rule a config must satisfy (``name`` appears in error messages and tests)."""

    name: str
    check: Callable[[Mapping[str, int]], bool]


@dataclasses.dataclass
class Space:
    """The valid configurations of one algorithm for one problem on one device, built once.

    ``params`` maps each tunable to its candidate values; ``constraints`` (named) remove invalid
    combinations *before* anything is compiled, device limits (local memory, work-group size) included.
    Families with huge raw products may pass ``generate`` to enumerate valid configs with early pruning;
    ``generated_valid`` says that it yields only configs that set every parameter to one of its values and
    pass every constraint (as :func:`tunecl.kernels.gemm.core.make_space`'s walk does), so they are not
    checked a second time.

    ``implied`` holds parameters a family gained after results were stored with its version: a config
    without one means the value given here, which must build the very kernel the old config built, so
    those stored results stay valid (and servable) without a version bump.
    """

    params: dict[str, tuple[int, ...]]
    constraints: list[Constraint] = dataclasses.field(default_factory=list)
    generate: Callable[[], Iterable[Config]] | None = None
    generated_valid: bool = False
    implied: dict[str, int] = dataclasses.field(default_factory=dict)
    _configs: list[Config] | None = dataclasses.field(default=None, repr=False)
    # an enumeration stopped early: the valid configs found so far and the iterator to go on with
    _found: list[Config] = dataclasses.field(default_factory=list, repr=False)
    _rest: Iterator[Config] | None = dataclasses.field(default=None, repr=False)

    def complete(self, config: Mapping[str, int]) -> Config:
        """``config`` with the ``implied`` parameters it leaves out filled in."""
        return {**self.implied, **config}

    def violations(self, config: Mapping[str, int]) -> list[str]:
        """Names of the constraints ``config`` breaks, plus unknown/missing/out-of-range parameters
        (an ``implied`` parameter may be left out)."""
        config = self.complete(config)
        problems = [f"unknown parameter {k}" for k in config if k not in self.params]
        for name, values in self.params.items():
            if name not in config:
                problems.append(f"missing parameter {name}")
            elif config[name] not in values:
                problems.append(f"{name}={config[name]} not in {values}")
        if problems:
            return problems
        return [c.name for c in self.constraints if not c.check(config)]

    def is_valid(self, config: Mapping[str, int]) -> bool:
        """Whether :meth:`violations` finds nothing (stopping at the first: plan defaults ask this of
        hundreds of candidates)."""
        config = self.complete(config)
        return self._in_ranges(config) and all(constraint.check(config) for constraint in self.constraints)

    def in_ranges(self, config: Mapping[str, int]) -> bool:
        """Whether ``config`` (with the ``implied`` parameters it leaves out) sets exactly this space's
        parameters, each to one of its values: :meth:`is_valid` without the constraints."""
        return self._in_ranges(self.complete(config))

    def _in_ranges(self, config: Mapping[str, int]) -> bool:
        params = self.params
        return len(config) == len(params) and all(
            (values := params.get(name)) is not None and value in values for name, value in config.items())

    def configs(self) -> list[Config]:
        """All valid configs (computed on first use, then kept)."""
        if self._configs is None:
            for _ in self.iter_configs():
                pass
        assert self._configs is not None
        return self._configs

    def iter_configs(self) -> Iterator[Config]:
        """The valid configs in :meth:`configs`' order, lazily, so a caller may stop early (counting up
        to a limit). Enumerating a big space costs seconds, so what was found is kept: a later call
        replays it and goes on where the last one stopped, and one that reaches the end leaves the
        whole list for :meth:`configs`."""
        if self._configs is not None:
            yield from self._configs
            return
        if self._rest is None:
            self._rest = self._enumerate()
        index = 0
        while True:
            if index < len(self._found):
                yield self._found[index]
                index += 1
                continue
            if self._configs is not None:  # another iterator reached the end meanwhile
                return
            try:
                config = next(self._rest)
            except StopIteration:
                self._configs, self._rest = self._found, None
                return
            self._found.append(config)

    def _enumerate(self) -> Iterator[Config]:
        """Every valid config, in order, computed afresh."""
        if self.generate is not None and self.generated_valid:
            yield from self.generate()
        elif self.generate is not None:
            for config in self.generate():
                config = dict(config)
                if self.is_valid(config):
                    yield config
        else:
            names = list(self.params)
            for values in itertools.product(*self.params.values()):
                config = dict(zip(names, values))
                if all(rule.check(config) for rule in self.constraints):
                    yield config

    def __len__(self) -> int:
        return len(self.configs())

    def __iter__(self) -> Iterator[Config]:
        return iter(self.configs())


class Plan(Protocol):
    """A compiled, ready-to-enqueue implementation of one problem with one config.

    ``run`` enqueues without waiting and returns the events it enqueued (first and last are used for
    timing). Its arguments depend on the problem kind (see each family's module).
    """

    algorithm: str
    config: Config
    workspace_bytes: int

    def run(self, *args: Any, **kwargs: Any) -> list[Any]: ...


class Algorithm(Protocol):
    """One kernel family variant. ``name`` is the same in the module, the ``.cl`` file, the DB and tests.

    ``version`` must be bumped whenever a change would make stored results wrong or stale.
    """

    name: str
    version: int
    kind: str  # the problem kind it computes: "gemm" or "conv"

    def applies(self, problem: Problem, device: Device) -> bool: ...

    def space(self, problem: Problem, device: Device) -> Space: ...

    def default(self, problem: Problem, device: Device) -> Config: ...

    def build(self, problem: Problem, device: Device, config: Config) -> Plan: ...
