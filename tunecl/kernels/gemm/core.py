"""The GEMM core: what the GEMM families (``gemm_tiled``, ``gemm_direct``, ``gemm_simt``, ``gemm_mma``,
``gemm_wgmma``), the GEMM-backed convolutions and attention share.

- space helpers: :data:`Rule`, :func:`enumerate_space` (the rule-pruned enumeration), :func:`make_space`,
  :func:`check_config`, :func:`check_dtype`, and what they read of a device (:func:`device_type`,
  :func:`compute_units`, :func:`is_nvidia`, :func:`capabilities`, :func:`max_alloc_bytes`);
- build helpers: :func:`layout_options`, :func:`variant_options` (the build options of the alignment
  variants), :func:`row_grid`, :func:`widest`, :class:`Fp32Gemm`;
- :class:`GemmPlan`, a GEMM compiled with one config of one family, with its split-K and stream-K
  launches and their workspaces (:func:`workspace_ld`, :func:`splitk_workspace_bytes`, :func:`tile_count`,
  :func:`streamk_parts_bytes`).

Operand layouts are checked in :mod:`~tunecl.kernels.gemm.gemm_operands`, operands are pre-transposed by
:mod:`~tunecl.kernels.gemm.gemm_pretrans`, and the shared ``.cl`` includes lie next to these modules.

Alignment: global vector loads need offsets, leading dimensions and batch strides that are multiples of
the vector width. :class:`GemmPlan` checks that per call and runs a variant compiled with scalar
accesses for the operand that is not aligned (compiled on first need, then kept), so any offset and any
leading dimension is correct; the tuned, packed layout gets the vector variant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyopencl as cl

from tunecl.errors import WorkGroupTooLargeError
from tunecl.kernels.base import Config, Constraint, Space, build_options
from tunecl.kernels.gemm.gemm_operands import check_operand, operand_layouts
from tunecl.problems import DTYPES, GemmProblem
from tunecl.runtime import Device

WORKSPACE_CAP = 256 * 2**20  # bytes the split-K partial sums of one plan may use
FIXUP_THREADS = 256  # work-group of gemm_streamk_fixup (four outputs per thread)

Variant = tuple[bool, bool, bool]  # (A, B, C) addresses aligned for the vector accesses
Rule = tuple[str, tuple[str, ...], Callable[[Mapping[str, int]], bool]]
"""(name, parameters it reads, predicate): one named constraint, checked as soon as its parameters
are set when the space is enumerated."""


def device_type(device: Any) -> str:
    """``gpu``, ``cpu``, ... (works for a :class:`Device` and for test doubles with a fingerprint)."""
    fingerprint = getattr(device, "fingerprint", None)
    return getattr(fingerprint, "device_type", None) or getattr(device, "device_type", "gpu")


def compute_units(device: Any) -> int:
    """Compute units of a :class:`Device` or test double (1 if unknown)."""
    fingerprint = getattr(device, "fingerprint", None)
    return int(getattr(fingerprint, "compute_units", 0) or getattr(device, "compute_units", 0) or 1)


def is_nvidia(device: Any) -> bool:
    """Whether the device takes NVIDIA's build options (``-cl-nv-maxrregcount``)."""
    fingerprint = getattr(device, "fingerprint", None)
    vendor = getattr(fingerprint, "vendor", None) or getattr(device, "vendor", "")
    return "nvidia" in str(vendor).lower()


def widest(ld: int, widths: Sequence[int] = (4, 2, 1)) -> int:
    """The widest global vector of ``widths`` (given widest first) that a leading dimension of ``ld``
    keeps aligned."""
    return next(w for w in widths if ld % w == 0)


def enumerate_space(params: Mapping[str, Sequence[int]], rules: Sequence[Rule]) -> Iterator[Config]:
    """Every combination of ``params`` (in their order) that passes ``rules``, pruning a branch as soon
    as a rule whose parameters are all set fails, so huge raw products enumerate quickly."""
    order = list(params)
    checks: list[list[Callable[[Mapping[str, int]], bool]]] = [[] for _ in order]
    for _name, needs, check in rules:
        checks[max(order.index(p) for p in needs)].append(check)
    levels = [(name, params[name], checks[depth]) for depth, name in enumerate(order)]
    last = len(levels)
    config: dict[str, int] = {}

    def walk(depth: int) -> Iterator[Config]:
        if depth == last:
            yield dict(config)
            return
        name, values, level_checks = levels[depth]
        for value in values:
            config[name] = value
            for check in level_checks:
                if not check(config):
                    break
            else:
                yield from walk(depth + 1)
        del config[name]

    return walk(0)


