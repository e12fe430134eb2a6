"""Dtypes the device does not compute: stored with ops on the counted CPU fallback, or refused clearly."""

from __future__ import annotations

import pytest
import torch

import tunecl.backend
from tunecl import config
from tunecl.backend.dtypes import UnsupportedDtypeError

REFUSED = {
    torch.float64: "use float32", torch.complex128: "use complex64", torch.complex32: "use complex64",
    torch.uint16: "use int32 or int64", torch.uint32: "use int32 or int64", torch.uint64: "use int32 or int64",
    torch.float8_e4m3fn: "use float16 or float32", torch.float8_e5m2: "use float16 or float32",
}
STORED = [torch.bfloat16, torch.complex64]   # no kernels: ops take the CPU fallback


@pytest.mark.parametrize("dtype", REFUSED, ids=str)
def test_refused_dtypes_name_themselves_and_what_to_use(dtype):
    name = str(dtype).removeprefix("torch.")
    message = f"{name} is not supported on the OpenCL device; {REFUSED[dtype]}"
    host = torch.zeros(3).to(dtype)
    for make in (lambda: host.to("opencl"), lambda: torch.zeros(3, dtype=dtype, device="opencl"),
                 lambda: torch.empty(2, dtype=dtype, device="opencl"),
                 lambda: torch.ones(2, device="opencl").to(dtype)):
        with pytest.raises(UnsupportedDtypeError, match=message):
            make()


def _sample(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(3, 4)
    return torch.complex(x, torch.randn(3, 4)) if dtype.is_complex else x.to(dtype)


@pytest.mark.parametrize("dtype", STORED, ids=str)
def test_stored_dtypes_create_copy_and_print(dtype):
    x = _sample(dtype)
    d = x.to("opencl")
    assert d.dtype == dtype and torch.equal(d.cpu(), x)
    assert torch.equal(d[:, 1::2].cpu(), x[:, 1::2])                     # strided download
    assert torch.equal(d.t().contiguous().cpu(), x.t().contiguous())     # device→device with strides
    e = torch.zeros(3, 4, dtype=dtype, device="opencl")
    e[:, ::2] = x[:, ::2].to("opencl")                                    # strided write into a view
    expected = torch.zeros(3, 4, dtype=dtype)
    expected[:, ::2] = x[:, ::2]
    assert torch.equal(e.cpu(), expected)
    assert "device='opencl:0'" in repr(d) and repr(x).split("]")[0] in repr(d)   # the same values printed
    assert d.float().dtype == torch.float32 if not dtype.is_complex else d.real.dtype == torch.float32


@pytest.mark.parametrize("dtype", STORED, ids=str)
def test_stored_dtypes_compute_on_the_counted_fallback(dtype, fresh_stats):
    x, y = _sample(dtype), _sample(dtype)
    d, e = x.to("opencl"), y.to("opencl")
    with config.override(fallback="silent"):
        results = {
            "add": (d + e, x + y), "mul": (d * 2, x * 2), "sum": (d.sum(0), x.sum(0)), "abs": (d.abs(), x.abs()),
            "full": (torch.full((2,), 1.5, dtype=dtype, device="opencl"), torch.full((2,), 1.5, dtype=dtype)),
            "fill_": (torch.empty(2, dtype=dtype, device="opencl").fill_(2.5),
                      torch.empty(2, dtype=dtype).fill_(2.5)),
            "zero_": (d.clone().zero_(), x.clone().zero_()),
        }
        if dtype.is_complex:
            results["conj"] = (d.conj() * 1, x.conj() * 1)
            results["real"] = (d.real.clone(), x.real.clone())
    for name, (got, expected) in results.items():
        assert got.device.type == "opencl" and got.dtype == expected.dtype, name
        torch.testing.assert_close(got.cpu(), expected, msg=name)
    assert fresh_stats()["fallback_ops"], "these dtypes have no kernels: their ops are counted fallbacks"
    with config.override(fallback="error"), pytest.raises(tunecl.backend.FallbackError):
        d + e


_X = torch.randn(3, 4)
OUT_DTYPE_CASES = {
    "gelu to bool": lambda d: torch._C._nn.gelu(_X.to(d), out=torch.empty(3, 4, dtype=torch.bool, device=d)),
    "add to long": lambda d: torch.add(_X.to(d), _X.to(d), out=torch.empty(3, 4, dtype=torch.long, device=d)),
    "exp to int32": lambda d: torch.exp(_X.to(d), out=torch.empty(3, 4, dtype=torch.int32, device=d)),
    "amax to long": lambda d: torch.amax(_X.to(d), 0, out=torch.empty(4, dtype=torch.long, device=d)),
    "add to float16": lambda d: torch.add(_X.to(d), 1, out=torch.empty(3, 4, dtype=torch.float16, device=d)),
    "eq to float": lambda d: torch.eq(_X.to(d), 0, out=torch.empty(3, 4, device=d)),
    "long + 1.5 to float": lambda d: torch.add(torch.ones(3, dtype=torch.long, device=d), 1.5,
                                               out=torch.empty(3, device=d)),
}


@pytest.mark.parametrize("case", sorted(OUT_DTYPE_CASES))
def test_out_dtype_is_checked_as_torch_does(case):
    """An out= tensor of a dtype the result cannot be cast to (or, for some ops, of another dtype than
    the input's) is refused as on the CPU; the casts torch allows compute as there."""
    fn = OUT_DTYPE_CASES[case]
    try:
        expected = fn("cpu")
    except RuntimeError:
        with pytest.raises(RuntimeError):
            fn("opencl")
        return
    with config.override(fallback="silent"):
        actual = fn("opencl")
    torch.testing.assert_close(actual.cpu(), expected)
