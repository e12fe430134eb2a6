"""Pre-built optimizer calls (ops/optim_calls.py, tunecl.kernels.ops.multi_tensor): the fused steps and the
``_foreach_*`` ops bound once per signature give, bit for bit, what the general route gives, under
everything that can change between steps."""

from __future__ import annotations

import pytest
import torch

from tunecl import config
from tunecl.backend import state
from tunecl.backend.ops import optim_calls
from tunecl.profiling import KernelProfile

# more tensors than a launch's slots (several chunks), odd sizes, a one-element tensor
SHAPES = [(3, 5), (7,), (2, 1, 4), (1,), (4, 4), (9,), (1, 2, 3), (5,), (6, 2), (11,), (2, 2, 2)]


@pytest.fixture(autouse=True)
def call_by_call():
    """Each ``_foreach_*`` call launched by itself (not joined into a run: tests/torch/test_foreach_runs.py)."""
    with config.override(foreach_runs="off"):
        yield


@pytest.fixture
def general(monkeypatch):
    """A switch to the general route: ``general(True)`` bypasses the pre-built calls."""
    saved = optim_calls.foreach_map, optim_calls.fused_adam, optim_calls.fused_sgd

    def use(on: bool) -> None:
        if on:
            monkeypatch.setattr(optim_calls, "foreach_map", lambda *a, **k: None)
            monkeypatch.setattr(optim_calls, "fused_adam", lambda *a, **k: False)
            monkeypatch.setattr(optim_calls, "fused_sgd", lambda *a, **k: False)
        else:
            (optim_calls.foreach_map, optim_calls.fused_adam, optim_calls.fused_sgd) = saved
    yield use
    use(False)


def _params(seed: int = 0, shapes=SHAPES) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to("opencl")) for s in shapes]


def _grads(params, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * 0.1).to("opencl")


def _host(tensors) -> list[torch.Tensor]:
    return [t.detach().cpu() for t in tensors]


def _same(a, b) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and torch.equal(x, y)


OPTIMIZERS = {
    "adam": lambda p, **o: torch.optim.Adam(p, lr=1e-2, **o),
    "adam_amsgrad_maximize_wd": lambda p, **o: torch.optim.Adam(p, lr=1e-2, amsgrad=True, maximize=True,
                                                                weight_decay=0.1, **o),
    "adamw": lambda p, **o: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.05, **o),
    "adamw_amsgrad": lambda p, **o: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, **o),
    "sgd_momentum": lambda p, **o: torch.optim.SGD(p, lr=1e-2, momentum=0.9, weight_decay=1e-3, **o),
    "sgd_nesterov_maximize": lambda p, **o: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True,
                                                            maximize=True, **o),
    "sgd_plain": lambda p, **o: torch.optim.SGD(p, lr=1e-2, **o),
}