def make_space(params: dict[str, tuple[int, ...]], constraints: Sequence[Rule],
               pruning: Sequence[Rule], implied: Mapping[str, int] | None = None) -> Space:
    """A :class:`Space` whose ``violations`` name the ``constraints`` and whose configs additionally
    pass ``pruning`` (rules that drop valid but pointless configs for this problem, e.g. tiles far
    larger than the matrix; a pruned config still builds and runs correctly). ``implied``: see
    :class:`Space`."""
    return Space(params=params, constraints=[Constraint(name, check) for name, _, check in constraints],
                 generate=lambda: enumerate_space(params, list(constraints) + list(pruning)),
                 generated_valid=True, implied=dict(implied or {}))


def check_config(space: Space, config: Mapping[str, int], name: str) -> None:
    """Raise ValueError naming every violated constraint, before anything is compiled."""
    broken = space.violations(config)
    if broken:
        raise ValueError(f"invalid {name} config {dict(config)}: violates {', '.join(broken)}")


def layout_options(problem: GemmProblem) -> list[str]:
    """``-DTRANS_A`` / ``-DTRANS_B``: how the kernel reads the operands."""
    return [f"-DTRANS_A={int(problem.trans_a)}", f"-DTRANS_B={int(problem.trans_b)}"]


def variant_options(config: Mapping[str, int], layout: Sequence[str], vwa: int, vwb: int,
                    dropped: Collection[str] = ()) -> Callable[[Variant], list[str]]:
    """The build options of each alignment variant (:class:`GemmPlan`): ``config`` less ``dropped``, with
    the global vector widths VWA = ``vwa`` and VWB = ``vwb`` for an aligned operand (1 for one that is
    not) and CSCALAR = 1 where C is not aligned, then ``layout``."""
    def options(variant: Variant) -> list[str]:
        aligned_a, aligned_b, aligned_c = variant
        specialized = {k: v for k, v in config.items() if k not in dropped}
        specialized.update(VWA=vwa if aligned_a else 1, VWB=vwb if aligned_b else 1, CSCALAR=int(not aligned_c))
        return build_options(specialized, layout)

    return options


