"""Which thread runs the backward of opencl tensors (TUNECL_BACKWARD_THREAD), and a backward on the CPU before the
backend is imported, which starts torch's autograd engine without a queue for the opencl device: later opencl
backward passes must still run (on their calling thread) and be right."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

SCRIPT = textwrap.dedent("""
    import threading
    import torch
    a = torch.ones(3, requires_grad=True)
    (a * 2).sum().backward()                    # the engine starts here, before opencl exists
    import tunecl.backend
    from tunecl.backend import autograd_engine
    w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    x = w.detach().to("opencl").requires_grad_()
    (x * x).sum().backward()
    assert torch.equal(x.grad.cpu(), 2 * w.detach()), x.grad
    # on the worker thread, the engine has no queue for the device and the module notices (unless a CUDA GPU
    # gave the engine a queue for device index 0 when it started: its queues are sized by the largest device
    # count it knew); on the calling thread (the default) the engine's queues are never asked for
    import os
    worker = os.environ.get("TUNECL_BACKWARD_THREAD") == "worker"
    assert autograd_engine.on_calling_thread() == (worker and torch.cuda.device_count() == 0)
    g, = torch.autograd.grad((x * 3).sum(), x)  # torch.autograd.grad takes the same way
    assert torch.equal(g.cpu(), torch.full((3,), 3.0))
    errors = []
    def other_thread():                         # another thread's backward too
        try:
            y = w.detach().to("opencl").requires_grad_()
            (y * 4).sum().backward()
            assert torch.equal(y.grad.cpu(), torch.full((3,), 4.0))
        except BaseException as error:
            errors.append(error)
    t = threading.Thread(target=other_thread); t.start(); t.join()
    assert not errors, errors
    assert torch.autograd.grad((a * 5).sum(), a)[0].tolist() == [5.0] * 3   # CPU backward unchanged
    print("ok")
""")


@pytest.mark.parametrize("thread", ["worker", "auto"])
def test_backward_after_the_engine_started_without_the_device(thread):
    env = {**os.environ, "TUNECL_BACKWARD_THREAD": thread}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_a_backward_error_of_another_kind_is_raised_as_it_is():
    import torch

    x = torch.ones(2, device="opencl", requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad|element 0 of tensors"):
        torch.ones(2, device="opencl").sum().backward()
    assert x.grad is None


def test_a_cuda_backward_that_torch_refuses_beside_the_device_says_what_to_do():
    """torch's own assert for a CUDA backward in a process with a registered PrivateUse1 device
    (pytorch/pytorch#161129) reaches the user as an error naming the cause and the way out; other errors
    pass through unchanged."""

    from tunecl.backend import autograd_engine

    def refused(*args, **kwargs):
        raise RuntimeError('opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED at "engine.cpp":1084')

    with pytest.raises(RuntimeError, match="does not import tunecl.backend") as raised:
        autograd_engine.wrap(refused)()
    assert "opt_ready_stream" in str(raised.value.__cause__)

    def other(*args, **kwargs):
        raise RuntimeError("element 0 of tensors does not require grad")

    with pytest.raises(RuntimeError, match="^element 0 of tensors does not require grad$"):
        autograd_engine.wrap(other)()


class _Thread(torch.autograd.Function):
    """Identity whose backward notes the thread it runs on."""
    threads: list = []

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, grad):
        import threading

        _Thread.threads.append(threading.get_ident())
        return grad


def _step(seed: int):
    import tunecl.backend  # noqa: F401

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 5)).to("opencl")
    x = torch.randn(2, 3, 8, 8, device="opencl", requires_grad=True)
    loss = torch.nn.functional.cross_entropy(model(_Thread.apply(x)), torch.tensor([1, 3], device="opencl"))
    loss.backward()
    return [p.grad.cpu() for p in model.parameters()]


def test_backward_thread_setting_picks_the_thread_and_changes_no_result():
    """``TUNECL_BACKWARD_THREAD=caller`` runs the device's backward on the thread that called ``backward``,
    ``worker`` on torch's autograd thread; both compute the same gradients, bit for bit."""
    import threading

    from tunecl import config

    results = {}
    for mode in ("worker", "caller"):
        _Thread.threads.clear()
        with config.override(backward_thread=mode):
            results[mode] = _step(0)
        assert len(_Thread.threads) == 1
        assert (_Thread.threads[0] == threading.get_ident()) == (mode == "caller"), mode
    for a, b in zip(results["worker"], results["caller"]):
        assert torch.equal(a, b)


def test_backward_thread_setting_rejects_an_unknown_value():

    from tunecl import config

    with pytest.raises(ValueError, match="TUNECL_BACKWARD_THREAD must be one of auto, caller, worker"):
        config.Config.from_env({"TUNECL_BACKWARD_THREAD": "main"})
