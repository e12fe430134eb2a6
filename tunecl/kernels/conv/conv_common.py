"""What every convolution family shares: the problem's ``-D`` geometry, device limits, the plan base
class that implements the fixed ``run`` contract, and the small helper kernels of ``conv_common.cl``.

The conv plan contract (the tuner's harness and the PyTorch backend call it exactly so); all tensors
are contiguous NCHW fp32 (for float16 problems ``a``, ``b`` and ``out`` are half, the bias stays fp32),
the weight is K×(C/groups)×R×S::

    plan.run(a, b, out, *, a_offset=0, b_offset=0, out_offset=0,   # offsets in elements
             bias=None, bias_offset=0,   # forward only: K floats added per output channel
             beta=0.0,                   # out = conv + beta*out; beta == 0 never reads out
             wait_for=None) -> list[cl.Event]   # enqueued, not waited

    fwd:        a = x (N,C,H,W),  b = w (K,C/g,R,S), out = y  (N,K,P,Q)
    bwd_data:   a = dy (N,K,P,Q), b = w,             out = dx (N,C,H,W)
    bwd_weight: a = x,            b = dy,            out = dw (K,C/g,R,S)

Families pass the problem's geometry to their kernels as ``-D`` constants (:func:`geometry_options`):
a plan is built per shape anyway, and constant sizes turn the index arithmetic of gathers into
multiplies and shifts and let the compiler unroll the filter loops.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl.kernels.base import Config, Constraint, Space, build_options, read_source
from tunecl.kernels.sizes import round_up
from tunecl.precision import FP32
from tunecl.problems import ConvProblem, GemmProblem
from tunecl.runtime import Device

DIRECTION_CODES = {"fwd": 0, "bwd_data": 1, "bwd_weight": 2}
INT32_LIMIT = 2**31 - 1
FLOAT_BYTES = 4

# The GPU local-memory budget a space assumes when the device reports more (CPU devices report MiBs,
# but the values should stay valid on GPUs too): 48 KiB is the portable NVIDIA/AMD per-group limit.
GPU_LOCAL_MEM = 48 * 1024


def geometry_options(problem: ConvProblem) -> list[str]:
    """``-D`` options that fix the problem's geometry in a kernel (names as in ``conv_common.cl``)."""
    values = {
        "CONV_N": problem.n, "CONV_C": problem.c, "CONV_H": problem.h, "CONV_W": problem.w,
        "CONV_K": problem.k, "CONV_P": problem.p, "CONV_Q": problem.q,
        "CONV_R": problem.r, "CONV_S": problem.s,
        "STRIDE_H": problem.stride[0], "STRIDE_W": problem.stride[1],
        "PAD_H": problem.padding[0], "PAD_W": problem.padding[1],
        "DIL_H": problem.dilation[0], "DIL_W": problem.dilation[1],
        "GROUPS": problem.groups, "DIRECTION": DIRECTION_CODES[problem.direction],
    }
    return [f"-D{name}={value}" for name, value in values.items()]


def supported(problem: ConvProblem, dtype: str = "float32") -> bool:
    """What every family needs: its dtype (fp32 unless it says otherwise), and every tensor index fits a
    signed 32-bit int."""
    if problem.dtype != dtype:
        return False
    largest = max(np.prod(problem.input_shape), np.prod(problem.output_shape),
                  np.prod(problem.weight_shape))
    return int(largest) <= INT32_LIMIT // 2  # room for offsets added to an index


def is_gpu(device: Device) -> bool:
    return device.fingerprint.device_type == "gpu"


def local_mem_limit(device: Device) -> int:
    """Bytes of local memory a config may use on ``device``."""
    return min(device.local_mem_size, GPU_LOCAL_MEM) if is_gpu(device) else device.local_mem_size


def max_group_size(device: Device) -> int:
    """Work-items per work-group a config may use on ``device`` (capped at 1024 for sane CPU groups)."""
    return min(device.max_work_group_size, 1024)


def image_chunk(n: int, fits: Callable[[int], bool]) -> int:
    """Images per pass of a family that works in chunks: the largest divisor ``d`` of ``n`` whose
    workspace ``fits(d)``; 0 when not even one image's does."""
    return max((d for d in range(1, n + 1) if n % d == 0 and fits(d)), default=0)


def reduction_length(problem: ConvProblem) -> int:
    """Products summed into one output element (what error bounds scale with)."""
    cg, kg = problem.c // problem.groups, problem.k // problem.groups
    if problem.direction == "fwd":
        return cg * problem.r * problem.s
    if problem.direction == "bwd_data":
        return kg * problem.r * problem.s
    return problem.n * problem.p * problem.q