def row_grid(problem: GemmProblem, config: Mapping[str, int],
             threads: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(global, local) size of one-dimensional work-groups of ``threads``, one per MWG x NWG tile of C:
    N tiles along x, M tiles along y, the batch along z."""
    glob = (-(-problem.n // config["NWG"]) * threads, -(-problem.m // config["MWG"]), problem.batch)
    return glob, (threads, 1, 1)


class Fp32Gemm:
    """What the fp32 GEMM families share: the problem kind, and that they apply to every float32 GEMM."""

    kind = "gemm"

    def applies(self, problem: GemmProblem, device: Device) -> bool:
        return isinstance(problem, GemmProblem) and problem.dtype == "float32"


def check_dtype(name: str, problem: GemmProblem, dtype: str) -> None:
    """Raise ValueError for a ``problem`` of another dtype than ``dtype``, the one family ``name``
    computes (its space, default and build refuse it before anything is compiled)."""
    if problem.dtype != dtype:
        raise ValueError(f"{name} computes {dtype} GEMMs, not {problem.key}")


# Kernel arguments of both families: M, N, K, alpha, beta, then (buffer, offset, ld, stride) x 3.
SCALAR_DTYPES = [np.int32, np.int32, np.int32, np.float32, np.float32,
                 None, np.int64, np.int32, np.int64,
                 None, np.int64, np.int32, np.int64,
                 None, np.int64, np.int32, np.int64]


# gemm_streamk: gemm_tiled's arguments, then the workspace, batches, dp_tiles
STREAMK_SCALAR_DTYPES = SCALAR_DTYPES + [None, np.int32, np.int32]
# gemm_tiled built with SPLITK_FINISH: then C, c_offset, ldc, stride_c, alpha, beta
FINISH_SCALAR_DTYPES = SCALAR_DTYPES + [None, np.int64, np.int32, np.int64, np.float32, np.float32]
# gemm_streamk_fixup: M, N, K, alpha, beta, workspace, batches, dp_tiles, sk_groups, C, c_offset, ldc, stride_c
FIXUP_SCALAR_DTYPES = [np.int32, np.int32, np.int32, np.float32, np.float32, None, np.int32, np.int32, np.int32,
                       None, np.int64, np.int32, np.int64]

# gemm_splitk_reduce: M, N, alpha, beta, workspace, ldw, C, c_offset, ldc, stride_c
REDUCE_SCALAR_DTYPES = [np.int32, np.int32, np.float32, np.float32, None, np.int32, None, np.int64, np.int32,
                        np.int64]
REDUCE_THREADS = 256  # work-group of the reduction (one output per thread)


def workspace_ld(n: int) -> int:
    """Row stride of the split-K partial sums: N rounded up to 4, so float4 stores stay aligned."""
    return -(-n // 4) * 4


def splitk_workspace_bytes(problem: GemmProblem, splitk: int) -> int:
    """Bytes of the partial sums of ``splitk`` K slices of every output (0 without split K)."""
    return 0 if splitk == 1 else 4 * splitk * problem.batch * problem.m * workspace_ld(problem.n)


def tile_count(problem: GemmProblem, mwg: int, nwg: int) -> int:
    """C tiles of ``mwg`` x ``nwg`` over the whole batch."""
    return -(-problem.m // mwg) * -(-problem.n // nwg) * problem.batch


def streamk_parts_bytes(sk_groups: int, config: Mapping[str, int]) -> int:
    """Bytes of the stream-K parts: two MWG x NWG tiles per stream-K work-group."""
    return 4 * 2 * sk_groups * config["MWG"] * config["NWG"]


def max_alloc_bytes(device: Any) -> int:
    """The largest buffer the plan may allocate on ``device`` (test doubles: the workspace cap)."""
    return min(WORKSPACE_CAP, int(getattr(device, "max_alloc_size", WORKSPACE_CAP)))


def capabilities(device: Any) -> frozenset[str]:
    """``device.capabilities`` (test doubles without the attribute have none)."""
    return frozenset(getattr(device, "capabilities", ()) or ())


class GemmPlan:
    """A GEMM problem compiled with one config of one family, ready to enqueue.

    Attributes:
        algorithm: the family's name (``gemm_tiled``, ``gemm_direct``).
        config: the tunables it was built with.
        problem: the :class:`GemmProblem` it computes.
        workspace_bytes: device memory it holds besides A, B and C (the split-K partial sums or the
            stream-K parts; 0 without). Allocated when the plan is built, freed with the plan.
    """

    def __init__(self, *, algorithm: str, problem: GemmProblem, device: Device, config: Config,
                 source: str, options: Callable[[Variant], list[str]], widths: tuple[int, int, int],
                 global_size: tuple[int, int, int], local_size: tuple[int, int, int], splitk: int = 1,
                 streamk: tuple[int, int] | None = None, splitk_finish: bool = False,
                 sum_batch: bool = False):
        self.algorithm = algorithm
        self.problem = problem
        self.config = dict(config)
        self.splitk = splitk
        # C is one matrix, the sum over the batch, added by the kernel's last work-group of each tile
        # (built with SUM_BATCH; the batch's products wait in the workspace, a counter per tile after them)
        self.sum_batch = sum_batch
        # the kernel adds the split's partial sums itself (one launch; a counter per C tile after them)
        self.splitk_finish = (splitk_finish and splitk > 1) or sum_batch
        self.streamk = streamk  # (tiles computed whole, stream-K work-groups): gemm_streamk
        self._kernel_name, self._scalar_dtypes = ((algorithm, SCALAR_DTYPES) if streamk is None
                                                  else ("gemm_streamk", STREAMK_SCALAR_DTYPES))
        if self.splitk_finish:
            self._scalar_dtypes = FINISH_SCALAR_DTYPES
        self._ldw = workspace_ld(problem.n)
        self.workspace_bytes = (4 * splitk * problem.batch * problem.m * self._ldw if sum_batch
                                else splitk_workspace_bytes(problem, splitk))
        counters = 0
        if self.splitk_finish:
            counters = 4 * tile_count(problem, config["MWG"], config["NWG"]) // (problem.batch if sum_batch else 1)
        self.workspace_bytes += counters
        if streamk is not None:
            self.workspace_bytes = streamk_parts_bytes(streamk[1], config)
        self.device = device
        self._source = source
        self._options = options
        self._widths = widths  # vector widths that A, B, C addresses must be multiples of (1 = none)
        self._global_size = global_size
        self._local_size = local_size
        self._kernels: dict[Variant, cl.Kernel] = {}
        p = problem
        # Compile now the variant the packed layout needs, so build errors surface in build().
        packed = self._variant(0, p.k if not p.trans_a else p.m, p.m * p.k,
                               0, p.n if not p.trans_b else p.k, p.k * p.n, 0, p.n, p.m * p.n)
        self.kernel_for(packed)
        self.workspace: cl.Buffer | None = None
        if self.splitk_finish:
            self.workspace = device.alloc(self.workspace_bytes)
            # (each launch leaves the counters zero again)
            cl.enqueue_fill_buffer(device.queue, self.workspace, np.int32(0), self.workspace_bytes - counters,
                                   counters)
        elif splitk > 1:
            program = device.build(source, options(packed))  # the cached program of that variant
            self._reduce = device.kernel(program, "gemm_splitk_reduce", REDUCE_SCALAR_DTYPES)
            threads = min(REDUCE_THREADS, device.max_work_group_size)
            self._reduce_local = (threads, 1)
            self._reduce_global = (-(-(p.m * p.n) // threads) * threads, p.batch)
            self.workspace = device.alloc(self.workspace_bytes)
        elif streamk is not None:
            if streamk[1]:
                program = device.build(source, options(packed))
                self._fixup = device.kernel(program, "gemm_streamk_fixup", FIXUP_SCALAR_DTYPES)
                threads = min(FIXUP_THREADS, device.max_work_group_size)
                split_tiles = tile_count(p, config["MWG"], config["NWG"]) - streamk[0]
                quads = split_tiles * config["MWG"] * config["NWG"] // 4  # four outputs per thread
                self._fixup_local = (threads,)
                self._fixup_global = (-(-quads // threads) * threads,)
            # Every launch passes a workspace argument; without stream-K groups nothing touches it.
            self.workspace = device.alloc(max(4, self.workspace_bytes))

    def kernel_for(self, variant: Variant) -> cl.Kernel:
        """The kernel of ``variant``, compiled on first use (the aligned one is the tuned one)."""
        kernel = self._kernels.get(variant)
        if kernel is None:
            program = self.device.build(self._source, self._options(variant))
            kernel = self.device.kernel(program, self._kernel_name, self._scalar_dtypes)
            threads, allowed = math.prod(self._local_size), self.device.kernel_max_threads(kernel)
            if threads > allowed:  # else every launch fails with OUT_OF_RESOURCES
                raise WorkGroupTooLargeError(f"{self.algorithm} {self.config}: the compiled kernel runs at most {allowed} "
                                 f"threads per work-group on this device (registers), the config needs {threads}")
            self._kernels[variant] = kernel
        return kernel

    def _variant(self, a_offset: int, lda: int, stride_a: int, b_offset: int, ldb: int, stride_b: int,
                 c_offset: int, ldc: int, stride_c: int) -> Variant:
        # Widths are powers of two, so OR-ing the values keeps any low bit that any of them has.
        wa, wb, wc = self._widths
        many = self.problem.batch > 1
        return ((a_offset | lda | (stride_a if many else 0)) % wa == 0,
                (b_offset | ldb | (stride_b if many else 0)) % wb == 0,
                (c_offset | ldc | (stride_c if many else 0)) % wc == 0)

    def run(self, a: cl.Buffer, b: cl.Buffer, c: cl.Buffer, *, alpha: float = 1.0, beta: float = 0.0,
            a_offset: int = 0, b_offset: int = 0, c_offset: int = 0,
            lda: int | None = None, ldb: int | None = None, ldc: int | None = None,
            stride_a: int | None = None, stride_b: int | None = None, stride_c: int | None = None,
            wait_for: list | None = None) -> list[cl.Event]:
        """Enqueue ``C = alpha * op(A) @ op(B) + beta * C`` without waiting.

        Args:
            a, b, c: buffers of the problem's dtype (fp32; half for float16 problems).
            alpha, beta: scalars; ``beta == 0`` never reads C.
            a_offset, b_offset, c_offset: where matrix 0 starts in each buffer, in elements.
            lda, ldb, ldc: row strides in elements (≥ the row length); None = packed rows.
            stride_a, stride_b, stride_c: elements between the matrices of a batch; None = rows × ld.
                0 broadcasts A or B over the batch; C's matrices must not overlap.
            wait_for: events to wait for before the kernel starts.

        Returns:
            The enqueued events: one kernel, or with split K the partial products and the reduction, or
            with a stream-K tail the tiles and the fixup of the split ones.

        Raises:
            ValueError: a layout that does not fit its buffer or is malformed.
        """
        p = self.problem
        lda, stride_a, ldb, stride_b = operand_layouts(p, a, a_offset, lda, stride_a, b, b_offset, ldb, stride_b)
        if self.sum_batch:   # one C matrix (its stride unused)
            ldc, stride_c = check_operand("c", c, c_offset, ldc, 0, p.m, p.n, 1, DTYPES[p.dtype])
        else:
            ldc, stride_c = check_operand("c", c, c_offset, ldc, stride_c, p.m, p.n, p.batch, DTYPES[p.dtype])
            if p.batch > 1 and stride_c < (p.m - 1) * ldc + p.n:
                raise ValueError(f"stride_c={stride_c} makes the {p.batch} C matrices overlap")
        ldw = self._ldw
        # a finishing kernel's "C" is the packed, aligned workspace (the real C gets scalar accesses)
        variant = (self._variant(a_offset, lda, stride_a, b_offset, ldb, stride_b, 0, ldw, p.m * ldw)
                   if self.splitk_finish else
                   self._variant(a_offset, lda, stride_a, b_offset, ldb, stride_b, c_offset, ldc, stride_c))
        kernel = self._kernels.get(variant) or self.kernel_for(variant)
        queue = self.device.queue
        if self.splitk_finish:
            # Raw products into the workspace (alpha 1, beta 0); the kernel's last work-group of each tile
            # adds them in a fixed order and applies alpha and beta to C.
            return [kernel(queue, self._global_size, self._local_size, p.m, p.n, p.k, 1.0, 0.0,
                           a, a_offset, lda, stride_a, b, b_offset, ldb, stride_b,
                           self.workspace, 0, ldw, p.m * ldw, c, c_offset, ldc, stride_c, alpha, beta,
                           wait_for=wait_for)]
        if self.streamk is not None:
            dp_tiles, sk_groups = self.streamk
            main = kernel(queue, self._global_size, self._local_size, p.m, p.n, p.k, alpha, beta,
                          a, a_offset, lda, stride_a, b, b_offset, ldb, stride_b, c, c_offset, ldc, stride_c,
                          self.workspace, p.batch, dp_tiles, wait_for=wait_for)
            if not sk_groups:
                return [main]
            fixed = self._fixup(queue, self._fixup_global, self._fixup_local, p.m, p.n, p.k, alpha, beta,
                                self.workspace, p.batch, dp_tiles, sk_groups, c, c_offset, ldc, stride_c,
                                wait_for=[main])
            return [main, fixed]
        if self.splitk == 1:
            return [kernel(queue, self._global_size, self._local_size, p.m, p.n, p.k, alpha, beta,
                           a, a_offset, lda, stride_a, b, b_offset, ldb, stride_b, c, c_offset, ldc, stride_c,
                           wait_for=wait_for)]
        # Raw partial sums into the workspace (packed, aligned: "C" with alpha 1, beta 0), then the
        # fixed-order reduction launch applies alpha and beta to C.
        partial = kernel(queue, self._global_size, self._local_size, p.m, p.n, p.k, 1.0, 0.0,
                         a, a_offset, lda, stride_a, b, b_offset, ldb, stride_b,
                         self.workspace, 0, ldw, p.m * ldw, wait_for=wait_for)
        reduced = self._reduce(queue, self._reduce_global, self._reduce_local, p.m, p.n, alpha, beta,
                               self.workspace, ldw, c, c_offset, ldc, stride_c, wait_for=[partial])
        return [partial, reduced]
