"""``tunecl validate``: a whole model on the opencl device against CPU torch in float32 and float64.

Three copies get the same weights (the CPU model's ``state_dict``; the float64 copy is the CPU model
converted with ``.double()``), the same inputs and the same seed before each run, so dropout and
stochastic depth draw the same masks in all three (the device draws from the CPU generator). Without
``train``: one eval-mode forward, and the outputs are compared. With ``train``: a train-mode forward,
cross-entropy loss, backward and one Adam step on each, and the output, the loss, every parameter's
gradient and every parameter after the step are compared. With ``compiled``, the device runs the model
and the Adam step through ``torch.compile(..., backend="tunecl")``: the same step, from the same weights,
optimizer state and seed, runs :data:`COMPILED_CALLS` times (a warm-up, the capture, a replay), and the
last call, replayed from device graphs, is what is compared.

Each check reports the max absolute error and the relative error ``max|dev - cpu| / max|cpu|`` of one
tensor against CPU float32, and the normwise errors ``||x - ref64|| / ||ref64||`` of the device and of
CPU float32 against the float64 run. A check passes on a fixed tolerance against CPU float32, or, as
PyTorch's own accuracy checker (``torch._dynamo.utils.same`` with an fp64 reference) does it, when the
device is not much further from float64 than CPU float32 is: :class:`Tolerances` says why each bound is
what it is.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import time
from typing import Any

from tunecl.errors import TuneclError
from tunecl.tools import load_model, make_batch, use_device

ADAM_LR = 1e-3
ADAM_EPS = 1e-8
# Adam's first step is lr * g / (|g| + eps): it is lr * sign(g) to 0.1% once |g| > 1000 * eps
SIGN_FLOOR = 1000 * ADAM_EPS
# a gradient tensor this much smaller than the model's largest is rounding noise around zero
NUMERICALLY_ZERO = 1e-4
# elements per step of the float64 error sums (2 MiB of float64: stays in cache)
_CHUNK = 1 << 18
# calls of a compiled step: the backend's graphs run eagerly first, are captured on the second call
# and replay from the third
COMPILED_CALLS = 3


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """When a compared tensor passes: any one of these criteria suffices.

    1. **fp32**: the relative error ``max|dev - cpu| / max|cpu|`` against CPU float32 is at most
       ``output``, ``loss``, ``grad`` or ``param`` (the fields below).
    2. **fp64**: the device is not much further from the float64 run than CPU float32 is:
       ``err(dev) <= multiplier * err(cpu) + floor``, ``err(x) = ||x - ref64|| / ||ref64||`` (the
       normwise relative error, i.e. PyTorch's RMSE ratio). This is what judges ill-conditioned nets:
       train-mode batch norm over 2 samples on 1x1 maps divides by ``|x1 - x2|``, so CPU float32 itself
       is 53% off float64 on resnet50's output and 82% on mnasnet1_0's (batch 2, image 32), and 100%
       or more on gradients of their last stages: no fixed tolerance between two float32 runs can
       pass a correct device there without passing almost anything.
    3. **zero** (gradients): a gradient that is zero in exact arithmetic (a conv bias right before
       batch norm) holds only rounding noise: a tensor whose ``max|ref| < 1e-4 * G`` (``G``: the
       model's largest gradient entry of the same reference, CPU float32 or float64) passes when
       ``max|dev - ref| <= grad * 1e-4 * G``.
    4. **own output** (loss) / **own gradient** (parameters): the device's loss is the float64
       cross-entropy of the device's own output to ``loss_own`` relative, and a parameter after the
       step is Adam's first step on the device's own gradient (``p0 - lr * g / (|g| + eps)`` in
       float64) to ``param`` relative. Both are well-conditioned functions of a tensor with a check
       of its own, which they pass an ill-conditioned input on from: the error of one scalar loss has
       no stable ratio to CPU float32's, and where a gradient is ~1e-5 (1000 eps) a 50% difference in
       it moves the step by ~1e-3 lr, i.e. 1e-3 relative on a bias initialised to zero.

    5. **perturbed** (gradients): the device is not much further from float64 than CPU float32 runs
       whose parameters were perturbed, relatively, by the device's own forward error ``delta`` (the
       device output's normwise error against float64, capped at what criterion 2 allowed the output:
       ``multiplier * err(cpu output) + floor``): ``err(dev) <= perturbed_multiplier * max_i
       err(perturbed_i)`` over ``perturbed_draws`` seeded draws. This measures how far a correct
       float32 training step can move when its forward pass is off by what the device's rounding
       puts there, which is what a gradient behind a ReLU kink or a batch norm over few values
       depends on: one ReLU that flips changes every gradient behind it, and two CPU float32 runs
       that happen to keep it agree to 1e-6. Measured (resnet18, train, batch 4, image 224, seed 0):
       device and CPU float32 output errors 2.7e-6 and 8e-7; layer4.1.conv2.weight's gradient 8.1e-4
       on the device, 5.0e-6 on CPU float32, and 8.1e-4 and 3.5e-3 in two CPU float32 runs perturbed
       by 3e-6, with no device plan at fault (``python -m tunecl.tools.plancheck`` verifies every
       conv and GEMM plan of the net on its own). Run only when a gradient fails criteria 1-3.

    Attributes:
        output: the model's output. fp32 on both sides, but GEMM/conv tiling and tree reductions sum in
            other orders than CPU torch: ~1e-6 per op, growing with depth.
        loss: the cross-entropy loss (a mean over the batch of the output's log-softmax).
        grad: every parameter gradient. Backward doubles the depth, and batch-norm backward at batch
            1-2 over small maps amplifies rounding (resnet18 at batch 1 shows ~3e-4 with only the
            summation order of non-conv ops differing).
        param: every parameter after one Adam step, over the elements whose gradients have the same
            sign and exceed 1000 * eps. Adam's first step is ``lr * g / (|g| + eps)``, i.e.
            ``lr * sign(g)``, so a near-zero gradient whose sign differs by rounding moves a parameter
            by up to ``2 * lr``: those elements are counted and only held to that bound (against either
            reference). Elsewhere the step agrees to rounding, and 1e-4 still catches a missing or
            wrong step (``lr = 1e-3`` on weights of magnitude <= 1).
        multiplier: how much further from float64 than CPU float32 the device may be. PyTorch uses 2-3
            for float32. Measured with this tool on PoCL (the 18 nets of docs/results.md, train step,
            batch 2, seed 0), over the tensors the fixed tolerance fails: the device/CPU ratio has a
            median of about 1 and is ~2 where CPU float32 is still accurate (the tiled GEMM/conv sums
            K sequentially per work-item, CPU torch in blocks); on the chaotic last stages, where both
            float32 runs are 5-500% off float64, it reaches 6.0 on gradients (shufflenet_v2_x1_0),
            5.3 (regnet_y_400mf), 5.1 (densenet161) and 4.3 (resnet50), and 7.2 on a zero-initialised
            bias after the step (efficientnet_b4; criterion 4 covers those too). 8 keeps 1.3x headroom
            on gradients. No multiplier covers everything: where a batch-norm output sits at a ReLU's
            kink, one run's rounding flips the ReLU and the gradients behind it, and where gradients
            explode through chains of batch norms on 1x1 maps, two correct float32 runs differ by 100x
            to 10^6 (``benchmarks/fp32_spread.py``: CPU torch in channels_last layout against its
            default layout, e.g. shufflenet_v2_x1_0 seed 0), as the device does on googlenet.
        floor: added to the fp64 bound so that a CPU float32 result that happens to be exact (to a few
            ulps) does not demand an exact device result: 1e-6, about 8 float32 ulps.
        loss_own: relative bound of criterion 4; a float32 log-softmax and mean over the batch is
            accurate to a few ulps.
        perturbed_draws, perturbed_multiplier: criterion 5's number of perturbed CPU runs, and how much
            further from float64 than the furthest of them the device may be (2: two draws sample the
            spread of a random perturbation, not its maximum).
    """

    output: float = 1e-3
    loss: float = 1e-3
    grad: float = 1e-2
    param: float = 1e-4
    multiplier: float = 8.0
    floor: float = 1e-6
    loss_own: float = 1e-5
    perturbed_draws: int = 2
    perturbed_multiplier: float = 2.0

    def within_fp64(self, dev_error: float | None, cpu_error: float | None) -> bool:
        """Criterion 2: the device's error against float64 is at most ``multiplier`` x CPU float32's."""
        if dev_error is None or cpu_error is None or not math.isfinite(dev_error):
            return False
        return dev_error <= self.multiplier * cpu_error + self.floor

    def perturbation(self, dev_output_error: float | None, cpu_output_error: float | None) -> float:
        """Criterion 5's relative parameter perturbation: the device's forward error, capped."""
        if dev_output_error is None or cpu_output_error is None or not math.isfinite(dev_output_error):
            return 0.0
        return min(dev_output_error, self.multiplier * cpu_output_error + self.floor)

    def describe(self, train: bool = True) -> str:
        """One line stating the tolerances (those of a training step, or only the output's)."""
        fp64 = (f"or err vs float64 <= {self.multiplier:g} x CPU float32's + {self.floor:g} "
                f"(err: ||x - ref64|| / ||ref64||)")
        if not train:
            return f"output rel <= {self.output:g}, {fp64}"
        return (f"output rel <= {self.output:g}, loss rel <= {self.loss:g}, gradients rel <= {self.grad:g}, "
                f"parameters after one Adam step rel <= {self.param:g} (where the gradients have the "
                f"same sign), {fp64}; gradients also pass at err <= {self.perturbed_multiplier:g} x that of "
                f"CPU float32 runs with parameters perturbed by the device's forward error "
                f"({self.perturbed_draws} draws)")


@dataclasses.dataclass(frozen=True)
class Check:
    """One compared tensor: ``kind`` is output, loss, grad or param; errors are None when not compared.

    ``max_abs`` and ``max_rel`` are the device's errors against CPU float32; ``fp64_error`` and
    ``cpu_fp64_error`` the normwise errors of the device and of CPU float32 against float64, and
    ``fp64_ratio`` their ratio. ``passed_by`` names the criterion that passed (``fp32``, ``fp64``,
    ``zero``, ``own output``, ``own gradient`` or ``perturbed``; empty when the check failed), see :class:`Tolerances`.
    """

    kind: str
    name: str
    max_abs: float | None
    max_rel: float | None
    tolerance: float
    passed: bool
    note: str = ""
    fp64_error: float | None = None
    cpu_fp64_error: float | None = None
    fp64_ratio: float | None = None
    passed_by: str = ""


@dataclasses.dataclass
class ValidationReport:
    """The outcome of :func:`validate_net`. ``error`` is set when the device run raised.

    ``seconds`` holds the wall time of each run: ``cpu`` (float32), ``fp64``, ``device`` and, when
    criterion 5 was needed, ``perturbed`` (all its runs). With ``compiled``, ``compile_stats`` holds the
    compile backend's counters of the device run (:func:`tunecl.backend.compile.stats`: captures,
    replays, graphs run eagerly and why).
    """

    net: str
    device: str
    batch: int
    image_size: int
    train: bool
    tolerances: Tolerances
    checks: list[Check] = dataclasses.field(default_factory=list)
    fallback_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    plan_sources: dict[str, int] = dataclasses.field(default_factory=dict)
    error: str | None = None
    error_op: str | None = None
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    compiled: bool = False
    compile_stats: dict[str, int] | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["passed"] = self.passed
        data["tolerances_text"] = self.tolerances.describe(self.train)
        return data


def compare(kind: str, name: str, dev: Any, ref: Any, tolerance: float, mask: Any = None,
            excluded_bound: float = float("inf")) -> Check:
    """The max abs and relative error of ``dev`` against ``ref``; passes when relative <= ``tolerance``.

    The relative error is ``max|dev - ref| / max|ref|``, ``max|ref|`` taken over the whole tensor; a
    tensor whose reference is all zeros passes only when ``dev`` is all zeros too. With ``mask``, the
    errors are those of the masked elements (of all elements when none is masked), and every other
    element only has to stay within ``excluded_bound`` of the reference.
    """
    import torch

    dev, ref = _host(dev), _host(ref)
    if dev.shape != ref.shape:
        return Check(kind, name, None, None, tolerance, False,
                     f"shape {tuple(dev.shape)} != {tuple(ref.shape)}")
    if ref.numel() == 0:
        return Check(kind, name, None, None, tolerance, True, "empty", passed_by="fp32")
    if dev.dtype != ref.dtype:
        dev, ref = dev.double(), ref.double()
    # one pass per statement: a model's weights and gradients are up to 10^8 elements
    scale = torch.linalg.vector_norm(ref, float("inf")).item()
    diff = torch.sub(dev, ref).abs_()
    if not math.isfinite(diff.max().item()) and not torch.isfinite(dev).all():
        return Check(kind, name, diff.max().item(), float("nan"), tolerance, False,
                     "non-finite values on the device")
    note, passed = "", True
    if mask is not None and not mask.all():
        excluded = diff.masked_fill(mask, 0).max().item()
        passed = excluded <= excluded_bound
        note = (f"{int((~mask).sum())}/{mask.numel()} with gradients of other signs or ~0: "
                f"max abs {excluded:.2e} "
                f"({'within' if passed else 'over'} the bound 2 lr)")
        if mask.any():
            diff.masked_fill_(~mask, 0)
    worst = diff.max().item()
    rel = worst / scale if scale > 0 else (0.0 if worst == 0 else float("inf"))
    if mask is not None and not mask.any():
        return Check(kind, name, worst, rel, tolerance, passed, note, passed_by="fp32" if passed else "")
    passed = passed and rel <= tolerance
    return Check(kind, name, worst, rel, tolerance, passed, note, passed_by="fp32" if passed else "")


def normwise_error(x: Any, ref: Any, mask: Any = None) -> float:
    """``||x - ref|| / ||ref||`` (2-norms, over ``mask``'s elements); absolute when ``ref`` is all zeros.

    Computed in float64 (``ref`` is usually the float64 run).
    """
    return _normwise_errors([x], ref, mask)[0]


def _normwise_errors(xs: list[Any], ref: Any, mask: Any = None) -> list[float]:
    """:func:`normwise_error` of each of ``xs``, sharing the work on ``ref``.

    In chunks that stay in cache: a model's weights and gradients are up to 10^8 elements, and whole-
    tensor float64 temporaries made this twice as slow.
    """
    ref = _host(ref).reshape(-1)
    xs = [_host(x).reshape(-1) for x in xs]
    keep = None if mask is None else mask.reshape(-1)
    squares, scale = [0.0] * len(xs), 0.0
    for start in range(0, ref.numel(), _CHUNK):
        part = slice(start, start + _CHUNK)
        r = ref[part].double()
        if keep is not None:
            r = r.masked_fill(~keep[part], 0)
        scale += r.dot(r).item()
        for i, x in enumerate(xs):
            diff = r - x[part]   # float64 by type promotion
            if keep is not None:
                diff.masked_fill_(~keep[part], 0)
            squares[i] += diff.dot(diff).item()
    scale = math.sqrt(scale)
    return [math.sqrt(sq) / scale if scale > 0 else math.sqrt(sq) for sq in squares]


def judge_fp64(check: Check, dev: Any, cpu: Any, ref64: Any, tol: Tolerances, mask: Any = None,
               excluded_bound: float = float("inf")) -> Check:
    """``check`` (against CPU float32) with the float64 errors added; passes too on criterion 2.

    With ``mask``, the errors are those of the masked elements, and the device's other elements must
    stay within ``excluded_bound`` of ``ref64`` for criterion 2 to pass.
    """
    import torch

    dev, ref64 = _host(dev), _host(ref64)
    if dev.shape != ref64.shape or ref64.numel() == 0:
        return check
    dev_error, cpu_error = _normwise_errors([dev, cpu], ref64, mask)
    ratio = dev_error / cpu_error if cpu_error > 0 else (1.0 if dev_error == 0 else float("inf"))
    check = dataclasses.replace(check, fp64_error=dev_error, cpu_fp64_error=cpu_error, fp64_ratio=ratio)
    if check.passed or not math.isfinite(dev_error):
        return check
    inside = mask is None or bool(mask.all()) or \
        torch.sub(ref64, dev).abs_().masked_fill_(mask, 0).max().item() <= excluded_bound
    if inside and tol.within_fp64(dev_error, cpu_error):
        return dataclasses.replace(check, passed=True, passed_by="fp64")
    return check


def _host(tensor: Any) -> Any:
    return tensor.detach().cpu()


def validate_net(net: str, *, device: str | None = None, train: bool = False, batch: int = 2,
                 image_size: int = 64, seed: int = 0, tolerances: Tolerances | None = None,
                 compiled: bool = False) -> ValidationReport:
    """Run ``net`` on the opencl device, on the CPU and on the CPU in float64; compare.

    Args:
        net: torchvision model name, ``hf:bert`` / ``hf:gpt2`` (:mod:`tunecl.language_models`) or
            ``package.module:factory`` (random weights, seeded by ``seed``).
        image_size: the input's height and width; a language model's sequence length.
        device: OpenCL device selector for ``opencl:0`` (see :func:`tunecl.tools.use_device`).
        train: compare a training step (forward, loss, backward, one Adam step) instead of inference.
        compiled: run the device's step through ``torch.compile(..., backend="tunecl")`` and compare its
            replay (module docstring).

    Returns:
        The report; an exception on the device (e.g. ``FallbackError`` under ``TUNECL_FALLBACK=error``)
        is caught and recorded in ``error`` and ``error_op`` as a failure.

    Raises:
        TuneclError: unknown model or device, or an input the model cannot take (also on the CPU).
    """
    import torch

    tolerances = tolerances or Tolerances()
    device_name = use_device(device)
    torch.manual_seed(seed)
    cpu_model = load_model(net, image_size)
    dev_model = load_model(net, image_size)
    dev_model.load_state_dict(cpu_model.state_dict())
    # before the CPU run's Adam step changes the weights
    fp64_model = copy.deepcopy(cpu_model).double()
    initial = {n: p.detach().clone() for n, p in cpu_model.named_parameters()} if train else None
    initial_state = copy.deepcopy(cpu_model.state_dict()) if train else None
    x, y = make_batch(cpu_model, batch, image_size, train, seed)
    report = ValidationReport(net, f"opencl:0 {device_name}", batch, image_size, train, tolerances,
                              compiled=compiled)

    try:
        reference = _timed(report, "cpu", _run, cpu_model, x, y, "cpu", train, seed)
        x64 = x.double() if x.is_floating_point() else x   # (token ids stay integers)
        reference64 = _timed(report, "fp64", _run, fp64_model, x64, y, "cpu", train, seed)
    except (RuntimeError, ValueError) as error:   # e.g. train-mode batch norm over one value per channel
        raise TuneclError(f"the CPU reference run failed, so there is nothing to compare with: "
                          f"{str(error).splitlines()[0]}") from None
    del cpu_model, fp64_model
    if initial is not None:
        reference["initial"] = initial

    import tunecl.backend

    tunecl.backend.reset_stats()
    if compiled:
        _reset_compiled()
    try:
        result = _timed(report, "device", _run, dev_model.to("opencl"), x, y, "opencl", train, seed, compiled)
    except (RuntimeError, ValueError) as error:   # FallbackError is a RuntimeError
        report.error = f"{type(error).__name__}: {error}"
        match = re.search(r"\b(aten::[\w.]+)", str(error))
        report.error_op = match.group(1) if match else None
        result = None
    if compiled:
        report.compile_stats = _reset_compiled()
    stats = tunecl.backend.stats()
    report.fallback_ops = dict(sorted(stats["fallback_ops"].items(), key=lambda kv: -kv[1]))
    report.plan_sources = dict(stats["plan_sources"])
    if result is not None:
        report.checks = _checks(reference, result, tolerances, reference64)
        if train and any(c.kind == "grad" and not c.passed and c.fp64_error is not None for c in report.checks):
            output = report.checks[0]
            delta = tolerances.perturbation(output.fp64_error, output.cpu_fp64_error)
            if delta > 0:
                perturbed = _timed(report, "perturbed", _perturbed_runs, net, image_size, initial_state, x, y,
                                   seed, delta, tolerances.perturbed_draws)
                report.checks = [_judge_perturbed(c, perturbed, reference64, delta, tolerances)
                                 for c in report.checks]
    return report


def _perturbed_runs(net: str, image_size: int, state: dict[str, Any], x: Any, y: Any, seed: int, delta: float,
                    draws: int) -> list[dict[str, Any]]:
    """Criterion 5's references: CPU float32 training steps with every parameter scaled by
    ``1 + delta * N(0, 1)`` (seeded draws ``0 .. draws-1``)."""
    import torch

    runs = []
    for draw in range(draws):
        model = load_model(net, image_size)
        model.load_state_dict(state)
        generator = torch.Generator().manual_seed(draw)
        with torch.no_grad():
            for p in model.parameters():
                noise = torch.randn(p.shape, generator=generator, dtype=torch.float64)
                p.copy_((p.double() * (1 + delta * noise)).to(p.dtype))
        runs.append(_run(model, x, y, "cpu", True, seed))
    return runs


def _judge_perturbed(check: Check, perturbed: list[dict[str, Any]], ref64: dict[str, Any], delta: float,
                     tol: Tolerances) -> Check:
    """Criterion 5 for a failed gradient check (others are returned unchanged)."""
    if check.passed or check.kind != "grad" or check.fp64_error is None:
        return check
    g64 = ref64["grads"][check.name]
    errors = _normwise_errors([run["grads"][check.name] for run in perturbed], g64)
    bound = tol.perturbed_multiplier * max(errors)
    passed = check.fp64_error <= bound
    note = f"perturbed by {delta:.1e}: CPU float32 errs {', '.join(f'{e:.1e}' for e in errors)}"
    if passed:
        note += f", device {check.fp64_error:.1e} <= {bound:.1e}"
    return dataclasses.replace(check, passed=passed, passed_by="perturbed" if passed else "",
                               note="; ".join(n for n in (check.note, note) if n))


def _timed(report: ValidationReport, key: str, function: Any, *args: Any) -> Any:
    start = time.perf_counter()
    result = function(*args)
    report.seconds[key] = round(time.perf_counter() - start, 3)
    return result


def _reset_compiled() -> dict[str, int]:
    """Free the compiled graphs and start the compile counters afresh; the counters so far."""
    import torch

    from tunecl.backend import compile as tunecl_compile

    counters = tunecl_compile.stats()
    torch._dynamo.reset()
    tunecl_compile.reset_stats()
    return counters


def _run(model: Any, x: Any, y: Any, device: str, train: bool, seed: int,
         compiled: bool = False) -> dict[str, Any]:
    """Output (and with ``train``: loss, gradients, parameters after one Adam step) on ``device``.

    With ``train`` also ``own_loss``: the float64 cross-entropy of the output, computed on the CPU. With
    ``compiled``, the model and the (capturable) Adam step run through ``torch.compile(...,
    backend="tunecl")``, :data:`COMPILED_CALLS` times from the same weights, optimizer state and seed; the
    results are the last call's.
    """
    import torch
    import torch.nn.functional as F

    calls = COMPILED_CALLS if compiled else 1
    if compiled:
        from tunecl.backend.compile import tunecl_backend
    forward = torch.compile(model, backend=tunecl_backend) if compiled else model
    if not train:
        model.eval()
        with torch.no_grad():
            for _ in range(calls):
                torch.manual_seed(seed)   # the same dropout masks: the device draws them from the CPU generator
                out = forward(x.to(device))
        return {"output": out.cpu()}
    model.train()
    # (capturable: the step count lives on the device, so the compiled step replays)
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM_LR, eps=ADAM_EPS, capturable=compiled)
    step = torch.compile(optimizer.step, backend=tunecl_backend) if compiled else optimizer.step
    start = _cloned_state(model) if compiled else None
    for call in range(calls):
        if call:   # back to the start, in place (the replays read the same tensors)
            model.load_state_dict(start)
            for value in (v for state in optimizer.state.values() for v in state.values()):
                value.zero_()   # the moments and the step count
        torch.manual_seed(seed)
        optimizer.zero_grad()
        out = forward(x.to(device))
        loss = F.cross_entropy(out, y.to(device))
        loss.backward()
        grads = {n: (p.grad.cpu() if p.grad is not None else None) for n, p in model.named_parameters()}
        step()
    params = {n: p.detach().cpu() for n, p in model.named_parameters()}
    out = out.detach().cpu()
    return {"output": out, "loss": loss.detach().cpu(), "grads": grads, "params": params,
            "own_loss": F.cross_entropy(out.double(), y)}


def _cloned_state(model: Any) -> Any:
    """``model.state_dict()`` with every tensor cloned and the dict's ``_metadata`` kept (modules check
    their state's version when it is loaded back, e.g. torchvision's MNASNet)."""
    state = model.state_dict()
    cloned = type(state)((k, v.clone()) for k, v in state.items())
    cloned._metadata = getattr(state, "_metadata", None)
    return cloned


def _largest(grads: dict[str, Any]) -> float:
    import torch

    return max((torch.linalg.vector_norm(g, float("inf")).item() for g in grads.values()
                if g is not None and g.numel()), default=0.0)


def _zero_gradient(check: Check, g_dev: Any, refs: list[tuple[Any, float]], tol: Tolerances) -> Check:
    """Criterion 3: ``check`` passes when a reference holds only rounding noise and the device too."""
    for g_ref, largest in refs:
        zero_below = NUMERICALLY_ZERO * largest
        if g_ref.shape != g_dev.shape or not g_ref.numel() or g_ref.abs().max().item() >= zero_below:
            continue
        worst = (g_dev.detach().double() - g_ref.detach().double()).abs().max().item()
        if worst <= tol.grad * zero_below:
            return dataclasses.replace(check, passed=True, passed_by="zero", note=(
                f"numerically zero gradient: abs <= {tol.grad * zero_below:.2e} passes"))
    return check


def _checks(ref: dict[str, Any], dev: dict[str, Any], tol: Tolerances,
            ref64: dict[str, Any] | None = None) -> list[Check]:
    """Every check of a run ``dev`` against CPU float32 ``ref`` and, when given, float64 ``ref64``."""
    def fp64(check: Check, dev_value: Any, key: str, name: str | None = None, **kwargs: Any) -> Check:
        if ref64 is None:
            return check
        value64, value32 = (ref64[key], ref[key]) if name is None else (ref64[key][name], ref[key][name])
        if value64 is None or value32 is None or dev_value is None:
            return check
        return judge_fp64(check, dev_value, value32, value64, tol, **kwargs)

    output = fp64(compare("output", "output", dev["output"], ref["output"], tol.output), dev["output"], "output")
    if output.passed and not ref["output"].any():
        output = dataclasses.replace(output, note="; ".join(n for n in (output.note, (
            "the output is all zeros on both sides (a zero-initialised head, as in vit_*): --train checks "
            "the layers before it through their gradients")) if n))
    checks = [output]
    if "loss" not in ref:
        return checks
    loss = fp64(compare("loss", "loss", dev["loss"], ref["loss"], tol.loss), dev["loss"], "loss")
    if not loss.passed and "own_loss" in dev:
        loss = _own(loss, dev["loss"], dev["own_loss"], tol.loss_own, "float64 cross-entropy of the "
                    "device's output")
    checks.append(loss)

    zero_refs = [(ref["grads"], _largest(ref["grads"]))]
    if ref64 is not None:
        zero_refs.append((ref64["grads"], _largest(ref64["grads"])))
    for name, g_ref in ref["grads"].items():
        g_dev = dev["grads"][name]
        if g_ref is None or g_dev is None:
            same = g_ref is None and g_dev is None
            checks.append(Check("grad", name, None, None, tol.grad, same,
                                "no gradient" if same else "a gradient on one side only",
                                passed_by="fp32" if same else ""))
            continue
        check = fp64(compare("grad", name, g_dev, g_ref, tol.grad), g_dev, "grads", name)
        if not check.passed and check.max_abs is not None:
            check = _zero_gradient(check, g_dev, [(grads[name], largest) for grads, largest in zero_refs
                                                  if grads[name] is not None], tol)
        checks.append(check)

    for name, p_ref in ref["params"].items():
        g_ref, g_dev = ref["grads"][name], dev["grads"][name]
        mask = _same_sign(g_ref, g_dev)
        # |step| <= lr, so a sign flip moves a parameter by at most 2 lr (plus rounding)
        bound = 2 * ADAM_LR * (1 + 1e-3) + 1e-6 * p_ref.abs().max().item()
        check = compare("param", name, dev["params"][name], p_ref, tol.param, mask, excluded_bound=bound)
        if ref64 is not None:
            g64 = ref64["grads"][name]
            mask64 = None if mask is None or g64 is None else mask & _same_sign(g64, g_ref)
            check = fp64(check, dev["params"][name], "params", name, mask=mask64, excluded_bound=bound)
        if not check.passed and "initial" in ref:
            implied = ref["initial"][name].double()
            if g_dev is not None:   # Adam's first step, in float64
                implied = implied - ADAM_LR * g_dev.double() / (g_dev.double().abs() + ADAM_EPS)
            check = _own(check, dev["params"][name], implied, tol.param, "Adam step on the device's own "
                         "gradient")
        checks.append(check)
    return checks


def _own(check: Check, value: Any, implied: Any, tolerance: float, what: str) -> Check:
    """Criterion 4: ``check`` passes when ``value`` is what the run's own output or gradient implies."""
    value, implied = value.detach().cpu().double(), implied.detach().cpu().double()
    if value.shape != implied.shape or not value.numel():
        return check
    scale = implied.abs().max().item()
    worst = (value - implied).abs().max().item()
    error = worst / scale if scale > 0 else worst
    if error > tolerance:
        return check
    note = "; ".join(n for n in (check.note, f"{what}: rel {error:.2e}") if n)
    return dataclasses.replace(check, passed=True, passed_by="own output" if check.kind == "loss" else
                               "own gradient", note=note)


def _same_sign(*grads: Any) -> Any:
    """Where all ``grads`` clearly agree in sign (both Adam steps are lr * sign(g) to 0.1%), or None."""
    import torch

    if any(g is None for g in grads) or len({tuple(g.shape) for g in grads}) != 1:
        return None
    flat = [g.reshape(-1) for g in grads]
    mask = torch.empty(flat[0].numel(), dtype=torch.bool)
    for start in range(0, mask.numel(), _CHUNK):   # in cache-sized chunks, as _normwise_errors
        part = slice(start, start + _CHUNK)
        first = flat[0][part]
        agree = first.abs() > SIGN_FLOOR
        for g in flat[1:]:
            # a positive product is the same sign; products of |g| > 1e-5 do not underflow
            agree &= (g[part].abs() > SIGN_FLOOR) & (g[part] * first > 0)
        mask[part] = agree
    return mask.reshape(grads[0].shape)
