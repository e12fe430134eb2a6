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
device is not much further from float64 than CPU float32 is: :class:`~tunecl.tools.tolerances.Tolerances`
says why each bound is what it is. One tensor is compared in :mod:`tunecl.tools.tolerances`, a whole run
in :mod:`tunecl.tools.step_checks`; this module makes the runs and the report.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import time
from typing import Any

from tunecl import config
from tunecl.errors import TuneclError
from tunecl.tools import load_model, make_batch, use_device
from tunecl.tools.step_checks import check_run, judge_perturbed
from tunecl.tools.tolerances import ADAM_EPS, ADAM_LR, Check, Tolerances

# calls of a compiled step: the backend's graphs run eagerly first, are captured on the second call
# and replay from the third
COMPILED_CALLS = 3


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
    tolerances = tolerances or Tolerances()
    device_name = use_device(device)
    # (the float64 copy is made before the CPU run's Adam step changes the weights)
    cpu_model, dev_model, fp64_model = seeded_models(net, image_size, seed)
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
        raise reference_failed(error) from None
    del cpu_model, fp64_model
    if initial is not None:
        reference["initial"] = initial

    import tunecl.backend

    tunecl.backend.reset_stats()
    if compiled:
        _reset_compiled()
    try:
        with config.override(random="host"):   # the CPU's dropout masks (tunecl.backend.random_draws)
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
        report.checks = check_run(reference, result, tolerances, reference64)
        if train and any(c.kind == "grad" and not c.passed and c.fp64_error is not None for c in report.checks):
            output = report.checks[0]
            delta = tolerances.perturbation(output.fp64_error, output.cpu_fp64_error)
            if delta > 0:
                perturbed = _timed(report, "perturbed", _perturbed_runs, net, image_size, initial_state, x, y,
                                   seed, delta, tolerances.perturbed_draws)
                report.checks = [judge_perturbed(c, perturbed, reference64, delta, tolerances)
                                 for c in report.checks]
    return report


def seeded_models(net: str, image_size: int, seed: int) -> tuple[Any, Any, Any]:
    """Three copies of ``net`` with the same weights, drawn after ``torch.manual_seed(seed)``: for the CPU in
    float32, for the device (still on the CPU) and for the CPU in float64."""
    import torch

    torch.manual_seed(seed)
    cpu_model = load_model(net, image_size)
    dev_model = load_model(net, image_size)
    dev_model.load_state_dict(cpu_model.state_dict())
    return cpu_model, dev_model, copy.deepcopy(cpu_model).double()


def reference_failed(error: Exception) -> TuneclError:
    """The error to raise when a CPU reference run raised ``error``."""
    return TuneclError(f"the CPU reference run failed, so there is nothing to compare with: "
                       f"{str(error).splitlines()[0]}")


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
                torch.manual_seed(seed)   # the same dropout masks: drawn on the host from the CPU generator
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