def out_elements(problem: ConvProblem) -> int:
    """Elements of the tensor a direction writes."""
    shape = {"fwd": problem.output_shape, "bwd_data": problem.input_shape,
             "bwd_weight": problem.weight_shape}[problem.direction]
    return int(np.prod(shape))


_COMMON_SCALARS = {
    # out, out_offset, ws, parts, part_stride, n, bias, bias_offset, use_bias, bias_inner, bias_k, beta
    "split_reduce": [None, np.int32, None, np.int32, np.int32, np.int32, None, np.int32, np.int32,
                     np.int32, np.int32, np.float32],
    # out, out_offset, n, bias, bias_offset, bias_inner, bias_k
    "add_bias": [None, np.int32, np.int32, None, np.int32, np.int32, np.int32],
}
# device -> (name, options) -> kernel: plans launch these on every call, and reading and expanding the
# source to find the build in the device's cache cost ~50 µs of file I/O and hashing each time
# (weakly keyed by device: a Device and its context go when their last user does)
_common_kernels: weakref.WeakKeyDictionary[Device, dict[tuple[str, tuple[str, ...]], cl.Kernel]] = \
    weakref.WeakKeyDictionary()


def common_kernel(device: Device, name: str, options: Sequence[str] = ()) -> cl.Kernel:
    """A helper kernel of ``conv_common.cl`` (``split_reduce``, ``add_bias``) built for ``device``."""
    kernels = _common_kernels.get(device)
    if kernels is None:
        kernels = _common_kernels.setdefault(device, {})
    key = (name, tuple(options))
    kernel = kernels.get(key)
    if kernel is None:
        program = device.build(read_source(__package__, "conv_common.cl"), list(options))
        kernel = kernels.setdefault(key, device.kernel(program, name, _COMMON_SCALARS[name]))
    return kernel


@dataclasses.dataclass
class ConvPlan:
    """A built convolution: kernels bound to a problem and a config, its workspace, and ``run``.

    Families subclass it and implement :meth:`enqueue`; ``run`` checks the arguments of the contract
    once so no family repeats that.
    """

    algorithm: str
    config: Config
    problem: ConvProblem
    device: Device
    workspace_bytes: int = 0
    workspace: cl.Buffer | None = dataclasses.field(default=None, repr=False)
    _dummy: cl.Buffer | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.workspace_bytes and self.workspace is None:
            self.workspace = self.device.alloc(self.workspace_bytes)
        self._dummy = self.device.alloc(FLOAT_BYTES)

    def run(self, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, *, a_offset: int = 0, b_offset: int = 0,
            out_offset: int = 0, bias: cl.Buffer | None = None, bias_offset: int = 0, beta: float = 0.0,
            wait_for: Sequence[cl.Event] | None = None) -> list[cl.Event]:
        """Enqueue the convolution (see the module docstring for the meaning of each argument)."""
        if bias is not None and self.problem.direction != "fwd":
            raise ValueError(f"bias is only defined for the forward direction, not {self.problem.direction}")
        return self.enqueue(a, b, out, int(a_offset), int(b_offset), int(out_offset),
                            bias, int(bias_offset), float(beta), list(wait_for) if wait_for else None)

    def enqueue(self, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, a_offset: int, b_offset: int,
                out_offset: int, bias: cl.Buffer | None, bias_offset: int, beta: float,
                wait_for: list[cl.Event] | None) -> list[cl.Event]:
        raise NotImplementedError

    def clear_counters(self, offset: int) -> None:
        """Zero the workspace from byte ``offset`` on: the per-tile counters of a kernel that finishes its split
        reduction itself (``split_finish.cl``; each launch leaves them zero again)."""
        cl.enqueue_fill_buffer(self.device.queue, self.workspace, np.int32(0), offset, self.workspace_bytes - offset)

    def bias_args(self, bias: cl.Buffer | None, bias_offset: int) -> tuple[cl.Buffer, int, int]:
        """(buffer, offset, use_bias) for kernels that fuse the bias; a dummy buffer stands for none."""
        return (bias, bias_offset, 1) if bias is not None else (self._dummy, 0, 0)

    def split_reduce(self, out: cl.Buffer, out_offset: int, parts: int, bias: cl.Buffer | None,
                     bias_offset: int, beta: float, wait_for: list[cl.Event] | None) -> cl.Event:
        """Sum ``parts`` partial results of the workspace into ``out`` in a fixed order (deterministic),
        adding the bias (forward) and ``beta * out`` (a float16 problem's ``out`` is half: the fp32 sum
        is rounded once)."""
        n = out_elements(self.problem)
        half_out = ["-DOUT_HALF=1"] if self.problem.dtype == "float16" else []
        kernel = common_kernel(self.device, "split_reduce", half_out)
        bias_buf, bias_off, use_bias = self.bias_args(bias, bias_offset)
        return self.device.launch(kernel, (round_up(n, 256),), None, out, out_offset, self.workspace,
                                  parts, n, n, bias_buf, bias_off, use_bias,
                                  self.problem.p * self.problem.q, self.problem.k, beta,
                                  wait_for=wait_for)


