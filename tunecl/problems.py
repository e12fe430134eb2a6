"""Problems: frozen values naming one GEMM or convolution to compute, with canonical keys.

A problem's ``key`` is what the tuning database stores; ``problem_from_key(p.key) == p`` always holds.
Nothing here touches OpenCL, torch or SQL.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Union

DTYPES = {"float32": 4, "float16": 2}
DIRECTIONS = ("fwd", "bwd_data", "bwd_weight")


def _pair(value: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"expected one integer or a pair, got {value!r}")
        return int(value[0]), int(value[1])
    return int(value), int(value)


def _check_positive(what: str, problem: object, names: tuple[str, ...]) -> None:
    """Each of ``problem``'s fields ``names`` is a positive int (not a bool), else ValueError naming it."""
    for name in names:
        value = getattr(problem, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{what} {name} must be a positive integer, got {value!r}")


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {', '.join(DTYPES)}")


def _parse_fields(body: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in body.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"expected name=value, got {part!r}")
        name = name.strip().lower()
        if name in fields:
            raise ValueError(f"{name!r} is given twice")
        fields[name] = value.strip()
    return fields


def _int(fields: dict[str, str], name: str, default: int | None = None) -> int:
    if name not in fields:
        if default is None:
            raise ValueError(f"missing {name}=")
        return default
    try:
        return int(fields.pop(name))
    except ValueError:
        raise ValueError(f"{name} must be an integer") from None


def _ints(fields: dict[str, str], name: str, default: int) -> tuple[int, int]:
    raw = fields.pop(name, None)
    if raw is None:
        return default, default
    try:
        parts = [int(x) for x in raw.lower().split("x")]
    except ValueError:
        raise ValueError(f"{name} must be an integer or AxB, got {raw!r}") from None
    if len(parts) == 1:
        return parts[0], parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"{name} must be an integer or AxB, got {raw!r}")


def _flag(fields: dict[str, str], name: str) -> bool:
    raw = fields.pop(name, "0").lower()
    if raw in ("0", "n", "false", "no"):
        return False
    if raw in ("1", "t", "true", "yes"):
        return True
    raise ValueError(f"{name} must be 0 or 1, got {raw!r}")


