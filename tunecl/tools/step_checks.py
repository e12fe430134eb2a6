"""The checks of one run of a model in ``tunecl validate``: its output, loss, gradients and parameters
after the Adam step against CPU float32 and float64, with the criteria that judge a whole run (a
numerically zero gradient, the device's own output or gradient, CPU runs perturbed by the device's
forward error; see :class:`~tunecl.tools.tolerances.Tolerances`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tunecl.tools.tolerances import (
    ADAM_EPS,
    ADAM_LR,
    Check,
    Tolerances,
    compare,
    judge_fp64,
    normwise_errors,
    same_sign,
)

# a gradient tensor this much smaller than the model's largest is rounding noise around zero
NUMERICALLY_ZERO = 1e-4


def check_run(ref: dict[str, Any], dev: dict[str, Any], tol: Tolerances,
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
        mask = same_sign(g_ref, g_dev)
        # |step| <= lr, so a sign flip moves a parameter by at most 2 lr (plus rounding)
        bound = 2 * ADAM_LR * (1 + 1e-3) + 1e-6 * p_ref.abs().max().item()
        check = compare("param", name, dev["params"][name], p_ref, tol.param, mask, excluded_bound=bound)
        if ref64 is not None:
            g64 = ref64["grads"][name]
            mask64 = None if mask is None or g64 is None else mask & same_sign(g64, g_ref)
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


def judge_perturbed(check: Check, perturbed: list[dict[str, Any]], ref64: dict[str, Any], delta: float,
                    tol: Tolerances) -> Check:
    """Criterion 5 for a failed gradient check (others are returned unchanged)."""
    if check.passed or check.kind != "grad" or check.fp64_error is None:
        return check
    g64 = ref64["grads"][check.name]
    errors = normwise_errors([run["grads"][check.name] for run in perturbed], g64)
    bound = tol.perturbed_multiplier * max(errors)
    passed = check.fp64_error <= bound
    note = f"perturbed by {delta:.1e}: CPU float32 errs {', '.join(f'{e:.1e}' for e in errors)}"
    if passed:
        note += f", device {check.fp64_error:.1e} <= {bound:.1e}"
    return dataclasses.replace(check, passed=passed, passed_by="perturbed" if passed else "",
                               note="; ".join(n for n in (check.note, note) if n))