@dataclasses.dataclass
class KernelPlan(ConvPlan):
    """A plan of one kernel launch, with the argument lists the direct-style kernels share:

    fwd ``(a, a_off, b, b_off, out, out_off, bias, bias_off, use_bias, beta)``, bwd_data
    ``(a, a_off, b, b_off, out, out_off, beta)``, bwd_weight ``(a, a_off, b, b_off, out, out_off,
    workspace, beta)``; when ``config["SPLIT"] > 1`` bwd_weight writes partial sums to the workspace
    and a fixed-order :meth:`split_reduce` follows, unless the kernel adds them itself (``finish``).
    """

    kernel: cl.Kernel | None = None
    global_size: tuple[int, ...] = ()
    local_size: tuple[int, ...] = ()
    finish: bool = False

    def enqueue(self, a: cl.Buffer, b: cl.Buffer, out: cl.Buffer, a_offset: int, b_offset: int,
                out_offset: int, bias: cl.Buffer | None, bias_offset: int, beta: float,
                wait_for: list[cl.Event] | None) -> list[cl.Event]:
        direction = self.problem.direction
        args = (a, a_offset, b, b_offset, out, out_offset)
        if direction == "fwd":
            return [self.device.launch(self.kernel, self.global_size, self.local_size, *args,
                                       *self.bias_args(bias, bias_offset), beta, wait_for=wait_for)]
        if direction == "bwd_data":
            return [self.device.launch(self.kernel, self.global_size, self.local_size, *args, beta,
                                       wait_for=wait_for)]
        split = self.config.get("SPLIT", 1)
        ws = self.workspace if split > 1 else self._dummy
        first = self.device.launch(self.kernel, self.global_size, self.local_size, *args, ws, beta,
                                   wait_for=wait_for)
        if split == 1 or self.finish:
            return [first]
        return [first, self.split_reduce(out, out_offset, split, None, 0, beta, [first])]


def add_bias(plan: ConvPlan, out: cl.Buffer, out_offset: int, bias: cl.Buffer, bias_offset: int,
             wait_for: list[cl.Event] | None) -> cl.Event:
    """Enqueue ``y[n, k, p, q] += bias[k]`` over a forward problem's whole output."""
    p = plan.problem
    n = out_elements(p)
    return plan.device.launch(common_kernel(plan.device, "add_bias"), (round_up(n, 256),), None, out,
                              out_offset, n, bias, bias_offset, p.p * p.q, p.k, wait_for=wait_for)


def staged_space(params: dict[str, tuple[int, ...]], constraints: list[Constraint]) -> Space:
    """A :class:`Space` whose enumeration checks each constraint as soon as the parameters it reads are
    set (params in their given order), so a big raw product prunes early.

    A constraint that raises KeyError reads a parameter not set yet and is retried deeper; one that
    returns without raising cannot depend on the unset parameters, so its answer is final.
    """
    names = list(params)

    def walk(depth: int, partial: Config, pending: list[Constraint]) -> Iterator[Config]:
        still = []
        for rule in pending:
            try:
                if not rule.check(partial):
                    return
            except KeyError:
                still.append(rule)
        if depth == len(names):
            yield dict(partial)
            return
        name = names[depth]
        for value in params[name]:
            partial[name] = value
            yield from walk(depth + 1, partial, still)
        del partial[name]

    return Space(params, constraints, lambda: walk(0, {}, list(constraints)))


def fit_default(space: Space, preferred: Config) -> Config:
    """``preferred`` if the space accepts it, else the valid config nearest to it (log2 distance).

    Heuristic defaults are written as wishes; this makes them valid for every problem and device.
    """
    if space.is_valid(preferred):
        return dict(preferred)

    terms: dict[tuple[str, int], float] = {}   # (parameter, value) -> its part of the distance

    def term(key: tuple[str, int]) -> float:
        k, value = key
        found = terms[key] = abs(np.log2(max(value, 0) + 1) - np.log2(max(preferred.get(k, 0), 0) + 1))
        return found

    def distance(config: Config) -> float:   # (the parts summed in the config's order, as always)
        return sum(terms[key] if key in terms else term(key) for key in config.items())

    configs = space.configs()
    if not configs:
        raise ValueError("the parameter space is empty")
    return dict(min(configs, key=distance))


