"""Run one OpInfo entry's float32 samples on opencl and on the CPU, and compare.

:func:`check` returns an :class:`Outcome`: ``matched`` (every sample's outputs, and the gradients of the
sum of its float outputs, agree with CPU torch), ``clear error`` (the device refused a sample with an
error listed in :data:`opinfo_expectations.CLEAR_ERRORS`), ``skipped`` (listed in
:data:`opinfo_expectations.SKIP`) or ``failed`` (a mismatch or any other error, with the details).
The CPU fallback is allowed (``TUNECL_FALLBACK=silent``); how many ops it served is counted.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

import torch
from torch.utils import _pytree as pytree

import tunecl.backend
from tunecl import config

import opinfo_expectations as expect

DEVICE = torch.device("opencl")
SEED = 1234


def load_op_db() -> list[Any]:
    """OpInfo entries with float32 support on the CPU, sorted by name and variant."""
    frozen = torch.backends.flags_frozen()
    from torch.testing._internal.common_methods_invocations import op_db

    # importing torch's test utilities freezes torch.backends flags for the whole process (every later test
    # that sets torch.backends.cudnn.allow_tf32 would fail): undo that in the module whose global it is
    # (``torch.backends`` as an attribute is not that module's namespace)
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = not frozen
    ops = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]
    return sorted(ops, key=op_id)


def op_id(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@dataclasses.dataclass
class Outcome:
    name: str
    kind: str                 # "matched", "clear error", "skipped", "failed"
    detail: str = ""
    samples: int = 0
    fallback_ops: int = 0     # fallback calls while the device side ran


class Mismatch(AssertionError):
    pass


class NoDevice(Exception):
    """A sample that never involves the device (a factory call without ``device=``)."""


def _same_layout(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """A copy of ``t`` with its sizes, strides and storage offset (``to`` and ``clone`` would make a
    non-dense layout contiguous): a view of a copy of its whole storage."""
    t = t.detach()
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage().clone())
    if device is not None:
        whole = whole.to(device)
    return whole.as_strided(t.shape, t.stride(), t.storage_offset())


def _leaf(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    copy = _same_layout(t, device)
    if t.requires_grad:
        copy.requires_grad_(True)
    return copy


def _prepare(sample: Any, device: torch.device | None,
             cpu_args: bool = False) -> tuple[Any, tuple, dict, list[torch.Tensor]]:
    """The sample's input, args and kwargs with every tensor a fresh leaf (on ``device``, or a CPU
    clone; with ``cpu_args`` only the input goes to ``device``); a ``device`` keyword names ``device``
    too."""
    leaves: list[torch.Tensor] = []
    memo: dict[int, torch.Tensor] = {}
    target = device

    def move(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) not in memo:
                if x.layout != torch.strided:
                    raise expect.NotStrided(f"a {x.layout} tensor")
                memo[id(x)] = _leaf(x, target)
                if memo[id(x)].requires_grad:
                    leaves.append(memo[id(x)])
            return memo[id(x)]
        return x

    inp = pytree.tree_map(move, sample.input)
    if cpu_args:
        target = None
    args = pytree.tree_map(move, tuple(sample.args))
    kwargs = pytree.tree_map(move, dict(sample.kwargs))
    if "device" in kwargs and kwargs["device"] is not None:
        # the device side names opencl; the reference the CPU (on a CUDA machine OpInfo also draws
        # samples with device="cuda")
        kwargs["device"] = device if device is not None else torch.device("cpu")
    elif device is not None and not memo:
        raise NoDevice("a sample without tensors or a device argument runs on the CPU only")
    return inp, args, kwargs, leaves


def _is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype.is_floating_point


def _compare(expected: Any, actual: Any, what: str, tol: dict[str, float]) -> None:
    exp_flat, exp_spec = pytree.tree_flatten(expected)
    act_flat, act_spec = pytree.tree_flatten(actual)
    if len(exp_flat) != len(act_flat):
        raise Mismatch(f"{what}: {len(act_flat)} results on opencl, {len(exp_flat)} on the CPU")
    for i, (e, a) in enumerate(zip(exp_flat, act_flat)):
        where = f"{what} {i}"
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{where}: opencl gave {type(a).__name__}, the CPU a tensor")
            if e.device.type == "cpu" and a.device.type != "opencl" and e.numel():
                raise Mismatch(f"{where}: the result is on {a.device}, not on opencl")
            got = a.detach().cpu() if a.device.type == "opencl" else a.detach()
            if got.shape != e.shape:
                raise Mismatch(f"{where}: shape {tuple(got.shape)} on opencl, {tuple(e.shape)} on the CPU")
            torch.testing.assert_close(got, e.detach(), equal_nan=True, msg=lambda m: f"{where}: {m}", **tol)
        elif isinstance(e, (bool, int, float, complex)):
            torch.testing.assert_close(a, e, equal_nan=True, msg=lambda m: f"{where}: {m}", **tol)
        elif isinstance(e, (torch.dtype, torch.Size, str, type(None))):
            if a != e:
                raise Mismatch(f"{where}: {a!r} on opencl, {e!r} on the CPU")


def _loss(out: Any) -> torch.Tensor | None:
    parts = [o.sum() for o in pytree.tree_leaves(out) if _is_float(o) and o.requires_grad]
    return sum(parts[1:], parts[0]) if parts else None


def _run(op: Any, sample: Any, device: torch.device | None, grad: bool) -> tuple[Any, list | None]:
    inp, args, kwargs, leaves = _prepare(sample, device, op_id(op) in expect.CPU_ARGS)
    widen = device is None and op_id(op) in expect.FLOAT64_REFERENCE
    if widen:   # the reference computes in float64 and rounds its results to float32 once
        inp, args, kwargs = pytree.tree_map(_to_float64, (inp, args, kwargs))
    torch.manual_seed(SEED)
    out = op(inp, *args, **kwargs)
    grads = None
    if grad and leaves:
        loss = _loss(out)
        if loss is not None:
            grads = list(torch.autograd.grad(loss, leaves, allow_unused=True))
    if widen:
        out, grads = pytree.tree_map(_to_float32, (out, grads))
    return out, grads


def _to_float64(x: Any) -> Any:
    return x.double() if isinstance(x, torch.Tensor) and x.dtype == torch.float32 else x


def _to_float32(x: Any) -> Any:
    return x.detach().float() if isinstance(x, torch.Tensor) and x.dtype == torch.float64 else x


def _clear(error: BaseException) -> str | None:
    """The reason of a listed clear error, or None (an unexpected error is a failure)."""
    if not isinstance(error, (RuntimeError, TypeError, NotImplementedError, ValueError)):
        return None
    message = str(error)
    for pattern, reason in expect.CLEAR_ERRORS.items():
        if re.search(pattern, message):
            return reason
    return None


def check(op: Any, *, max_samples: int | None = None) -> Outcome:
    name = op_id(op)
    if name in expect.SKIP:
        return Outcome(name, "skipped", expect.SKIP[name])
    tol = expect.TOLERANCES.get(name, {})
    grad = op.supports_autograd and name not in expect.NO_GRAD_CHECK
    torch.manual_seed(SEED)
    samples = op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd)
    outcome = Outcome(name, "matched")
    errors: list[str] = []
    before = sum(tunecl.backend.stats()["fallback_ops"].values())
    # (random ops draw the CPU's numbers on the host: the samples are compared with the CPU's)
    with config.override(fallback="silent", random="host"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index, sample in enumerate(samples):
            if max_samples is not None and index >= max_samples:
                break
            if name in expect.SKIP_SAMPLES and expect.SKIP_SAMPLES[name][0](sample):
                continue
            what = f"sample {index} ({_describe(sample)})"
            try:
                expected, expected_grads = _run(op, sample, None, grad)
            except expect.NotStrided:
                continue
            except Exception:
                continue   # the CPU refuses it too: nothing to compare
            try:
                _prepare(sample, DEVICE)
            except NoDevice:
                continue
            outcome.samples += 1
            try:
                actual, actual_grads = _run(op, sample, DEVICE, grad)
                _compare(expected, actual, f"{what}: output", tol)
                if expected_grads is not None:
                    _compare(expected_grads, actual_grads, f"{what}: gradient of input",
                             expect.GRAD_TOLERANCES.get(name, tol))
            except Exception as error:   # noqa: BLE001 - classified below
                reason = None if isinstance(error, AssertionError) else _clear(error)
                if reason is None:
                    detail = f"{what}: {type(error).__name__}: {error}"
                    return dataclasses.replace(outcome, kind="failed", detail=detail[:2000])
                errors.append(f"{what}: {reason}: {type(error).__name__}: {str(error)[:300]}")
    outcome.fallback_ops = sum(tunecl.backend.stats()["fallback_ops"].values()) - before
    if errors:
        outcome.kind, outcome.detail = "clear error", errors[0]
        if name in expect.MUST_MATCH:
            outcome.kind = "failed"
    return outcome


def _describe(sample: Any) -> str:
    def short(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            strided = x.layout == torch.strided and not x.is_contiguous()
            return f"T{tuple(x.shape)}{' strided' if strided else ''}"
        return x
    text = repr(pytree.tree_map(short, (sample.input, sample.args, sample.kwargs)))
    return text if len(text) < 200 else text[:200] + "..."
