"""The 18 torchvision CNNs, and the transformers, ConvNeXts and language models beyond them, train on the
opencl device with zero CPU fallback.

Two parts, sized for CI on PoCL:

- an op-coverage check: every net at its smallest input, eval forward and a training step with three
  Adam variants, dry-run through the backend's real dispatch (:mod:`tunecl.tools.coverage`: every
  adapter and ``Unsupported`` check runs, nothing is launched), must not reach the CPU fallback;
- a rotating real run: one cheap net per day trains for real under ``TUNECL_FALLBACK=error`` through
  ``tunecl validate`` (``TUNECL_TEST_NETS=name,name`` picks others).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os

import pytest
import tiny_nets
import torch
from torch import nn

import tunecl.backend
from tunecl.backend import counters, memory, state
from tunecl.tools import coverage
from tunecl.tools.coverage import BEYOND_CNNS, NETS, OPTIMIZERS, dry_run, walk


# the nets whose real training step (`tunecl validate --train`, batch 2, 32x32) took 20-35 s on a
# 2-core PoCL with a cold compile cache (7-9 s warm); the others of the 18 take longer
ROTATION = ("squeezenet1_0", "mobilenet_v3_small", "mobilenet_v2", "shufflenet_v2_x1_0", "efficientnet_b0",
            "mnasnet1_0")


def rotating_nets() -> list[str]:
    """``TUNECL_TEST_NETS`` (comma-separated), else one net of :data:`ROTATION` by the day of the year."""
    chosen = os.environ.get("TUNECL_TEST_NETS", "")
    if chosen:
        return [n.strip() for n in chosen.split(",") if n.strip()]
    day = datetime.date.today().timetuple().tm_yday
    return [ROTATION[day % len(ROTATION)]]


# -- the op-coverage check ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("net", list(NETS))
def test_every_op_of_the_net_has_a_device_kernel(net):
    result = walk(net, image_size=NETS[net])
    assert result.error is None, result.error
    assert not result.fallbacks, f"{net} would run on the CPU: " + "; ".join(
        f"{f.phase}: {f.op} x{f.calls} ({f.reason})" for f in result.fallbacks)
    assert list(result.ops) == ["eval", "train", *OPTIMIZERS]
    ops = result.all_ops
    assert ops["aten::convolution_overrideable"] and ops["aten::convolution_backward_overrideable"]
    assert result.ops["adam_fused"]["aten::_fused_adam_"] == 1
    assert result.launches > sum(ops.values()) // 2 and result.plans


# the ops that only the nets beyond the CNNs ask for, by phase, and which nets ask for them
BEYOND_CNN_OPS = {
    ("train", "aten::native_layer_norm_backward"): set(BEYOND_CNNS),
    ("eval", "aten::_native_multi_head_attention"): {"vit_b_16"},   # nn.MultiheadAttention's fast path
    ("train", "aten::_softmax_backward_data.out"): {"swin_t"},   # the others' attention: the fused kernels
    ("train", "aten::_scaled_dot_product_fused_attention_overrideable_backward"): {"vit_b_16", "hf:bert", "hf:gpt2"},
    ("train", "aten::embedding_dense_backward"): {"hf:bert", "hf:gpt2"},
}


@pytest.fixture
def fused_training(monkeypatch):
    """Attention that needs gradients trains on the fused kernels, as on a GPU, whatever this device is
    (a CPU device takes the math path: ``tunecl.kernels.attention.math_for_training``)."""
    from tunecl.kernels import attention

    monkeypatch.setattr(attention, "math_for_training", lambda *args: False)


@pytest.mark.slow
@pytest.mark.parametrize("net", list(BEYOND_CNNS))
def test_every_op_of_the_transformers_and_convnexts_has_a_device_kernel(net, fused_training):
    if net.startswith("hf:"):
        pytest.importorskip("transformers")
    result = walk(net, image_size=BEYOND_CNNS[net])
    assert result.error is None, result.error
    assert not result.fallbacks, f"{net} would run on the CPU: " + "; ".join(
        f"{f.phase}: {f.op} x{f.calls} ({f.reason})" for f in result.fallbacks)
    assert list(result.ops) == ["eval", "train", *OPTIMIZERS]
    for (phase, op), nets in BEYOND_CNN_OPS.items():
        assert (result.ops[phase].get(op, 0) > 0) == (net in nets), (phase, op)
    assert result.ops["adam_fused"]["aten::_fused_adam_"] == 1
    assert result.plans and all(key.startswith(("gemm:", "conv", "attention:")) for key in result.plans)
    if net.startswith("hf:"):
        assert result.input_shape == (2, BEYOND_CNNS[net])   # token ids
        assert "aten::convolution_overrideable" not in result.all_ops


@pytest.mark.slow
@pytest.mark.parametrize("route", ["device", "fused"])
@pytest.mark.parametrize("net,size", [("resnet18", 32), ("vit_b_16", 32), ("hf:bert", 8), ("hf:gpt2", 8)])
def test_tune_net_extracts_every_conv_gemm_and_attention_problem_a_training_step_runs(net, size, route,
                                                                                    monkeypatch):
    """``tunecl tune --net`` tunes what the backend will plan: the problems extracted on the meta device
    (convs from module hooks, GEMMs from the dispatched matrix products: linear layers; the fused
    attention's problems, both directions, where training takes the fused kernels) are exactly those a
    dry run of the net's eval forward and training step plans. ``route``: this device's own choice for
    attention that needs gradients (the math path on a CPU device), or the fused kernels as on a GPU."""
    if net.startswith("hf:"):
        pytest.importorskip("transformers")
    from tunecl.kernels import attention
    from tunecl.search.workload import net_problems

    if route == "fused":
        monkeypatch.setattr(attention, "math_for_training", lambda *args: False)
    device_type = state.get().device.fingerprint.device_type
    training = {p.key for p in net_problems(net, batch=2, image_size=size, train=True, device_type=device_type)}
    inference = {p.key for p in net_problems(net, batch=2, image_size=size, device_type=device_type)}
    planned = set(walk(net, image_size=size, optimizers=()).plans)
    assert training | inference == planned
    assert any(key.startswith("gemm:") for key in inference)
    directions = {phase: {key.rsplit(",dir=", 1)[1] for key in keys if key.startswith("attention:")}
                  for phase, keys in (("training", training), ("inference", inference))}
    math_training = route == "device" and device_type == "cpu"
    if net == "resnet18":
        assert directions == {"training": set(), "inference": set()} and inference < training
    elif math_training:   # the math path's products instead
        assert directions == {"training": set(), "inference": {"fwd,dtype=float32"}}
        assert any(key.startswith("gemm:") and ",batch=" in key and "batch=1," not in key for key in training)
    else:
        assert directions == {"training": {"fwd,dtype=float32", "bwd,dtype=float32"},
                              "inference": {"fwd,dtype=float32"}} and inference < training


# -- the check sees what falls back, and only what a real run asks ---------------------------------------
def test_the_walk_reports_an_op_that_has_no_kernel(strict):
    """special_bessel_j0 is registered for no backend key of ours: the fallback serves it."""
    result = walk("tiny_nets:bessel_net", image_size=4, optimizers=("adam",))
    assert result.error is None   # under TUNECL_FALLBACK=error a dry run records and goes on
    reasons = {(f.phase, f.op, f.reason) for f in result.fallbacks}
    assert reasons == {(phase, "aten::special_bessel_j0.out", "no OpenCL kernel is registered")
                       for phase in ("eval", "train")}
    assert result.fallback_ops == ["aten::special_bessel_j0.out"]


class _Refused(nn.Module):
    """Ops with kernels that refuse these cases: a transposed convolution whose output padding is not below
    its stride and max-pooling of integers (both adapters raise ``Unsupported``); the walk must see both,
    forward and backward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose2d(3, 4, 2, dilation=2, output_padding=1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        pooled = nn.functional.max_pool2d(y.int(), 2).float()
        return self.fc(y.mean((2, 3)) + pooled.mean((2, 3)))


def test_the_walk_reports_calls_an_adapter_or_kernel_family_refuses():
    result = walk(_Refused, image_size=5, optimizers=())
    assert result.error is None
    found = {(f.phase, f.op, f.reason) for f in result.fallbacks}
    refused = "output_padding (1, 1) must be smaller than the stride (1, 1)"
    assert {("eval", "aten::convolution_overrideable", refused),
            ("train", "aten::convolution_backward_overrideable", refused),
            ("eval", "aten::max_pool2d_with_indices.out",
             "a torch.int32 tensor on opencl:0 (float32/float16 opencl tensors only)")} <= found


def _real_phases(model: nn.Module, x: torch.Tensor) -> dict[str, dict[str, int]]:
    ops: dict[str, dict[str, int]] = {}

    @contextlib.contextmanager
    def record(phase: str):
        before = collections.Counter(counters.op_counts)
        yield
        ops[phase] = dict(sorted((collections.Counter(counters.op_counts) - before).items()))

    coverage.run_phases(model, x, OPTIMIZERS, record)
    return ops


def test_a_dry_run_asks_the_backend_for_exactly_what_a_real_run_asks(strict, fresh_stats, fresh_plans):
    real = _real_phases(tiny_nets.tiny_cnn().to("opencl"), torch.randn(2, 3, 16, 16))
    assert not fresh_stats()["fallback_ops"]
    dry = walk(tiny_nets.tiny_cnn, image_size=16)
    assert dry.ops == real
    assert dry.transfers == {"host_to_device": 3, "device_to_host": 2}  # x twice, labels; output, loss


def test_a_dry_run_allocates_and_launches_nothing_and_leaves_no_trace(fresh_stats):
    torch.ones(1, device="opencl").add_(1).cpu()   # the real device state exists before
    real_state = state.get()
    compiled = len(real_state.pointwise.cache)
    before_stats, before_plans = fresh_stats(), dict(counters.plans)
    with dry_run() as run:
        buffers = memory.allocator.counts["buffers_created"]
        result = walk("resnet18", image_size=32, run=run)
        assert memory.allocator.counts["buffers_created"] == buffers
        assert state.get() is not real_state
    assert result.error is None and result.launches > 1000
    assert state.get() is real_state and len(real_state.pointwise.cache) == compiled
    after = fresh_stats()
    assert (after["ops"], after["fallback_ops"], after["plans"]) == (
        before_stats["ops"], before_stats["fallback_ops"], before_stats["plans"])
    assert after["memory"]["peak_allocated_bytes"] == before_stats["memory"]["peak_allocated_bytes"]
    assert dict(counters.plans) == before_plans
    assert (torch.ones(3, device="opencl") * 2).sum().item() == 6   # the real device still works


def test_pointwise_launch_caches_never_cross_a_dry_run():
    """The backend's per-signature pointwise launch cache once lived in a module global: a dry run then
    launched the real kernels it held on fake buffers (a segfault), and a real run after a dry run would
    have launched the dry run's do-nothing kernels."""
    a, b = torch.arange(6.0, device="opencl"), torch.ones(6, device="opencl")
    assert (a + b).cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]   # the signature is now cached
    with dry_run() as run:
        x, y = torch.empty(6, device="opencl"), torch.empty(6, device="opencl")
        launches = run.launches
        z = x + y
        assert run.launches == launches + 1   # the dry family's kernel, counted, not the real one
        del x, y, z
    c = torch.arange(6.0, device="opencl") * 2
    assert (c + b).cpu().tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]   # the real kernels again


