"""The opencl device as torch sees it: registration, torch.opencl, tensor and module helpers."""

from __future__ import annotations

import torch

import tunecl.backend
from tunecl.backend import state


def test_register_is_idempotent():
    tunecl.backend.register()
    tunecl.backend.register()
    assert torch._C._get_privateuse1_backend_name() == "opencl"


def test_device_module():
    assert torch.opencl.is_available()
    assert torch.opencl.device_count() == 1
    assert torch.opencl.current_device() == 0
    assert torch.opencl.get_device_name() == state.get().device.name
    assert torch.opencl.get_device_properties()["name"] == state.get().device.name
    torch.opencl.synchronize()
    torch.opencl.set_device(0)
    with torch.opencl.device(0):
        pass
    torch.opencl.manual_seed(11)
    first = torch.randn(3, device="opencl").cpu()
    torch.opencl.manual_seed_all(11)
    assert torch.equal(torch.randn(3, device="opencl").cpu(), first)
    state_ = torch.opencl.get_rng_state()
    a = torch.rand(2, device="opencl").cpu()
    torch.opencl.set_rng_state(state_)
    assert torch.equal(torch.rand(2, device="opencl").cpu(), a)


def test_tensor_and_module_helpers():
    x = torch.ones(2).opencl()
    assert x.is_opencl and x.device == torch.device("opencl:0")
    m = torch.nn.Linear(2, 2).opencl()
    assert m.weight.is_opencl
    assert torch.accelerator.current_accelerator().type == "opencl"


def test_creation_ops(strict):
    dev = torch.device("opencl")
    assert torch.zeros(2, 3, device=dev).cpu().eq(0).all()
    assert torch.ones(4, dtype=torch.int64, device=dev).cpu().tolist() == [1, 1, 1, 1]
    assert torch.full((2,), 2.5, device=dev).cpu().tolist() == [2.5, 2.5]
    assert torch.full((2,), True, device=dev).cpu().tolist() == [True, True]
    assert torch.arange(5, device=dev).cpu().tolist() == [0, 1, 2, 3, 4]
    assert torch.arange(1.0, 2.0, 0.25, device=dev).cpu().tolist() == [1.0, 1.25, 1.5, 1.75]
    assert torch.arange(10, 0, -3, device=dev).cpu().tolist() == [10, 7, 4, 1]
    assert torch.tensor([1.5, 2.5], device=dev).cpu().tolist() == [1.5, 2.5]
    assert torch.zeros_like(torch.empty(2, 2, device=dev)).cpu().sum().item() == 0
    x = torch.empty(3, device=dev).fill_(4.0)
    assert x.cpu().tolist() == [4.0, 4.0, 4.0]
    x.zero_()
    assert x.cpu().tolist() == [0.0, 0.0, 0.0]
    x.fill_(torch.tensor(2.0, device=dev))
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]
    assert torch.empty(2, 3, 4, 5, device=dev, memory_format=torch.channels_last).stride() == (60, 1, 15, 3)
    assert x.sum().item() == 6.0 and isinstance(x.sum().item(), float)
    assert torch.arange(3, device=dev).sum().item() == 3


def test_opencl0_is_the_device_tunecl_device_selects():
    from tunecl import runtime

    assert state.get().device is runtime.select_device()
    assert state.get().device.entry.index == runtime.resolve().index


def test_linspace_and_eye(strict):
    dev = torch.device("opencl")
    for args in ((0.0, 1.0, 5), (-3.0, 7.0, 11), (2.0, 2.0, 1), (0.0, 1.0, 1000)):
        torch.testing.assert_close(torch.linspace(*args, device=dev).cpu(), torch.linspace(*args))
    assert torch.equal(torch.eye(3, device=dev).cpu(), torch.eye(3))
    assert torch.equal(torch.eye(2, 4, dtype=torch.int64, device=dev).cpu(), torch.eye(2, 4, dtype=torch.int64))