class ConvAlgorithm:
    """Shared plumbing of the conv families: kind, source file, program builds."""

    name: str = ""
    version: int = 1
    kind: str = "conv"
    source_file: str = ""

    def __repr__(self) -> str:
        return f"<{self.name} v{self.version}>"

    def applies(self, problem: ConvProblem, device: Device) -> bool:
        """Every fp32 convolution whose indices fit (families that compute fewer say so)."""
        return problem.kind == "conv" and supported(problem)

    def program(self, device: Device, problem: ConvProblem, config: Config,
                extra: Sequence[str] = ()) -> cl.Program:
        """The family's ``.cl`` built for one problem and config (cached by the device)."""
        options = build_options(config, [*geometry_options(problem), *extra])
        return device.build(read_source(__package__, self.source_file), options)

    def check(self, problem: ConvProblem, device: Device, config: Config) -> None:
        """Raise ValueError naming what is wrong if the algorithm cannot run ``config`` on ``problem``."""
        if not self.applies(problem, device):
            raise ValueError(f"{self.name} does not apply to {problem.key}")
        broken = self.space(problem, device).violations(config)  # type: ignore[attr-defined]
        if broken:
            raise ValueError(f"invalid {self.name} config {config}: {', '.join(broken)}")


# ---- families built on the GEMM family's plans ----------------------------------------------------
GEMM_ALGORITHM = "gemm_tiled"
GEMM_PREFIX = "g_"


def gemm_algorithm(name: str = GEMM_ALGORITHM) -> Any:
    """The registered GEMM algorithm ``name`` (``gemm_tiled`` unless a family says otherwise), or None
    while it is not registered."""
    from tunecl import kernels  # the registry imports the families: look it up at call time

    return next((a for a in kernels.algorithms("gemm") if a.name == name), None)


@functools.lru_cache(maxsize=8)   # an enumerated GEMM space holds tens of thousands of configs
def gemm_space(problem: GemmProblem, device: Device, name: str = GEMM_ALGORITHM) -> Space:
    """GEMM algorithm ``name``'s space for a sub-problem, kept so its enumeration is paid once per use."""
    return gemm_algorithm(name).space(problem, device)


@functools.lru_cache(maxsize=4096)
def gemm_space_has_configs(problem: GemmProblem, device: Device, name: str = GEMM_ALGORITHM) -> bool:
    """Whether GEMM algorithm ``name`` offers any config for a sub-problem (stops at the first one found)."""
    space = gemm_algorithm(name).space(problem, device)
    if space.generate is None:
        return bool(space.configs())
    return any(space.is_valid(config) for config in space.generate())


def split_gemm_config(config: Mapping[str, int]) -> tuple[Config, Config]:
    """(the family's own parameters, the GEMM's parameters without the prefix)."""
    own = {k: v for k, v in config.items() if not k.startswith(GEMM_PREFIX)}
    return own, {k[len(GEMM_PREFIX):]: v for k, v in config.items() if k.startswith(GEMM_PREFIX)}


OwnSpace = tuple[dict[str, tuple[int, ...]], list[Constraint]]   # a family's own params and constraints


