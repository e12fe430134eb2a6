"""A backward on the CPU before the backend is imported starts torch's autograd engine without a queue for
the opencl device; later opencl backward passes must still run (on their calling thread) and be right."""

import subprocess
import sys
import textwrap

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
    assert autograd_engine.on_calling_thread()
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


def test_backward_after_the_engine_started_without_the_device():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


def test_a_backward_error_of_another_kind_is_raised_as_it_is():
    import pytest
    import torch

    x = torch.ones(2, device="opencl", requires_grad=True)
    with pytest.raises(RuntimeError, match="does not require grad|element 0 of tensors"):
        torch.ones(2, device="opencl").sum().backward()
    assert x.grad is None


def test_a_cuda_backward_that_torch_refuses_beside_the_device_says_what_to_do():
    """torch's own assert for a CUDA backward in a process with a registered PrivateUse1 device
    (pytorch/pytorch#161129) reaches the user as an error naming the cause and the way out; other errors
    pass through unchanged."""
    import pytest

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
