"""torch's ``_foreach_*`` ops on opencl: multi-tensor kernels (one launch per ``slots`` tensors) where every
tensor is contiguous float32, torch's per-tensor loop otherwise; both against CPU torch."""

from __future__ import annotations

import pytest
import torch

from tunecl import config
from tunecl.backend import state
from tunecl.backend.ops import foreach
from tunecl.backend.ops.foreach import KERNELS
from tunecl.kernels.ops.optim import MAX_ITEMS, SLOTS, parameter_bytes, slots_for
from tunecl.profiling import KernelProfile

# shapes of one list: odd sizes, a scalar tensor, an empty one, one past a slot's work-items, more than
# SLOTS tensors so a call takes several launches
SHAPES = [(3, 5), (), (7,), (0,), (2, 1, 4), (MAX_ITEMS + 3,), (1,), (4, 4), (9,), (1, 2, 3), (5,)]


def _lists(count: int, positive: bool = False, shapes=SHAPES) -> list[list[torch.Tensor]]:
    def make(shape):
        t = torch.randn(shape)
        return t.abs() + 0.5 if positive else t
    return [[make(s) for s in shapes] for _ in range(count)]


def _to(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to("opencl") for t in tensors]


# (call, number of tensor lists, positive inputs) - each call gets its lists (and for in-place ones
# mutates the first); numbers are Scalars and ScalarLists
N = len(SHAPES)
CASES = {
    "add_.Scalar": (lambda a: torch._foreach_add_(a[0], 0.25), 1, False),
    "add.ScalarList": (lambda a: torch._foreach_add(a[0], [0.5 * i for i in range(N)]), 1, False),
    "add_.List alpha": (lambda a: torch._foreach_add_(a[0], a[1], alpha=-0.3), 2, False),
    "sub.List": (lambda a: torch._foreach_sub(a[0], a[1]), 2, False),
    "sub_.Scalar": (lambda a: torch._foreach_sub_(a[0], 3), 1, False),
    "mul_.Scalar": (lambda a: torch._foreach_mul_(a[0], 0.9), 1, False),
    "mul.List": (lambda a: torch._foreach_mul(a[0], a[1]), 2, False),
    "mul_.ScalarList": (lambda a: torch._foreach_mul_(a[0], [i - 4 for i in range(N)]), 1, False),
    "div_.ScalarList": (lambda a: torch._foreach_div_(a[0], [1.0 + i for i in range(N)]), 1, False),
    "div.List": (lambda a: torch._foreach_div(a[0], a[1]), 2, True),
    "div_.Scalar": (lambda a: torch._foreach_div_(a[0], 7.0), 1, False),
    "maximum_.List": (lambda a: torch._foreach_maximum_(a[0], a[1]), 2, False),
    "minimum.List": (lambda a: torch._foreach_minimum(a[0], a[1]), 2, False),
    "clamp_min_.Scalar": (lambda a: torch._foreach_clamp_min_(a[0], 0.1), 1, False),
    "clamp_max.Scalar": (lambda a: torch._foreach_clamp_max(a[0], -0.1), 1, False),
    "addcmul_.Scalar": (lambda a: torch._foreach_addcmul_(a[0], a[1], a[2], value=0.001), 3, False),
    "addcmul.ScalarList": (lambda a: torch._foreach_addcmul(a[0], a[1], a[2], [0.1 * i for i in range(N)]), 3, False),
    "addcdiv_.ScalarList": (lambda a: torch._foreach_addcdiv_(a[0], a[1], a[2], [-0.01 * i for i in range(N)]),
                            3, True),
    "addcdiv.Scalar": (lambda a: torch._foreach_addcdiv(a[0], a[1], a[2], value=2), 3, True),
    "lerp_.Scalar": (lambda a: torch._foreach_lerp_(a[0], a[1], 0.1), 2, False),
    "lerp.Scalar high weight": (lambda a: torch._foreach_lerp(a[0], a[1], 0.75), 2, False),
    "lerp_.List": (lambda a: torch._foreach_lerp_(a[0], a[1], a[2]), 3, False),
    "sqrt": (lambda a: torch._foreach_sqrt(a[0]), 1, True),
    "sqrt_": (lambda a: torch._foreach_sqrt_(a[0]), 1, True),
    "neg_": (lambda a: torch._foreach_neg_(a[0]), 1, False),
    "abs": (lambda a: torch._foreach_abs(a[0]), 1, False),
    "exp_": (lambda a: torch._foreach_exp_(a[0]), 1, False),
    "log": (lambda a: torch._foreach_log(a[0]), 1, True),
    "reciprocal_": (lambda a: torch._foreach_reciprocal_(a[0]), 1, True),
    "zero_": (lambda a: torch._foreach_zero_(a[0]), 1, False),
    "copy_": (lambda a: torch._foreach_copy_(a[0], a[1]), 2, False),
    "pow.ScalarAndTensor": (lambda a: torch._foreach_pow(0.9, a[0]), 1, False),
}


