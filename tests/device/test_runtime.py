"""The runtime on the real OpenCL device of this machine (PoCL in CI)."""

import os

import numpy as np
import pyopencl as cl
import pytest

from tunecl import runtime
from tunecl.cli import main
from tunecl.errors import BuildError
from tunecl.runtime import build as runtime_build
from tunecl.runtime import device as runtime_device

SOURCE = """
__kernel void axpy(__global float *y, __global const float *x, const float alpha, const int n) {
    const int i = get_global_id(0);
    if (i < n) { y[i] += alpha * x[i]; }
}
"""


@pytest.fixture(scope="module")
def device():
    return runtime.select_device()


def test_default_device_is_a_usable_device(device):
    entries = runtime.list_devices()
    assert entries[0].usable, "index 0 must be a device that compiles"
    # (the suite may run on another device, chosen by TUNECL_DEVICE)
    assert device.index == (runtime.resolve().index if os.environ.get("TUNECL_DEVICE") else 0)
    fp = device.fingerprint
    assert fp.compute_units >= 1 and fp.local_mem_size > 0 and fp.max_work_group_size >= 1
    assert fp.device_type in ("gpu", "cpu", "accelerator", "other")
    assert fp.key != fp.model_key


def test_build_cache_kernel_launch_and_timing(device):
    program = device.build(SOURCE, ["-DUNUSED=1"])
    assert device.build(SOURCE, ["-DUNUSED=1"]) is program  # cached per (source hash, options)
    assert device.build(SOURCE, ["-DUNUSED=2"]) is not program
    kernel = device.kernel(program, "axpy", [None, None, np.float32, np.int32])
    assert device.kernel(program, "axpy") is kernel  # fetched once
    n = 1000
    x, y = np.arange(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    xb, yb = device.upload(x), device.upload(y)
    with device.profiling():  # another test may have turned profiling off (the backend does)
        event = device.launch(kernel, (1024,), None, yb, xb, 2.0, n)
        seconds = device.elapsed(event)
    assert 0 < seconds < 10
    np.testing.assert_array_equal(device.download(yb, (n,)), y + 2 * x)


def test_profiling_can_be_off_outside_profiling_blocks_and_order_holds(device):
    """The backend's queue does not profile; a profiling() block (nested or not) switches to the profiling
    queue and back, finishing the queue it leaves, so commands on the two queues never overtake."""
    program = device.build(SOURCE)
    kernel = device.kernel(program, "axpy", [None, None, np.float32, np.int32])
    n = 1 << 16
    x = np.ones(n, dtype=np.float32)
    xb, yb = device.upload(x), device.upload(np.zeros(n, dtype=np.float32))
    default = device.profiles  # (outside any profiling block: the default, which the backend turns off)
    try:
        device.set_profiling_default(False)
        assert not device.profiles
        event = device.launch(kernel, (n,), None, yb, xb, 1.0, n)  # on the plain queue
        with pytest.raises(cl.Error):  # no device timestamps without profiling
            device.elapsed(event)
        with device.profiling():
            assert device.profiles
            with device.profiling():
                timed = device.launch(kernel, (n,), None, yb, xb, 10.0, n)
            assert device.profiles  # still inside the outer block
            assert device.elapsed(timed) > 0
        assert not device.profiles
        device.launch(kernel, (n,), None, yb, xb, 100.0, n)
        np.testing.assert_array_equal(device.download(yb, (n,)), np.full(n, 111, np.float32))
    finally:
        device.set_profiling_default(default)  # other tests in this process share the device
    assert device.profiles == default


def test_offsets_in_copies(device):
    buf = device.alloc(64)
    device.copyin(buf, np.arange(8, dtype=np.float32), offset=32)
    out = device.download(buf, (8,), offset=32)
    np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32))