def test_device_tables_made_in_a_dry_run_are_not_kept():
    """A table an op builds and keeps on the device (here reflection padding's index map) has no buffer when a
    dry run builds it: kept, it would outlive the dry run and reach real kernels after it."""
    memory.empty_cache()   # else the dry run may hand out a cached (real) buffer
    padding = (2, 1, 3, 0)   # a geometry no other test pads by: its map is built in the dry run
    with dry_run():
        y = nn.functional.pad(torch.empty(1, 2, 5, 7, device="opencl"), padding, mode="reflect")
        del y
    x = torch.randn(1, 2, 5, 7)
    assert torch.equal(nn.functional.pad(x.to("opencl"), padding, mode="reflect").cpu(),
                       nn.functional.pad(x, padding, mode="reflect"))


def test_a_tensor_must_not_outlive_its_dry_run():
    memory.empty_cache()   # else the dry run may hand out a cached (real) buffer, which is harmless
    with pytest.raises(RuntimeError, match=r"1 storage\(s\) made in a dry run outlived it"), dry_run():
        kept = torch.empty(16, device="opencl")
    del kept
    with dry_run(), pytest.raises(RuntimeError, match="already active"), dry_run():
        pass


# -- the rotating real run -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("net", rotating_nets())
def test_rotating_net_trains_on_the_device_without_fallback(net):
    """A real training step (``tunecl validate --train``) with ``TUNECL_FALLBACK=error``: it must
    finish with nothing on the CPU, and ask for no op the dry walk of the same net missed. Numerical
    agreement is validate's own verdict, not asserted here."""
    from tunecl import config
    from tunecl.tools.validate import validate_net

    size = NETS.get(net, 32)
    with config.override(fallback="error"):
        report = validate_net(net, train=True, batch=2, image_size=size)
    assert report.error is None, report.error
    assert not report.fallback_ops
    assert {"output", "loss", "grad", "param"} <= {c.kind for c in report.checks}   # it ran to the end
    real_ops = set(tunecl.backend.stats()["ops"])
    dry = walk(net, image_size=size, optimizers=("adam",))
    assert dry.error is None and not dry.fallbacks
    assert real_ops <= set(dry.all_ops), f"ops of the real run the dry walk missed: {real_ops - set(dry.all_ops)}"