class GemmBackedAlgorithm(ConvAlgorithm):
    """A family whose arithmetic is a GEMM algorithm's plan on a sub-problem (the ``gemm`` of its
    :meth:`layout`): ``gemm_tiled``, or the one :attr:`gemm_name` names (see :func:`with_gemm`).

    Its space is its own small parameter set crossed with the GEMM's space for that sub-problem, the
    GEMM's parameters prefixed ``g_``; the GEMM's constraints are checked as one named constraint,
    ``gemm_config_valid``, and spelled out (prefixed) when a config is rejected at build. It computes at
    its GEMM's precision (``"tf32"`` on ``gemm_mma_tf32``), and applies only where its GEMM does.
    """

    gemm_name: str = GEMM_ALGORITHM

    @property
    def precision(self) -> str:
        return str(getattr(gemm_algorithm(self.gemm_name), "precision", FP32))

    def layout(self, problem: ConvProblem) -> Any:
        """How ``problem`` maps onto the workspace and the GEMM: an object with the sub-problem as
        ``gemm`` and the workspace's size as ``workspace_floats``; None when one image does not fit."""
        raise NotImplementedError

    def gemm_problem(self, problem: ConvProblem) -> GemmProblem | None:
        plan_layout = self.layout(problem)
        return None if plan_layout is None else plan_layout.gemm

    def workspace_fits(self, problem: ConvProblem, device: Device) -> bool:
        """Whether the workspace of ``problem`` (which must have a layout) fits one buffer of ``device``."""
        return self.layout(problem).workspace_floats * FLOAT_BYTES <= device.max_alloc_size

    def own_space(self, problem: ConvProblem, device: Device) -> OwnSpace:
        """The family's own parameters and constraints (empty by default)."""
        return {}, []

    def own_default(self, problem: ConvProblem, device: Device) -> Config:
        return {}

    def gemm_applies(self, problem: ConvProblem, device: Device) -> bool:
        """Whether the GEMM algorithm is registered, applies to the sub-problem and offers a config."""
        gemm = gemm_algorithm(self.gemm_name)
        sub = self.gemm_problem(problem)
        return (gemm is not None and sub is not None and gemm.applies(sub, device)
                and gemm_space_has_configs(sub, device, self.gemm_name))

    def space(self, problem: ConvProblem, device: Device) -> Space:
        gemm_space_ = gemm_space(self.gemm_problem(problem), device, self.gemm_name)
        own, own_constraints = self.own_space(problem, device)
        params = {**own, **{GEMM_PREFIX + k: v for k, v in gemm_space_.params.items()}}

        @functools.cache
        def gemm_valid(values: tuple[tuple[str, int], ...]) -> bool:
            return gemm_space_.is_valid(dict(values))

        constraints = [*own_constraints, Constraint(
            "gemm_config_valid", lambda c: gemm_valid(tuple(sorted(split_gemm_config(c)[1].items()))))]

        def generate() -> Iterator[Config]:
            # the GEMM configs lazily (the GEMM space keeps what it found for the next pass): counting
            # up to a limit then stops inside the first of the family's own combinations instead of
            # enumerating the whole GEMM space first (~1 s per problem on the development machine)
            for values in itertools.product(*own.values()):
                mine = dict(zip(own, values))
                if all(rule.check(mine) for rule in own_constraints):
                    for g in gemm_space_.iter_configs():
                        yield {**mine, **{GEMM_PREFIX + k: v for k, v in g.items()}}

        # GEMM parameters added after results were stored (SPLITK, STREAMK, ASYNC) keep those results
        # valid here too; ``generate`` yields only valid configs (the GEMM space's, with own values that
        # pass the own constraints)
        implied = {GEMM_PREFIX + k: v for k, v in gemm_space_.implied.items()}
        return Space(params, constraints, generate, generated_valid=True, implied=implied)

    def default(self, problem: ConvProblem, device: Device) -> Config:
        gemm_default = gemm_algorithm(self.gemm_name).default(self.gemm_problem(problem), device)
        return {**self.own_default(problem, device), **{GEMM_PREFIX + k: v for k, v in gemm_default.items()}}

    def check(self, problem: ConvProblem, device: Device, config: Config) -> None:
        if not self.applies(problem, device):
            raise ValueError(f"{self.name} does not apply to {problem.key}")
        broken = self.space(problem, device).violations(config)
        if "gemm_config_valid" in broken:
            broken.remove("gemm_config_valid")
            sub_space = gemm_space(self.gemm_problem(problem), device, self.gemm_name)
            broken += [GEMM_PREFIX + v for v in sub_space.violations(split_gemm_config(config)[1])]
        if broken:
            raise ValueError(f"invalid {self.name} config {config}: {', '.join(broken)}")

    def build_gemm(self, problem: ConvProblem, device: Device, config: Config, **options: Any) -> Any:
        """The GEMM family's plan for the sub-problem with the config's ``g_`` parameters (``options``: the
        family's own build options)."""
        return gemm_algorithm(self.gemm_name).build(self.gemm_problem(problem), device,
                                                    split_gemm_config(config)[1], **options)


def with_gemm(family: GemmBackedAlgorithm, gemm_name: str, name: str) -> GemmBackedAlgorithm:
    """``family`` (an instance) with its products on GEMM algorithm ``gemm_name`` instead, as the
    algorithm ``name``: same kernels, layouts and own parameters, the other GEMM's space and precision."""
    variant = copy.copy(family)
    variant.gemm_name, variant.name = gemm_name, name
    return variant


@dataclasses.dataclass
class GemmBackedPlan(ConvPlan):
    """A plan whose products run on ``gemm_plan``; it computes at that plan's precision (verification
    tolerance: :mod:`tunecl.search.harness_conv`)."""

    gemm_plan: object = None

    @property
    def precision(self) -> str:
        return str(getattr(self.gemm_plan, "precision", FP32))