def _train(make, options, steps: int, between=None) -> list[torch.Tensor]:
    params = _params()
    opt = make(params, **options)
    for step in range(steps):
        _grads(params, step)
        if between is not None:
            params = between(step, params, opt) or params
        opt.step()
    return _host(params) + [t.cpu() for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


@pytest.fixture(params=["by address", "by pointer arguments"])
def binding(request, monkeypatch):
    """The pre-built calls' kernel copies reach their tensors by address (where the device allows it, as
    PoCL does) or through a pointer argument per tensor (``TUNECL_ADDRESSES=off``)."""
    by_address = request.param == "by address"
    optim = state.get().optim
    assert optim.by_address()   # (the probe passes on the test device)
    monkeypatch.setattr(optim, "_by_address", by_address)
    monkeypatch.setattr(optim, "calls", {})
    return by_address


@pytest.mark.parametrize("impl", ["fused", "foreach"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_steps_equal_the_general_route_bit_for_bit(name, impl, binding, general, strict):
    options = {"fused": True} if impl == "fused" else {"foreach": True}
    fast = _train(OPTIMIZERS[name], options, 5)
    calls = state.get().optim.calls
    assert calls   # the steps went through pre-built calls ...
    for call in calls.values():   # ... whose copies take their tensors as the binding says
        assert call.chunks.presets and (call.chunks.address_kernel is not None) == binding
        assert {p.function_name for p in call.chunks.presets} == {call.chunks.kernel.function_name}
        assert all(p.num_args == call.chunks.address_kernel.num_args if binding else
                   p.num_args == call.chunks.kernel.num_args for p in call.chunks.presets)
    general(True)
    _same(fast, _train(OPTIMIZERS[name], options, 5))


def _swap_storage(step, params, opt):
    if step == 3:   # p.data = other: the same Parameter on a new storage
        params[2].data = params[2].data.clone() * 0.5
        params[7].data = torch.randn(params[7].shape, generator=torch.Generator().manual_seed(5)).to("opencl")


def _add_param(step, params, opt):
    if step == 3:   # a parameter joins the group (the lists grow by one)
        g = torch.Generator().manual_seed(6)
        extra = torch.nn.Parameter(torch.randn(4, 3, generator=g).to("opencl"))
        extra.grad = torch.randn(4, 3, generator=g).to("opencl")
        opt.param_groups[0]["params"].append(extra)
        if isinstance(opt, torch.optim.SGD):   # (torch's fused SGD wants every momentum buffer after step 1)
            opt.state[extra]["momentum_buffer"] = torch.zeros_like(extra)
        return params + [extra]


def _change_lr(step, params, opt):
    for group in opt.param_groups:   # a scheduler's float learning rate
        group["lr"] = 1e-2 / (step + 1)


@pytest.mark.parametrize("impl", ["fused", "foreach"])
@pytest.mark.parametrize("between", [_swap_storage, _add_param, _change_lr], ids=lambda f: f.__name__[1:])
@pytest.mark.parametrize("name", ["adam_amsgrad_maximize_wd", "sgd_momentum"])
def test_changes_between_steps_are_bound(name, between, impl, binding, general, strict):
    options = {"fused": True} if impl == "fused" else {"foreach": True}
    fast = _train(OPTIMIZERS[name], options, 6, between)
    general(True)
    _same(fast, _train(OPTIMIZERS[name], options, 6, between))


def test_gradients_written_in_place_keep_their_binding(binding, general, strict):
    def run():
        params = _params()
        grads = [torch.zeros(p.shape, device="opencl") for p in params]
        opt = torch.optim.Adam(params, lr=1e-2, fused=True)
        for step in range(4):
            g = torch.Generator().manual_seed(step)
            for p, grad in zip(params, grads):
                grad.copy_(torch.randn(p.shape, generator=g))
                p.grad = grad
            opt.step()
        return _host(params)
    fast = run()
    general(True)
    _same(fast, run())


@pytest.mark.parametrize("make", [
    lambda p, lr: torch.optim.Adam(p, lr=lr, fused=True, weight_decay=0.1),
    lambda p, lr: torch.optim.AdamW(p, lr=lr, fused=True, amsgrad=True),
    lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, fused=True),
])
def test_a_device_learning_rate_changed_in_place_or_replaced_is_read(make, binding, general, strict):
    def run():
        params = _params()
        lr = torch.tensor(0.01, device="opencl")
        opt = make(params, lr)
        for step in range(6):
            _grads(params, step)
            if step == 2:
                lr.fill_(0.003)                                              # a scheduler, in place
            if step == 4:
                opt.param_groups[0]["lr"] = torch.tensor(0.02, device="opencl")   # another tensor
            opt.step()
        return _host(params)
    fast = run()
    general(True)
    _same(fast, run())


@pytest.mark.parametrize("adamw", [False, True])
def test_grad_scale_and_found_inf_are_read_each_call(adamw, binding, general, strict):
    """torch.amp.GradScaler's tensors of a fused step: the scale divides the gradients (written back), a
    found inf skips the step; both change in place between calls, and are replaced."""
    step_op = torch._fused_adamw_ if adamw else torch._fused_adam_

    def run():
        params = _params()
        g = torch.Generator().manual_seed(7)
        grads = [torch.randn(p.shape, generator=g).to("opencl") for p in params]
        m = [torch.zeros_like(p) for p in params]
        v = [torch.zeros_like(p) for p in params]
        steps = [torch.zeros((), device="opencl") for _ in params]
        scale, found = torch.tensor(4.0, device="opencl"), torch.tensor(0.0, device="opencl")
        for call in range(5):
            if call == 2:
                found.fill_(1.0)
            if call == 3:
                found.fill_(0.0)
                scale.fill_(2.0)
            if call == 4:
                scale = torch.tensor(8.0, device="opencl")
            torch._foreach_add_(steps, 1)
            step_op([p.data for p in params], grads, m, v, [], steps, lr=1e-2, beta1=0.9, beta2=0.99,
                    weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False, grad_scale=scale, found_inf=found)
        return _host(params) + _host(grads) + _host(m) + _host(v)
    fast = run()
    general(True)
    _same(fast, run())


def test_a_tensor_resized_in_place_is_seen(binding, general, strict):
    def run():
        a = [torch.ones(s, device="opencl") for s in [(12,), (5,), (9,)]]
        b = [torch.full(s, 2.0, device="opencl") for s in [(12,), (5,), (9,)]]
        for call in range(4):
            if call == 2:
                a[0].resize_(6)          # the same storage and data_ptr, fewer elements
                b[0] = b[0][:6]
            torch._foreach_add_(a, b, alpha=0.5)
        return _host(a)
    fast = run()
    general(True)
    _same(fast, run())


def test_a_number_list_changed_by_its_caller_is_seen(binding, general, strict):
    def run():
        a = [torch.ones(s, device="opencl") for s in SHAPES]
        numbers = [float(i) for i in range(len(SHAPES))]
        for call in range(4):
            numbers[3] = 10.0 * call   # the same list object, changed
            torch._foreach_mul_(a, numbers)
        return _host(a)
    fast = run()
    general(True)
    _same(fast, run())


def test_inputs_sharing_storage_with_outputs_still_take_the_general_route(strict):
    """An input list first disjoint from its outputs, then views overlapping them: the second call is
    refused as the general route refuses it (torch's per-tensor ops raise)."""
    base = torch.arange(20, dtype=torch.float32, device="opencl")
    outs = [base[0:5], base[10:15]]
    others = [torch.ones(5, device="opencl"), torch.ones(5, device="opencl")]
    for _ in range(2):
        expected = [o.cpu() + 2 * x.cpu() for o, x in zip(outs, others)]
        torch._foreach_add_(outs, others, alpha=2)
        _same(_host(outs), expected)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        torch._foreach_add_(outs, [base[1:6], base[11:16]], alpha=2)


def test_a_graph_records_the_launches_of_a_bound_step(general):
    """Steps already bound (kernel copies built): a capture and a KernelProfile see the same launches as the
    general route makes, and replays update as eager steps do."""
    def run(capture: bool):
        params = _params()
        opt = torch.optim.Adam(params, lr=1e-2, fused=True)
        for step in range(3):
            _grads(params, step)
            opt.step()
        with KernelProfile() as profile:
            opt.step()
            torch.opencl.synchronize()
        if capture:
            g = torch.opencl.Graph()
            with torch.opencl.graph(g):
                opt.step()
            for _ in range(2):
                g.replay()
            g.reset()
        else:
            for _ in range(3):
                opt.step()
        return profile.commands, _host(params)
    commands, fast = run(True)
    general(True)
    general_commands, expected = run(False)
    assert commands == general_commands > 0
    _same(fast, expected)


def test_a_new_backend_state_starts_with_no_calls(general, monkeypatch, strict):
    params = _params()
    opt = torch.optim.Adam(params, lr=1e-2, foreach=True)
    for step in range(3):
        _grads(params, step)
        opt.step()
    old = state.get().optim
    assert old.calls
    monkeypatch.setattr(state, "_state", state.State(state.get().device))   # a device reset
    assert not state.get().optim.calls and not state.get().optim.lists
    _grads(params, 3)
    opt.step()
    assert state.get().optim.calls and state.get().optim is not old


def test_the_table_is_bounded(monkeypatch, strict):
    monkeypatch.setattr(optim_calls, "MAX_CALLS", 4)
    for n in range(1, 12):
        a = [torch.ones(n + k, device="opencl") for k in range(3)]
        torch._foreach_mul_(a, 2.0)
        torch._foreach_mul_(a, 2.0)
        _same(_host(a), [torch.full((n + k,), 4.0) for k in range(3)])
        assert len(state.get().optim.calls) <= 4


def test_views_at_offsets_into_one_storage_bind_their_offsets(binding, general, strict):
    """Flat-buffer lists (every tensor a view at an offset into one storage) next to tensors of their own, in
    columns bound anew each call (fresh inputs): the offsets are found, as the general route finds them."""
    sizes = [3, 7, 1, 5]

    def views(flat: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.split(flat, sizes))

    def run() -> list[torch.Tensor]:
        torch.manual_seed(3)
        outs = views(torch.randn(sum(sizes), device="opencl"))[:3] + [torch.randn(5, device="opencl")]
        for step in range(3):
            flat = torch.randn(sum(sizes) + 2, device="opencl")[2:]            # offsets from 2 on
            inputs = views(flat)[:2] + [torch.randn(1, device="opencl"), views(flat)[3]]
            torch._foreach_addcmul_(outs, inputs, inputs, value=0.5)
            torch._foreach_add_(outs, [x.clone() for x in inputs], alpha=-1.5)
        return _host(outs)

    state.get().optim.calls.clear()
    fast = run()
    assert sum(call.chunks.presets is not None for call in state.get().optim.calls.values()) == 2   # (bound)
    general(True)
    _same(fast, run())


def test_a_list_several_calls_take_is_checked_once(general, monkeypatch, strict):
    """Fresh gradients every step (``zero_grad(set_to_none=True)``): foreach Adam reads them in several calls,
    and its temporaries (a list one call makes, the next ones read) too; each list is checked once per step,
    and the steps are bit for bit those of the general route."""
    checked: list[tuple] = []
    valid = optim_calls._valid

    def counting(tensors, numels, ptrs):
        checked.append(tuple(ptrs))
        return valid(tensors, numels, ptrs)

    def run(count: bool):
        params = _params()
        opt = torch.optim.Adam(params, lr=1e-2, foreach=True)
        for step in range(4):
            _grads(params, step)
            checked.clear()
            opt.step()
            if count and step >= 2:   # (the first steps bind every list)
                grads = tuple(p.grad.data_ptr() for p in params)
                assert checked.count(grads) == 1 and len(checked) == 1
        return _host(params)
    monkeypatch.setattr(optim_calls, "_valid", counting)
    fast = run(True)
    general(True)
    _same(fast, run(False))


def test_a_remembered_list_is_still_checked_against_each_call(strict):
    """A list found valid in one call, then taken by calls with other outputs: one whose outputs overlap it is
    refused as the general route refuses it, and a tensor of it resized in place meets each call's sizes."""
    base = torch.arange(20, dtype=torch.float32, device="opencl")
    shared = [base[1:6], base[11:16]]
    others = [torch.zeros(5, device="opencl"), torch.zeros(5, device="opencl")]
    for _ in range(2):
        torch._foreach_add_(others, shared)
    _same(_host(others), [torch.arange(1.0, 6.0) * 2, torch.arange(11.0, 16.0) * 2])
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        torch._foreach_add_([base[0:5], base[10:15]], shared)

    a = [torch.full((5,), 3.0, device="opencl"), torch.full((4,), 3.0, device="opencl")]
    fives = [torch.ones(5, device="opencl"), torch.ones(4, device="opencl")]
    for _ in range(2):
        torch._foreach_mul_(fives, a)
    a[0].resize_(4)   # the same data_ptr, fewer elements
    fours = [torch.ones(4, device="opencl"), torch.ones(4, device="opencl")]
    for _ in range(2):
        torch._foreach_mul_(fours, a)
    _same(_host(fours), [torch.full((4,), 9.0)] * 2)
    with pytest.raises(RuntimeError):
        torch._foreach_mul_(fives, a)   # 5 elements against 4 now


def test_the_remembered_lists_are_bounded(monkeypatch, strict):
    monkeypatch.setattr(optim_calls, "MAX_LISTS", 3)
    a = [torch.ones(4, device="opencl"), torch.ones(6, device="opencl")]
    for step in range(10):
        fresh = [torch.full((4,), float(step), device="opencl"), torch.full((6,), float(step), device="opencl")]
        torch._foreach_add_(a, fresh)
        squares = torch._foreach_mul(fresh, fresh)
        assert len(state.get().optim.lists) <= 3
    total = sum(range(10))
    _same(_host(a), [torch.full((4,), 1.0 + total), torch.full((6,), 1.0 + total)])
    _same(_host(squares), [torch.full((4,), 81.0), torch.full((6,), 81.0)])


def test_another_view_at_the_same_data_ptrs_is_not_taken_for_the_bound_list(strict):
    """A transposed or reinterpreted view starts at its base's data_ptr with its numel: a call bound to the
    base (and a list remembered from it) must not read the view as contiguous float32."""
    g = torch.Generator().manual_seed(3)
    cpu = [torch.randn(3, 5, generator=g), torch.randn(4, 2, generator=g)]
    base = [t.to("opencl") for t in cpu]
    ones = [torch.ones(3, 5, device="opencl"), torch.ones(4, 2, device="opencl")]
    for _ in range(3):   # bound on the second call, served pre-built on the third
        out = torch._foreach_add(ones, base)
    _same(_host(out), [t + 1 for t in cpu])
    ones_t = [torch.ones(5, 3, device="opencl"), torch.ones(2, 4, device="opencl")]
    for _ in range(3):   # the same signature (numels), the other operand's views transposed
        out = torch._foreach_add(ones_t, [t.t() for t in base])
    _same(_host(out), [t.t() + 1 for t in cpu])

    for _ in range(3):   # in place into the base, then into the same storages seen as int32
        torch._foreach_mul_(base, 1.0)
    ints = [t.view(torch.int32) for t in base]
    with torch.no_grad():
        torch._foreach_mul_(ints, 1)
    _same(_host(base), cpu)


@pytest.mark.parametrize("release", ["empty_cache", "graph reset"])
def test_buffers_go_back_to_the_driver_only_after_the_launches_that_reached_them_by_address(release, monkeypatch):
    """A launch that reaches a buffer by its address does not hold it: the allocator waits for the queue
    before the driver gets buffers back, once such launches ran (tunecl.runtime.addresses)."""
    import pyopencl as cl

    from tunecl.runtime import addresses

    params = _params()
    opt = torch.optim.Adam(params, lr=1e-2, fused=True)
    for step in range(3):
        _grads(params, step)
        opt.step()
    assert addresses.launched and any(c.chunks.address_kernel is not None for c in state.get().optim.calls.values())
    if release == "graph reset":
        g = torch.opencl.Graph()
        with torch.opencl.graph(g):
            opt.step()
    finished = []
    finish = cl.CommandQueue.finish
    monkeypatch.setattr(cl.CommandQueue, "finish", lambda queue: (finished.append(queue), finish(queue))[1])
    _grads(params, 3)   # the old gradients' buffers go to the cache
    if release == "graph reset":
        g.reset()
    else:
        torch.opencl.empty_cache()
    assert finished
    monkeypatch.setattr(addresses, "launched", False)
    finished.clear()
    torch.opencl.empty_cache()   # (nothing reached buffers by address: no wait)
    assert not finished
