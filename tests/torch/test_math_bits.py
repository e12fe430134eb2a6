"""Lazy conjugate and negative views (``x.conj()`` of a complex tensor, ``x.conj().imag``) on the device:
copies apply the bit (they used to recurse through ``_copy_from`` until the C++ stack overflowed:
``torch.fft.hfft`` killed the process), and the CPU fallback sees the same values the CPU would."""

from __future__ import annotations

import torch


def _complex(*shape: int) -> torch.Tensor:
    return torch.complex(torch.randn(shape), torch.randn(shape))


def test_hfft_of_a_device_tensor_matches_the_cpu():
    x = torch.randn(4, 6)
    got = torch.fft.hfft(x.to("opencl"))
    assert got.device.type == "opencl"
    torch.testing.assert_close(got.cpu(), torch.fft.hfft(x))


def test_clone_and_copies_of_a_conjugate_view():
    c = _complex(3, 5)
    d = c.to("opencl")
    torch.testing.assert_close(d.conj().clone().cpu(), c.conj().resolve_conj())
    torch.testing.assert_close(d.conj().resolve_conj().cpu(), c.conj().resolve_conj())
    torch.testing.assert_close(d.conj().cpu(), c.conj().resolve_conj())
    assert torch.equal(c.conj().to("opencl").cpu(), c.conj().resolve_conj())
    into = torch.zeros(3, 5, dtype=torch.complex64, device="opencl")
    into.conj().copy_(c)          # writing through a conjugate view stores the conjugate
    torch.testing.assert_close(into.cpu(), c.conj().resolve_conj())


def test_negative_views():
    c = _complex(4, 2)
    d = c.to("opencl")
    imag = d.conj().imag          # a real view with the negative bit
    assert imag.is_neg()
    torch.testing.assert_close(imag.clone().cpu(), -c.imag)
    torch.testing.assert_close(imag.cpu(), -c.imag)
    x = torch.randn(5)
    torch.testing.assert_close(torch._neg_view(x.to("opencl")).clone().cpu(), -x)


def test_the_fallback_computes_on_the_values_of_a_view():
    c = _complex(3, 4)
    for op in (lambda t: t.conj() * 2j, lambda t: torch.fft.fft(t.conj()), lambda t: t.conj().abs()):
        torch.testing.assert_close(op(c.to("opencl")).cpu(), op(c).resolve_conj())


def test_in_place_ops_on_conjugate_views_write_back_the_storage():
    c = _complex(2, 3)
    for op in (lambda t: t.conj().mul_(2j), lambda t: torch._neg_view(t).add_(1)):
        on_cpu, on_device = c.clone(), c.to("opencl")
        op(on_cpu)
        op(on_device)
        torch.testing.assert_close(on_device.cpu(), on_cpu)


def test_printing_a_conjugate_view_shows_its_values():
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    assert "-2." in repr(c.to("opencl").conj()) and "+1." in repr(c.to("opencl").conj())