def _reject_unknown(fields: dict[str, str], kind: str) -> None:
    if fields:
        raise ValueError(f"unknown {kind} field(s): {', '.join(sorted(fields))}")


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """``C[b] = op(A[b]) @ op(B[b])`` with op(A) M×K, op(B) K×N, C M×N, row-major, ``batch`` matrices."""

    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False
    batch: int = 1
    dtype: str = "float32"

    kind: ClassVar[str] = "gemm"

    def __post_init__(self) -> None:
        _check_positive("GEMM", self, ("m", "n", "k", "batch"))
        _check_dtype(self.dtype)

    @property
    def key(self) -> str:
        return (f"gemm:m={self.m},n={self.n},k={self.k},ta={int(self.trans_a)},tb={int(self.trans_b)},"
                f"batch={self.batch},dtype={self.dtype}")

    @classmethod
    def parse(cls, body: str) -> GemmProblem:
        """Parse the body of a key (``m=..,n=..,k=..[,ta=0,tb=0,batch=1,dtype=float32]``)."""
        fields = _parse_fields(body)
        problem = cls(_int(fields, "m"), _int(fields, "n"), _int(fields, "k"), _flag(fields, "ta"),
                      _flag(fields, "tb"), _int(fields, "batch", 1), fields.pop("dtype", "float32"))
        _reject_unknown(fields, "GEMM")
        return problem

    @classmethod
    def from_spec(cls, spec: str) -> GemmProblem:
        """Parse the CLI form ``M,N,K[,ta,tb[,batch]][,dtype=float16]``, e.g. ``1024,1024,1024``,
        ``64,1000,2048,0,1`` or ``4096,4096,4096,dtype=float16`` (the dtype defaults to float32)."""
        parts = [p.strip() for p in spec.split(",")]
        dtype = "float32"
        if parts and parts[-1].startswith("dtype="):
            dtype = parts.pop().removeprefix("dtype=")
            _check_dtype(dtype)
        if len(parts) not in (3, 5, 6):
            raise ValueError(f"expected M,N,K[,ta,tb[,batch]][,dtype=float16], got {spec!r}")
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"GEMM sizes must be integers, got {spec!r}") from None
        for name, value in zip(("ta", "tb"), nums[3:5]):
            if value not in (0, 1):
                raise ValueError(f"{name} must be 0 or 1, got {value}")
        flags = [bool(v) for v in nums[3:5]] or [False, False]
        return cls(nums[0], nums[1], nums[2], *flags, *(nums[5:6] or [1]), dtype=dtype)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def bytes(self) -> int:
        return (self.m * self.k + self.k * self.n + self.m * self.n) * self.batch * DTYPES[self.dtype]


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """A 2-D convolution in NCHW: input N×C×H×W, weight K×(C/groups)×R×S, output N×K×P×Q.

    ``direction`` says which of the three computations is meant: ``fwd`` (input, weight → output),
    ``bwd_data`` (output grad, weight → input grad) or ``bwd_weight`` (input, output grad → weight grad).
    """

    n: int
    c: int
    h: int
    w: int
    k: int
    r: int
    s: int
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    direction: str = "fwd"
    dtype: str = "float32"

    kind: ClassVar[str] = "conv"

    def __post_init__(self) -> None:
        for name in ("stride", "padding", "dilation"):
            object.__setattr__(self, name, _pair(getattr(self, name)))
        _check_positive("convolution", self, ("n", "c", "h", "w", "k", "r", "s", "groups"))
        if min(self.stride) < 1 or min(self.dilation) < 1:
            raise ValueError(f"stride and dilation must be ≥ 1, got {self.stride} and {self.dilation}")
        if min(self.padding) < 0:
            raise ValueError(f"padding must be ≥ 0, got {self.padding}")
        if self.c % self.groups or self.k % self.groups:
            raise ValueError(f"groups={self.groups} must divide both c={self.c} and k={self.k}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {self.direction!r}")
        _check_dtype(self.dtype)
        if self.p < 1 or self.q < 1:
            raise ValueError(
                f"output would be {self.p}x{self.q}: a {self.r}x{self.s} kernel with dilation "
                f"{self.dilation} does not fit a {self.h}x{self.w} input padded by {self.padding}")

    @property
    def p(self) -> int:
        """Output height."""
        return (self.h + 2 * self.padding[0] - self.dilation[0] * (self.r - 1) - 1) // self.stride[0] + 1

    @property
    def q(self) -> int:
        """Output width."""
        return (self.w + 2 * self.padding[1] - self.dilation[1] * (self.s - 1) - 1) // self.stride[1] + 1

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, self.h, self.w)

    @property
    def weight_shape(self) -> tuple[int, int, int, int]:
        return (self.k, self.c // self.groups, self.r, self.s)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.k, self.p, self.q)

    @property
    def key(self) -> str:
        def xy(v: tuple[int, int]) -> str:
            return f"{v[0]}x{v[1]}"
        return (f"conv:n={self.n},c={self.c},h={self.h},w={self.w},k={self.k},r={self.r},s={self.s},"
                f"stride={xy(self.stride)},pad={xy(self.padding)},dil={xy(self.dilation)},"
                f"groups={self.groups},dir={self.direction},dtype={self.dtype}")

    @classmethod
    def parse(cls, body: str) -> ConvProblem:
        """Parse ``n=16,c=64,h=56,w=56,k=64,r=3,s=3[,stride=1,pad=1,dilation=1,groups=1,dir=fwd]``.

        ``stride``/``pad``/``dil`` take one integer or ``AxB``; ``padding``/``dilation`` are accepted
        spellings; ``r`` defaults to ``s`` and vice versa when only one is given.
        """
        fields = _parse_fields(body)
        for long, short in (("padding", "pad"), ("dilation", "dil"), ("direction", "dir")):
            if long in fields:
                if short in fields:
                    raise ValueError(f"{long!r} and {short!r} are the same field")
                fields[short] = fields.pop(long)
        if "r" not in fields and "s" in fields:
            fields["r"] = fields["s"]
        if "s" not in fields and "r" in fields:
            fields["s"] = fields["r"]
        problem = cls(
            n=_int(fields, "n"), c=_int(fields, "c"), h=_int(fields, "h"), w=_int(fields, "w"),
            k=_int(fields, "k"), r=_int(fields, "r"), s=_int(fields, "s"),
            stride=_ints(fields, "stride", 1), padding=_ints(fields, "pad", 0),
            dilation=_ints(fields, "dil", 1), groups=_int(fields, "groups", 1),
            direction=fields.pop("dir", "fwd"), dtype=fields.pop("dtype", "float32"))
        _reject_unknown(fields, "convolution")
        return problem

    @property
    def flops(self) -> int:
        """Multiply-adds ×2, the same for all three directions."""
        return 2 * self.n * self.k * self.p * self.q * (self.c // self.groups) * self.r * self.s

    @property
    def bytes(self) -> int:
        elements = (self.n * self.c * self.h * self.w + self.k * (self.c // self.groups) * self.r * self.s
                    + self.n * self.k * self.p * self.q)
        return elements * DTYPES[self.dtype]

    def with_direction(self, direction: str) -> ConvProblem:
        return dataclasses.replace(self, direction=direction)

    @classmethod
    def transposed(cls, n: int, c: int, h: int, w: int, k: int, r: int, s: int,
                   stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] = 0,
                   output_padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1,
                   groups: int = 1) -> ConvProblem:
        """The regular convolution a transposed one is made of (direction ``fwd``).

        ``conv_transpose2d`` of an N×C×H×W input with a C×(K/groups)×R×S weight gives N×K×Ho×Wo,
        ``Ho = (H-1)·stride - 2·padding + dilation·(R-1) + output_padding + 1``. It is the ``bwd_data``
        of the regular convolution returned here (input N×K×Ho×Wo, the same weight read as its
        K'=C × C'/groups=K/groups filters, output N×C×H×W); its input gradient is that convolution's
        ``fwd`` of the output gradient, its weight gradient the ``bwd_weight`` with the output gradient
        as input and the transposed convolution's input as output gradient. ``output_padding`` only
        adds rows/columns the regular convolution never reaches, so its output is H×W again exactly
        when ``output_padding < stride``; anything else raises ValueError.
        """
        stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
        output_padding = _pair(output_padding)
        if min(output_padding) < 0:
            raise ValueError(f"output_padding must be ≥ 0, got {output_padding}")
        ho, wo = ((size - 1) * st - 2 * pad + dil * (kernel - 1) + extra + 1 for size, st, pad, dil, kernel, extra
                  in zip((h, w), stride, padding, dilation, (r, s), output_padding))
        if ho < 1 or wo < 1:
            raise ValueError(f"transposed convolution output would be {ho}x{wo}")
        problem = cls(n, k, ho, wo, c, r, s, stride, padding, dilation, groups)
        if (problem.p, problem.q) != (h, w):  # output_padding ≥ stride: rows no input position reaches
            raise ValueError(f"output_padding {output_padding} must be smaller than the stride {stride}")
        return problem


ATTENTION_MASKS = ("none", "bool", "float")
ATTENTION_DIRECTIONS = ("fwd", "bwd")


@dataclasses.dataclass(frozen=True)
class AttentionProblem:
    """Scaled-dot-product attention of ``batch`` x ``heads`` sequences: queries L x E, keys S x E, values
    S x EV, output L x EV; ``mask`` says which attention mask is applied (``none``, ``bool``: excluded
    where false, ``float``: added to the scores), ``causal`` whether keys after the query row are
    excluded (top-left aligned). ``direction`` is ``fwd`` (output and row log-sum-exp) or ``bwd`` (the
    gradients of queries, keys and values)."""

    batch: int
    heads: int
    l: int  # noqa: E741 (torch's name for the query length)
    s: int
    e: int
    ev: int
    causal: bool = False
    mask: str = "none"
    direction: str = "fwd"
    dtype: str = "float32"

    kind: ClassVar[str] = "attention"

    def __post_init__(self) -> None:
        _check_positive("attention", self, ("batch", "heads", "l", "s", "e", "ev"))
        if self.mask not in ATTENTION_MASKS:
            raise ValueError(f"mask must be one of {', '.join(ATTENTION_MASKS)}, got {self.mask!r}")
        if self.causal and self.mask != "none":
            raise ValueError("a causal attention problem takes no mask")
        if self.direction not in ATTENTION_DIRECTIONS:
            raise ValueError(f"direction must be one of {', '.join(ATTENTION_DIRECTIONS)}, got {self.direction!r}")
        _check_dtype(self.dtype)

    @property
    def key(self) -> str:
        return (f"attention:b={self.batch},h={self.heads},l={self.l},s={self.s},e={self.e},ev={self.ev},"
                f"causal={int(self.causal)},mask={self.mask},dir={self.direction},dtype={self.dtype}")

    @classmethod
    def parse(cls, body: str) -> AttentionProblem:
        """Parse ``b=2,h=8,l=512,s=512,e=64[,ev=64,causal=0,mask=none,dir=fwd,dtype=float32]`` (``ev``
        defaults to ``e``)."""
        fields = _parse_fields(body)
        e = _int(fields, "e")
        problem = cls(batch=_int(fields, "b"), heads=_int(fields, "h"), l=_int(fields, "l"), s=_int(fields, "s"),
                      e=e, ev=_int(fields, "ev", e), causal=_flag(fields, "causal"),
                      mask=fields.pop("mask", "none"), direction=fields.pop("dir", "fwd"),
                      dtype=fields.pop("dtype", "float32"))
        _reject_unknown(fields, "attention")
        return problem

    @property
    def flops(self) -> int:
        """Multiply-adds x2 over the (query, key) pairs computed (causal: those on or below the diagonal):
        forward the two products (scores, P V); backward the scores and dP recomputed twice (for dQ and
        for dK/dV) and the three gradient products."""
        pairs = self.l * self.s
        if self.causal:
            pairs = sum(min(i + 1, self.s) for i in range(self.l))
        per_pair = self.e + self.ev if self.direction == "fwd" else 4 * self.e + 3 * self.ev
        return 2 * self.batch * self.heads * pairs * per_pair

    @property
    def bytes(self) -> int:
        per_head = self.l * self.e + self.s * self.e + self.s * self.ev + self.l * self.ev
        if self.direction == "bwd":
            per_head *= 2
        return self.batch * self.heads * per_head * DTYPES[self.dtype]

    def with_direction(self, direction: str) -> AttentionProblem:
        return dataclasses.replace(self, direction=direction)


Problem = Union[GemmProblem, ConvProblem, AttentionProblem]
PROBLEM_KINDS: dict[str, type] = {"gemm": GemmProblem, "conv": ConvProblem, "attention": AttentionProblem}


def problem_from_key(key: str) -> Problem:
    """Inverse of ``Problem.key``: ``problem_from_key(p.key) == p``. Raises ValueError with the reason."""
    kind, sep, body = key.partition(":")
    if not sep or kind not in PROBLEM_KINDS:
        raise ValueError(f"not a problem key: {key!r} (expected 'gemm:...', 'conv:...' or 'attention:...')")
    return PROBLEM_KINDS[kind].parse(body)
