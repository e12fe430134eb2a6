"""``tunecl validate``: a whole model on the opencl device against the same model on CPU torch.

Both copies get the same weights (the CPU model's ``state_dict``) and the same inputs. Without
``train``: one eval-mode forward, and the outputs are compared. With ``train``: a train-mode forward,
cross-entropy loss, backward and one Adam step on each, and the output, the loss, every parameter's
gradient and every parameter after the step are compared.

Each check reports the max absolute error and the relative error ``max|dev - cpu| / max|cpu|`` of one
tensor, against the tolerances of :class:`Tolerances` (why they are what they are is written there).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from tunecl.errors import TuneclError
from tunecl.tools import load_model, make_inputs, output_classes, use_device

ADAM_LR = 1e-3
ADAM_EPS = 1e-8
# Adam's first step is lr * g / (|g| + eps): it is lr * sign(g) to 0.1% once |g| > 1000 * eps
SIGN_FLOOR = 1000 * ADAM_EPS
# a gradient tensor this much smaller than the model's largest is rounding noise around zero
NUMERICALLY_ZERO = 1e-4


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """Largest relative errors (``max|dev - cpu| / max|cpu|`` per tensor) that pass.

    Attributes:
        output: the model's output. fp32 on both sides, but GEMM/conv tiling and tree reductions sum in
            other orders than CPU torch: ~1e-6 per op, growing with depth; train-mode batch norm at a
            small batch divides by small standard deviations and amplifies it.
        loss: the cross-entropy loss (a mean over the batch of the output's log-softmax).
        grad: every parameter gradient. Backward doubles the depth, and batch-norm backward at batch
            1-2 over small maps amplifies again (resnet18 at batch 1 shows ~3e-4 with only the
            summation order of non-conv ops differing). A gradient that is zero in exact arithmetic
            (a conv bias right before batch norm) holds only rounding noise on both sides: a tensor
            whose ``max|cpu| < 1e-4 * G`` (``G``: the model's largest gradient entry) passes when
            ``max|dev - cpu| <= grad * 1e-4 * G``.
        param: every parameter after one Adam step, over the elements whose two gradients have the
            same sign and exceed 1000 * eps. Adam's first step is ``lr * g / (|g| + eps)``, i.e.
            ``lr * sign(g)``, so a near-zero gradient whose sign differs by rounding moves a parameter
            by up to ``2 * lr``: those elements are counted and only held to that bound. Elsewhere the
            step agrees to rounding, and 1e-4 still catches a missing or wrong step (``lr = 1e-3`` on
            weights of magnitude ≤ 1).
    """

    output: float = 1e-3
    loss: float = 1e-3
    grad: float = 1e-2
    param: float = 1e-4

    def describe(self, train: bool = True) -> str:
        """One line stating the tolerances (those of a training step, or only the output's)."""
        if not train:
            return f"output rel <= {self.output:g}"
        return (f"output rel <= {self.output:g}, loss rel <= {self.loss:g}, gradients rel <= {self.grad:g}, "
                f"parameters after one Adam step rel <= {self.param:g} (where both gradients have the "
                f"same sign)")


@dataclasses.dataclass(frozen=True)
class Check:
    """One compared tensor: ``kind`` is output, loss, grad or param; errors are None when not compared."""

    kind: str
    name: str
    max_abs: float | None
    max_rel: float | None
    tolerance: float
    passed: bool
    note: str = ""


@dataclasses.dataclass
class ValidationReport:
    """The outcome of :func:`validate_net`. ``error`` is set when the device run raised."""

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

    dev, ref = dev.detach().cpu().double(), ref.detach().cpu().double()
    if dev.shape != ref.shape:
        return Check(kind, name, None, None, tolerance, False,
                     f"shape {tuple(dev.shape)} != {tuple(ref.shape)}")
    if ref.numel() == 0:
        return Check(kind, name, None, None, tolerance, True, "empty")
    scale = ref.abs().max().item()
    diff = (dev - ref).abs()
    if not torch.isfinite(dev).all():
        return Check(kind, name, diff.max().item(), float("nan"), tolerance, False,
                     "non-finite values on the device")
    note, passed = "", True
    if mask is not None and not mask.all():
        excluded = diff[~mask].max().item()
        passed = excluded <= excluded_bound
        note = (f"{int((~mask).sum())}/{mask.numel()} with gradients of other signs or ~0: "
                f"max abs {excluded:.2e} "
                f"({'within' if passed else 'over'} the bound 2 lr)")
        if mask.any():
            diff = diff[mask]
    worst = diff.max().item()
    rel = worst / scale if scale > 0 else (0.0 if worst == 0 else float("inf"))
    if mask is not None and not mask.any():
        return Check(kind, name, worst, rel, tolerance, passed, note)
    return Check(kind, name, worst, rel, tolerance, passed and rel <= tolerance, note)


def validate_net(net: str, *, device: str | None = None, train: bool = False, batch: int = 2,
                 image_size: int = 64, seed: int = 0,
                 tolerances: Tolerances | None = None) -> ValidationReport:
    """Run ``net`` on the opencl device and on the CPU with the same weights and inputs; compare.

    Args:
        net: torchvision model name or ``package.module:factory`` (random weights, seeded by ``seed``).
        device: OpenCL device selector for ``opencl:0`` (see :func:`tunecl.tools.use_device`).
        train: compare a training step (forward, loss, backward, one Adam step) instead of inference.

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
    cpu_model = load_model(net)
    dev_model = load_model(net)
    dev_model.load_state_dict(cpu_model.state_dict())
    classes = output_classes(cpu_model, batch, image_size, train)
    x, y = make_inputs(batch, image_size, classes, seed)
    report = ValidationReport(net, f"opencl:0 {device_name}", batch, image_size, train, tolerances)

    try:
        reference = _run(cpu_model, x, y, "cpu", train, seed)
    except (RuntimeError, ValueError) as error:   # e.g. train-mode batch norm over one value per channel
        raise TuneclError(f"the CPU reference run failed, so there is nothing to compare with: "
                          f"{str(error).splitlines()[0]}") from None

    import tunecl.backend

    tunecl.backend.reset_stats()
    try:
        result = _run(dev_model.to("opencl"), x, y, "opencl", train, seed)
    except (RuntimeError, ValueError) as error:   # FallbackError is a RuntimeError
        report.error = f"{type(error).__name__}: {error}"
        match = re.search(r"\b(aten::[\w.]+)", str(error))
        report.error_op = match.group(1) if match else None
        result = None
    stats = tunecl.backend.stats()
    report.fallback_ops = dict(sorted(stats["fallback_ops"].items(), key=lambda kv: -kv[1]))
    report.plan_sources = dict(stats["plan_sources"])
    if result is not None:
        report.checks = _checks(reference, result, tolerances)
    return report


def _run(model: Any, x: Any, y: Any, device: str, train: bool, seed: int) -> dict[str, Any]:
    """Output (and with ``train``: loss, gradients, parameters after one Adam step) on ``device``."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)   # the same dropout masks: the device draws them from the CPU generator
    if not train:
        with torch.no_grad():
            return {"output": model.eval()(x.to(device)).cpu()}
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM_LR, eps=ADAM_EPS)
    optimizer.zero_grad()
    out = model(x.to(device))
    loss = F.cross_entropy(out, y.to(device))
    loss.backward()
    grads = {n: (p.grad.cpu() if p.grad is not None else None) for n, p in model.named_parameters()}
    optimizer.step()
    params = {n: p.detach().cpu() for n, p in model.named_parameters()}
    return {"output": out.detach().cpu(), "loss": loss.detach().cpu(), "grads": grads, "params": params}


def _checks(ref: dict[str, Any], dev: dict[str, Any], tol: Tolerances) -> list[Check]:
    checks = [compare("output", "output", dev["output"], ref["output"], tol.output)]
    if "loss" not in ref:
        return checks
    checks.append(compare("loss", "loss", dev["loss"], ref["loss"], tol.loss))
    largest = max((g.abs().max().item() for g in ref["grads"].values() if g is not None and g.numel()),
                  default=0.0)
    zero_below = NUMERICALLY_ZERO * largest
    for name, g_ref in ref["grads"].items():
        g_dev = dev["grads"][name]
        if g_ref is None or g_dev is None:
            same = g_ref is None and g_dev is None
            checks.append(Check("grad", name, None, None, tol.grad, same,
                                "no gradient" if same else "a gradient on one side only"))
            continue
        check = compare("grad", name, g_dev, g_ref, tol.grad)
        if (not check.passed and check.max_abs is not None and g_ref.numel()
                and g_ref.abs().max().item() < zero_below and check.max_abs <= tol.grad * zero_below):
            check = dataclasses.replace(check, passed=True, note=(
                f"numerically zero gradient: abs <= {tol.grad * zero_below:.2e} passes"))
        checks.append(check)
    for name, p_ref in ref["params"].items():
        g_ref, g_dev = ref["grads"][name], dev["grads"][name]
        mask = None
        if g_ref is not None and g_dev is not None and g_ref.shape == g_dev.shape:
            # where both gradients clearly agree in sign, both steps are lr * sign(g) to 0.1%
            mask = (g_ref.sign() == g_dev.sign()) & (g_ref.abs() > SIGN_FLOOR) & (g_dev.abs() > SIGN_FLOOR)
        # |step| <= lr, so a sign flip moves a parameter by at most 2 lr (plus rounding)
        checks.append(compare("param", name, dev["params"][name], p_ref, tol.param, mask,
                              excluded_bound=2 * ADAM_LR * (1 + 1e-3) + 1e-6 * p_ref.abs().max().item()))
    return checks