def _check(got, expected):
    assert (got is None) == (expected is None)
    if expected is not None:
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.device.type == "opencl" and g.dtype == e.dtype and g.shape == e.shape
            torch.testing.assert_close(g.cpu(), e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("items, slots", [("device", SLOTS), ("strided", SLOTS), ("device", 32), ("strided", 3)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_multi_tensor_path_matches_cpu_in_few_launches(name, items, slots, strict, monkeypatch):
    # "device": this device's work-items per slot (on CPU devices up to one per element); "strided": few
    # work-items per slot, each striding over many elements (the GPU layout); ``slots`` tensors per launch
    # (8 by default, 32 where the device's argument bytes allow: one launch for these 11 tensors)
    if items == "strided":
        monkeypatch.setattr(state.get().optim, "items", 64)
    monkeypatch.setattr(state.get().optim, "slots", slots)
    monkeypatch.setattr(foreach, "COPY_KERNELS", True)   # (by default not on CPU devices)
    call, lists, positive = CASES[name]
    cpu = _lists(lists, positive)
    dev = [_to(tensors) for tensors in cpu]
    expected = call(cpu)
    with KernelProfile() as profile:
        got = call(dev)
        torch.opencl.synchronize()
        launches = {row.name: row.launches for row in profile.summary()}
    _check(got, expected)
    for d, c in zip(dev, cpu):   # in-place calls wrote the first list; the others changed nothing
        _check(d, c)
    assert launches == {"foreach_map": -(-N // slots)}, launches


def test_every_registered_overload_is_a_real_foreach_op_and_covered_here():
    covered = {name.split(" ")[0] for name in CASES}
    for name in KERNELS:
        base, _, overload = name.partition(".")
        assert hasattr(getattr(torch.ops.aten, base), overload or "default"), name
    # every op family registered has a case (in-place or not, some overload)
    families = {name.partition(".")[0].removeprefix("_foreach_").rstrip("_") for name in KERNELS}
    assert families == {name.partition(".")[0].rstrip("_") for name in covered}


def _generic_cases():
    """Calls the multi-tensor path must leave to torch's per-tensor loop (on the device)."""
    base = torch.randn(6, 8)
    yield "non-contiguous", [base.t(), torch.randn(3)], [torch.randn(8, 6), torch.randn(3)]
    yield "broadcast other", [torch.randn(4, 3)], [torch.randn(3)]
    yield "float16", [torch.randn(5).half()], [torch.randn(5).half()]
    yield "int64", [torch.arange(6)], [torch.arange(6)]
    yield "mixed dtypes", [torch.randn(5)], [torch.randn(5).half()]


@pytest.mark.parametrize("case", list(_generic_cases()), ids=lambda c: c[0])
def test_other_calls_run_the_per_tensor_ops_and_still_match_cpu(case, strict):
    _, selves, others = case
    for call in (lambda a, b: torch._foreach_add(a, b, alpha=2), lambda a, b: torch._foreach_mul_(a, b)):
        cpu_a, cpu_b = [t.clone() for t in selves], [t.clone() for t in others]
        dev_a, dev_b = _to(selves), _to(others)
        expected = call(cpu_a, cpu_b)
        got = call(dev_a, dev_b)
        _check(got, expected)
        _check(dev_a, cpu_a)


def test_lists_of_0_dim_tensors_broadcast_in_one_launch_per_slots(strict):
    """A capturable Adam divides by bias corrections made from its device step counts: one 0-dim tensor
    per parameter."""
    cpu = _lists(1)[0]
    divisors = [torch.rand(()) + 0.5 for _ in SHAPES]
    dev, dev_divisors = _to(cpu), _to(divisors)
    with KernelProfile() as profile:
        got = torch._foreach_div(dev, dev_divisors)
        torch._foreach_mul_(dev, dev_divisors)
        torch.opencl.synchronize()
        launches = {row.name: row.launches for row in profile.summary()}
    _check(got, torch._foreach_div(cpu, divisors))
    torch._foreach_mul_(cpu, divisors)
    _check(dev, cpu)
    assert launches == {"foreach_map": 2 * -(-N // state.get().optim.slots)}, launches


@pytest.mark.parametrize("kernels", [True, False])
def test_copies_run_as_kernels_or_buffer_copies_as_set(kernels, strict, monkeypatch):
    monkeypatch.setattr(foreach, "COPY_KERNELS", kernels)
    sources = [torch.randn(s) for s in ((3, 5), (7,), (2, 2))]
    got, given = _to([torch.zeros_like(t) for t in sources]), _to(sources)
    with KernelProfile() as profile:
        torch._foreach_copy_(got, given)
        torch.opencl.synchronize()
        launches = {row.name: row.launches for row in profile.summary()}
    _check(got, sources)
    assert launches == ({"foreach_map": 1} if kernels else {"copy device→device": 3}), launches


def test_int64_counts_add_in_one_launch_per_slots(strict):
    """Batch norms' step counts (0-dim int64), grouped by a compiled graph: odd sizes, an empty tensor (left
    out), a view at an offset, more than a launch's slots, a negative increment."""
    base = torch.arange(10, dtype=torch.int64) * 7
    cpu = [torch.tensor(k, dtype=torch.int64) for k in range(2 * SLOTS + 3)]
    cpu += [torch.zeros(0, dtype=torch.int64), torch.arange(5, dtype=torch.int64) - 2]
    dev = _to(cpu) + [base.to("opencl")[3:8]]
    cpu.append(base[3:8].clone())
    for value in (1, -3):
        with KernelProfile() as profile:
            torch._foreach_add_(dev, value)
            torch.opencl.synchronize()
            launches = {row.name: row.launches for row in profile.summary()}
        torch._foreach_add_(cpu, value)
        _check(dev, cpu)
        assert launches == {"foreach_add_long": -(-(len(cpu) - 1) // state.get().optim.slots)}, launches


@pytest.mark.parametrize("case", ["float increment", "one storage twice", "strided"])
def test_other_int64_adds_run_one_by_one_and_match_cpu(case, strict):
    counts = [torch.tensor(3, dtype=torch.int64), torch.arange(6, dtype=torch.int64).reshape(2, 3)]
    dev = _to(counts)
    if case == "one storage twice":   # each added to as often as it is listed
        dev, counts = [dev[0], dev[0], dev[1]], [counts[0], counts[0], counts[1]]
    if case == "strided":
        dev, counts = [dev[0], dev[1].t()], [counts[0], counts[1].t()]
    if case == "float increment":   # torch's error, as on the CPU
        for tensors in (counts, dev):
            with pytest.raises(RuntimeError, match="can't be cast"):
                torch._foreach_add_(tensors, 2.5)
        return
    with KernelProfile() as profile:
        torch._foreach_add_(dev, 2)
        torch.opencl.synchronize()
        launches = {row.name for row in profile.summary()}
    torch._foreach_add_(counts, 2)
    _check(dev, counts)
    assert "foreach_add_long" not in launches, launches


def test_copies_of_other_dtypes_and_broadcasts_run_one_by_one_and_match_cpu(strict):
    destinations = [torch.zeros(5), torch.zeros(3, dtype=torch.int64), torch.zeros(2, 4), torch.zeros(4).half()]
    sources = [torch.randn(5), torch.tensor([4, -1, 7]), torch.randn(4), torch.randn(4)]
    got = _to(destinations)
    torch._foreach_copy_(got, _to(sources))
    torch._foreach_copy_(destinations, sources)
    _check(got, destinations)


def test_overlapping_views_get_torchs_error_not_a_kernel_result(strict):
    """a[k] and b[k] views of one storage at different offsets: the call runs the per-tensor op, which
    refuses the partial overlap as it does on the CPU, instead of the multi-tensor kernel."""
    for device in ("cpu", "opencl"):
        t = torch.arange(12, dtype=torch.float32).to(device)
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            torch._foreach_add_([t[2:8]], [t[0:6]])
    # the same tensor as self and other is fine for the kernel
    a = torch.randn(5)
    d = a.to("opencl")
    torch._foreach_addcmul_([d], [d], [d], value=0.5)
    torch.testing.assert_close(d.cpu(), a + 0.5 * a * a)


@pytest.mark.parametrize("name, make", [
    ("adam", lambda p: torch.optim.Adam(p, lr=1e-2)),
    ("adamw amsgrad", lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True)),
    ("sgd nesterov", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("rmsprop", lambda p: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5)),
    ("adagrad", lambda p: torch.optim.Adagrad(p, lr=1e-2)),
])
def test_default_foreach_optimizers_match_cpu_and_launch_per_slots(name, make, strict):
    torch.manual_seed(0)
    params = [torch.randn(s) for s in SHAPES if s != (0,)]
    grads = [[torch.randn_like(p) for p in params] for _ in range(3)]
    runs = {}
    for device in ("cpu", "opencl"):
        ps = [p.clone().to(device).requires_grad_() for p in params]
        opt = make(ps)
        assert opt.defaults.get("foreach") is None   # torch picks foreach for opencl tensors itself
        for index, step in enumerate(grads):
            for p, g in zip(ps, step):
                p.grad = g.to(device)
            if index == 0:   # (the first step also creates the optimizer's state)
                opt.step()
                continue
            with KernelProfile() as profile:
                opt.step()
                launches = [(row.name, row.launches) for row in profile.summary()]
        runs[device] = ([p.detach().cpu() for p in ps], launches)
    for got, expected in zip(runs["opencl"][0], runs["cpu"][0]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # a handful of multi-tensor launches per step (at most 10 foreach calls), not several per parameter
    launches = runs["opencl"][1]
    assert [name for name, _ in launches] == ["foreach_map"] and launches[0][1] <= 10 * -(-len(params) // SLOTS)


def test_slots_follow_the_setting_or_the_devices_argument_bytes():
    class Device:
        def __init__(self, limit):
            self.cl_device = type("ClDevice", (), {"max_parameter_size": limit})()

    # OpenCL's guaranteed minimum (1024 bytes, PoCL's) takes 8; NVIDIA's 4352 take 32
    assert parameter_bytes(8) <= 1024 < parameter_bytes(16) and parameter_bytes(32) <= 4352
    assert [slots_for(Device(limit), None) for limit in (256, 1024, 2048, 4352, 1 << 20)] == [8, 8, 16, 32, 32]
    assert slots_for(Device(1024), 24) == 24 and slots_for(Device(4352), 8) == 8   # a setting wins
    with pytest.raises(ValueError, match="one of 1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, not 12"):
        slots_for(Device(4352), 12)
    # the backend's: the setting's, or at "auto" (also when TUNECL_OPTIM_SLOTS is unset) the device's
    backend = state.get()
    assert backend.optim.slots == slots_for(backend.device, config.get().optim_slots)
    assert config.Config.from_env({}).optim_slots is None
