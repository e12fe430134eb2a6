"""The CPU fallback: modes, counting, write-back of mutated arguments, and what never falls back."""

from __future__ import annotations

import warnings

import pytest
import torch

import tunecl.backend
from tunecl import config
from tunecl.backend import fallback
from tunecl.backend.ops import kernel_table
from tunecl.backend.ops.core import VIEW_KERNELS, VIEW_OPS


def _rare_op(x: torch.Tensor) -> torch.Tensor:
    return torch.polygamma(2, x)  # no OpenCL kernel for orders above 1: always the fallback


def test_warn_mode_warns_once_per_op_and_counts(fresh_stats):
    fallback._warned.discard("aten::polygamma.out")
    x = torch.arange(1.0, 6.0, device="opencl")
    with config.override(fallback="warn"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _rare_op(x)
        _rare_op(x)
    assert len([w for w in caught if "aten::polygamma.out" in str(w.message)]) == 1
    assert first.device.type == "opencl" and torch.equal(first.cpu(), torch.polygamma(2, x.cpu()))
    assert fresh_stats()["fallback_ops"] == {"aten::polygamma.out": 2}
    assert fresh_stats()["ops"]["aten::polygamma.out"] == 2


def test_silent_mode_and_error_mode():
    x = torch.arange(1.0, 4.0, device="opencl")
    with config.override(fallback="silent"), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(_rare_op(x).cpu(), torch.polygamma(2, x.cpu()))
    with config.override(fallback="error"), pytest.raises(fallback.FallbackError, match=r"aten::polygamma\.out"):
        _rare_op(x)
    with config.override(fallback="bogus"), pytest.raises(ValueError, match="TUNECL_FALLBACK"):
        _rare_op(x)


def test_fallback_writes_back_in_place_results_and_hidden_mutations():
    x = torch.arange(1.0, 7.0).reshape(2, 3)
    d = x.to("opencl")
    fallbacks = tunecl.backend.stats()["fallback_ops"].get("aten::polygamma.out", 0)
    with config.override(fallback="silent"):
        d[:, 1].polygamma_(2)  # an in-place op on a strided view, served by the fallback
        x[:, 1].polygamma_(2)
        assert torch.equal(d.cpu(), x)
        assert tunecl.backend.stats()["fallback_ops"]["aten::polygamma.out"] == fallbacks + 1
        # native_batch_norm updates running stats without declaring it: forced through the fallback
        inp = torch.randn(4, 3, 2)
        rm, rv = torch.zeros(3, device="opencl"), torch.ones(3, device="opencl")
        fallback.run_on_cpu(torch.ops.aten.native_batch_norm.default,
                            (inp.to("opencl"), None, None, rm, rv, True, 0.5, 1e-5), {})
        crm, crv = torch.zeros(3), torch.ones(3)
        torch.ops.aten.native_batch_norm(inp, None, None, crm, crv, True, 0.5, 1e-5)
    torch.testing.assert_close(rm.cpu(), crm)
    torch.testing.assert_close(rv.cpu(), crv)


def test_views_are_metadata_not_fallbacks(fresh_stats, strict):
    d = torch.arange(12.0, device="opencl")
    v = d.view(3, 4).t()[1:].unfold(0, 2, 1).as_strided((2, 2), (1, 2))
    assert v.untyped_storage().data_ptr() == d.untyped_storage().data_ptr()
    assert not fresh_stats()["fallback_ops"]
    assert "aten::view" not in fresh_stats()["ops"]   # (metadata: not counted as device work)
    assert torch.equal(v.cpu(), torch.arange(12.0).view(3, 4).t()[1:].unfold(0, 2, 1).as_strided((2, 2), (1, 2)))


def test_stats_and_reset(fresh_stats):
    torch.ones(3, device="opencl").add_(1)
    snapshot = fresh_stats()
    assert snapshot["ops"]["aten::add_.Tensor"] == 1
    assert set(snapshot) >= {"ops", "fallback_ops", "plan_sources", "plans", "memory"}
    tunecl.backend.reset_stats()
    assert fresh_stats()["ops"] == {}


def test_every_registered_overload_exists_and_resolves_to_our_kernel():
    for name in [*kernel_table(), *VIEW_KERNELS]:
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        table = torch._C._dispatch_dump_table(op.name())
        line = next(ln for ln in table.splitlines() if ln.startswith("PrivateUse1:"))
        assert "registered at" in line and "fallback" not in line, f"{name}: {line}"
    assert VIEW_OPS <= set(kernel_table()) | set(VIEW_KERNELS)


def test_autocast_falls_through(strict):
    a = torch.randn(4, 4, device="opencl")
    with torch.autocast("opencl", dtype=torch.float16):
        assert (a + a).dtype == torch.float32


FLOAT64_INSIDE = {
    "quantile": lambda x: torch.quantile(x, 0.3, dim=1),
    "nanquantile": lambda x: torch.nanquantile(x, torch.tensor([0.2, 0.7], device=x.device)),
    "renorm": lambda x: torch.renorm(x, 2, 0, 1.0),
    "linalg_lstsq": lambda x: torch.linalg.lstsq(x, x[:, :2] * 2 + 1).solution,
    "linalg_pinv": lambda x: torch.linalg.pinv(x),
    "pinverse": lambda x: torch.pinverse(x),
}


@pytest.mark.parametrize("name", sorted(FLOAT64_INSIDE))
def test_ops_making_float64_inside_run_on_the_cpu_with_their_gradients(name, fresh_stats):
    """Ops whose decomposition or derivative makes float64 tensors (the device stores none) run on the
    CPU as a whole, autograd included: results and float32 gradients as the CPU's, counted as fallbacks."""
    fn = FLOAT64_INSIDE[name]
    torch.manual_seed(0)
    x = torch.randn(5, 4, requires_grad=True)
    d = x.detach().to("opencl").requires_grad_(True)
    with config.override(fallback="silent"):
        expected, actual = fn(x), fn(d)
        (grad,) = torch.autograd.grad(expected.sum(), [x])
        (dgrad,) = torch.autograd.grad(actual.sum(), [d])
    assert actual.device.type == "opencl" and dgrad.device.type == "opencl" and dgrad.dtype == torch.float32
    torch.testing.assert_close(actual.cpu(), expected)
    torch.testing.assert_close(dgrad.cpu(), grad)
    assert sum(fresh_stats()["fallback_ops"].values()) >= 1


def test_matrix_rank_and_out_variants_of_float64_inside_ops(fresh_stats):
    x = torch.randn(5, 4)
    d = x.to("opencl")
    with config.override(fallback="silent"):
        assert torch.linalg.matrix_rank(d).item() == torch.linalg.matrix_rank(x).item()
        out = torch.empty(0, device="opencl")
        result = torch.quantile(d, 0.5, dim=0, out=out)
    assert result is out and out.shape == (4,)
    torch.testing.assert_close(out.cpu(), torch.quantile(x, 0.5, dim=0))
    assert fresh_stats()["fallback_ops"].get("aten::quantile.scalar_out") == 1


def test_batch_norm_of_an_empty_input_runs_on_the_device(strict):
    """batch_norm gives an empty input statistics of the CPU's accumulate type (float64); on opencl
    they are float32, and the result (input * weight[0] + bias[0]) keeps its gradients."""
    x = torch.randn(0, 3, device="opencl", requires_grad=True)
    w = torch.randn(3, device="opencl", requires_grad=True)
    b = torch.randn(3, device="opencl", requires_grad=True)
    y = torch.nn.functional.batch_norm(x, None, None, w, b, training=True)
    assert y.shape == (0, 3) and y.device.type == "opencl"
    gw, gb = torch.autograd.grad(y.sum(), [w, b])
    assert gw.cpu().tolist() == [0.0, 0.0, 0.0] and gb.cpu().tolist() == [0.0, 0.0, 0.0]
