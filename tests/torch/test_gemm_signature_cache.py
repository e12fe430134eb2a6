"""Pre-built matrix-product calls (ops/linalg.py, tunecl.kernels.launches): a float32 product's launches are
recorded on its signature's first call and enqueued again with new buffers; every result equals, bit for
bit, what the general route (the plan's own ``run``) gives, and matches CPU float64."""

from __future__ import annotations

import pytest
import torch
from opcheck import same_results

import tunecl.backend
from tunecl.backend import plans, state
from tunecl.backend.ops import linalg
from tunecl.profiling import KernelProfile


def _general(fn, *args):
    """``fn`` with the pre-built calls bypassed: the general route."""
    saved = linalg._fast_gemm
    linalg._fast_gemm = lambda *a, **k: False
    try:
        return fn(*args)
    finally:
        linalg._fast_gemm = saved


@pytest.fixture
def calls(fresh_plans, strict):
    linalg._calls.clear()
    yield linalg._calls
    linalg._calls.clear()


def _recorded() -> list:
    return [call for call in linalg._calls.values() if call is not None and call.run.launches]


def _cases():
    """(name, function, operands): products the backend passes to the GEMM as they are, transposed views,
    offsets into a storage, batches, broadcast bias, alpha and beta, odd sizes."""
    g = torch.Generator().manual_seed(3)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    big = r(5 * 37 + 11)
    return [
        ("mm", torch.mm, (r(7, 13), r(13, 5))),
        ("mm of transposed views", lambda a, b: a.t() @ b.t(), (r(13, 7), r(5, 13))),
        ("mm at storage offsets", lambda s, t: s[11:].view(5, 37)[:, 3:20] @ t[2:].view(17, 3), (big, r(2 + 17 * 3))),
        ("addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), (r(6), r(9, 4), r(4, 6))),
        ("linear", torch.nn.functional.linear, (r(2, 3, 33), r(17, 33), r(17))),
        ("bmm", torch.bmm, (r(3, 7, 9), r(3, 9, 2))),
        ("bmm q @ k^T", lambda q, k: torch.bmm(q, k.transpose(1, 2)), (r(4, 16, 8), r(4, 16, 8))),
        ("baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, beta=-1.0, alpha=0.25), (r(2, 5, 3), r(2, 5, 4), r(2, 4, 3))),
        ("one row", torch.mm, (r(1, 64), r(64, 65))),
        ("one column", torch.mm, (r(65, 64), r(64, 1))),
    ]


@pytest.mark.parametrize("name, fn, operands", _cases(), ids=[c[0] for c in _cases()])
def test_repeated_products_are_recorded_once_and_match_the_general_route_and_the_cpu(calls, name, fn, operands):
    dev = [t.to("opencl") for t in operands]
    expected = fn(*[t.double() for t in operands])
    general = _general(fn, *dev)
    for _ in range(3):
        got = fn(*dev)
        same_results(got, general)
    torch.testing.assert_close(got.cpu().double(), expected, atol=1e-4, rtol=1e-4)
    assert _recorded(), "no product was served by recorded launches"


def test_each_call_binds_its_own_buffers(calls):
    """The same signature with new tensors (new buffers) computes the new product; a and b in one storage
    (q and k of one projection) are bound to both roles."""
    for _ in range(3):
        a, b = torch.randn(6, 10), torch.randn(10, 3)
        same_results(torch.mm(a.to("opencl"), b.to("opencl")), _general(torch.mm, a.to("opencl"), b.to("opencl")))
        torch.testing.assert_close(torch.mm(a.to("opencl"), b.to("opencl")).cpu(), a @ b)
        qk = torch.randn(2, 8, 12).to("opencl")
        q, k = qk[..., :6], qk[..., 6:]
        torch.testing.assert_close(torch.bmm(q, k.transpose(1, 2)).cpu(), torch.bmm(q.cpu(), k.cpu().transpose(1, 2)))


def test_new_offsets_strides_and_flags_get_their_own_calls(calls):
    s = torch.randn(400).to("opencl")
    w = torch.randn(8, 5).to("opencl")
    for offset in (0, 3, 8, 3):
        got = s[offset:offset + 80].view(10, 8) @ w
        torch.testing.assert_close(got.cpu(), s.cpu()[offset:offset + 80].view(10, 8) @ w.cpu())
    assert len([c for c in calls.values() if c is not None]) == 3
    flags = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = not flags
        (s[:80].view(10, 8) @ w).cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = flags
    assert len([c for c in calls.values() if c is not None]) == 4
    assert len({key[-1] for key in calls}) == 2   # (the accepted precisions are part of the signature)


def test_products_the_general_route_copies_first_are_not_prebuilt(calls):
    """A layout the GEMM cannot read (a column-strided view), a result written through a copy, float16
    and empty products keep the general route, with the right results."""
    a = torch.randn(6, 20)
    b = torch.randn(10, 4)
    got = a.to("opencl")[:, ::2] @ b.to("opencl")
    torch.testing.assert_close(got.cpu(), a[:, ::2] @ b)
    out = torch.empty(4, 6, device="opencl").t()
    torch.mm(a.to("opencl")[:, :10], b.to("opencl"), out=out)
    torch.testing.assert_close(out.cpu(), a[:, :10] @ b)
    assert (torch.randn(3, 0).to("opencl") @ torch.randn(0, 2).to("opencl")).cpu().eq(0).all()
    assert all(call is None for call in calls.values())


def test_graph_capture_and_kernel_profiles_see_the_launches(calls):
    a, b = torch.randn(9, 7).to("opencl"), torch.randn(7, 5).to("opencl")
    expected = (a @ b).cpu()
    (a @ b).cpu()
    assert _recorded()
    with KernelProfile() as profile:
        got = a @ b
    assert torch.equal(got.cpu(), expected)
    assert profile.summary(), "the profile saw no launch"
    g = torch.opencl.Graph()
    with torch.opencl.graph(g):
        captured = a @ b
    assert g.commands, "the capture recorded nothing"
    a.copy_(torch.ones(9, 7))
    g.replay()
    torch.testing.assert_close(captured.cpu(), torch.ones(9, 7) @ b.cpu())


def test_cleared_plans_and_a_new_state_drop_the_calls(calls, monkeypatch):
    a, b = torch.randn(4, 4).to("opencl"), torch.randn(4, 4).to("opencl")
    (a @ b).cpu()
    assert calls
    plans.clear()
    (a @ b).cpu()
    assert len(calls) == 1 and linalg._calls.generation == plans.generation
    monkeypatch.setattr(linalg, "MAX_CALLS", 2)
    for n in range(1, 6):
        (torch.randn(n, 3).to("opencl") @ torch.randn(3, 2).to("opencl")).cpu()
    assert len(calls) <= 2
    assert state.get() is linalg._calls.owner
    assert tunecl.backend.stats()["plan_sources"]