def test_programs_are_loaded_from_their_kept_binaries_in_another_context(device, tmp_path):
    """Where the runtime keeps binaries (PoCL: a hit in its own cache still runs the compiler's front end),
    a program built a second time from source (here in a new context, as in a new process) is stored in
    the cache folder, the first build only marks it as seen (asking PoCL for a binary costs a code
    generation); a later build loads the binary and gives the same kernel; a binary the driver refuses is
    built again and kept anew."""
    if not runtime.keeps_binaries(device.cl_device):
        pytest.skip("pyopencl's or the driver's cache serves this device")
    options = ["-DUNUSED=3"]

    def kept() -> dict:
        return {p: p.stat().st_mtime_ns for p in (tmp_path / "binaries").glob("*.bin")}

    def axpy(program: cl.Program, context: cl.Context) -> np.ndarray:
        queue = cl.CommandQueue(context)
        kernel = cl.Kernel(program, "axpy")
        kernel.set_scalar_arg_dtypes([None, None, np.float32, np.int32])
        x, y = np.arange(5, dtype=np.float32), np.ones(5, dtype=np.float32)
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
        xb, yb = cl.Buffer(context, flags, hostbuf=x), cl.Buffer(context, flags, hostbuf=y)
        kernel(queue, (8,), None, yb, xb, 3.0, 5)
        cl.enqueue_copy(queue, y, yb)
        return y

    expected = 1 + 3 * np.arange(5, dtype=np.float32)
    program = runtime.build_program(device.context, device.cl_device, SOURCE, options, str(tmp_path))
    np.testing.assert_array_equal(axpy(program, device.context), expected)
    assert kept() == {}, "a program built once kept its binary"
    assert len(list((tmp_path / "binaries").glob("*.seen"))) == 1

    context = cl.Context([device.cl_device])
    program = runtime.build_program(context, device.cl_device, SOURCE, options, str(tmp_path))
    np.testing.assert_array_equal(axpy(program, context), expected)
    stored = kept()
    assert len(stored) == 1, "the binary of a program built twice was not kept"
    assert not list((tmp_path / "binaries").glob("*.seen"))

    context = cl.Context([device.cl_device])
    program = runtime.build_program(context, device.cl_device, SOURCE, options, str(tmp_path))
    assert kept() == stored   # loaded, not stored again
    np.testing.assert_array_equal(axpy(program, context), expected)
    (path,) = stored
    path.write_bytes(b"not a binary")
    program = runtime.build_program(context, device.cl_device, SOURCE, options, str(tmp_path))
    np.testing.assert_array_equal(axpy(program, context), expected)
    assert path.read_bytes() != b"not a binary"   # built from source and kept again


def test_a_build_worker_keeps_binaries_at_the_first_build(device, tmp_path, monkeypatch):
    """tunecl tune --jobs's build workers build for the main process: their first build keeps the binary."""
    if not runtime.keeps_binaries(device.cl_device):
        pytest.skip("pyopencl's or the driver's cache serves this device")
    monkeypatch.setattr(runtime_build, "KEEP_AT_FIRST_BUILD", True)
    runtime.build_program(device.context, device.cl_device, SOURCE, ["-DUNUSED=4"], str(tmp_path))
    assert len(list((tmp_path / "binaries").glob("*.bin"))) == 1


def test_build_error_carries_the_log(device):
    with pytest.raises(BuildError, match="build failed") as info:
        device.build("__kernel void broken(__global float *x) { x[0] = undefined_name; }")
    assert "undefined_name" in str(info.value)


def test_cli_devices_marks_default(capsys, monkeypatch):
    monkeypatch.delenv("TUNECL_DEVICE", raising=False)
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("*0")


ROUNDING_SOURCE = """
__kernel void divide_sqrt(__global const float *x, __global const float *y, __global float *q,
                          __global float *r) {
    const int i = get_global_id(0);
    q[i] = x[i] / y[i];
    r[i] = 1.0f / sqrt(x[i] + 1e-5f);
}
"""


def test_programs_divide_and_take_sqrt_correctly_rounded(device, monkeypatch):
    """Float division and sqrt round as torch's do where the device can (OpenCL otherwise allows 2.5 and
    3 ulp, which NVIDIA's compiler takes): every program is built with the option asking for it."""
    if not device.cl_device.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT:
        pytest.skip("the device cannot round float division and sqrt correctly")
    seen = []
    original = runtime_device.build_program

    def recording(context, cl_device, source, options, cache_dir=None):
        seen.append(tuple(options))
        return original(context, cl_device, source, options, cache_dir)

    monkeypatch.setattr(runtime_device, "build_program", recording)  # where Device.build looks it up
    program = device.build(ROUNDING_SOURCE, ["-DUNUSED=3"])
    assert seen == [("-DUNUSED=3", runtime.CORRECTLY_ROUNDED_DIVIDE_SQRT)]
    assert device.build(ROUNDING_SOURCE, ["-DUNUSED=3", runtime.CORRECTLY_ROUNDED_DIVIDE_SQRT]) is not None

    rng = np.random.default_rng(0)
    x = (rng.random(1 << 16, dtype=np.float32) * 100).astype(np.float32)
    y = (rng.random(1 << 16, dtype=np.float32) + 0.37).astype(np.float32)
    mf = cl.mem_flags
    bx = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    by = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=y)
    bq, br = (cl.Buffer(device.context, mf.WRITE_ONLY, x.nbytes) for _ in range(2))
    program.divide_sqrt(device.queue, x.shape, None, bx, by, bq, br)
    q, r = np.empty_like(x), np.empty_like(x)
    cl.enqueue_copy(device.queue, q, bq)
    cl.enqueue_copy(device.queue, r, br)
    device.queue.finish()
    np.testing.assert_array_equal(q, x / y)
    np.testing.assert_array_equal(r, np.float32(1) / np.sqrt(x + np.float32(1e-5)))
