"""What passes in ``tunecl validate``: the tolerances, and one tensor compared with CPU float32 and float64.

:class:`Tolerances` states the five criteria a compared tensor may pass on and why each bound is what it
is; :func:`compare` judges a tensor against CPU float32 (criterion 1) and :func:`judge_fp64` against the
float64 run (criterion 2), each giving a :class:`Check`. The checks of a whole run are
:mod:`tunecl.tools.step_checks`; the runs are :mod:`tunecl.tools.validate`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

ADAM_LR = 1e-3
ADAM_EPS = 1e-8
# Adam's first step is lr * g / (|g| + eps): it is lr * sign(g) to 0.1% once |g| > 1000 * eps
SIGN_FLOOR = 1000 * ADAM_EPS
# elements per step of the float64 error sums (2 MiB of float64: stays in cache)
CHUNK = 1 << 18


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
    return normwise_errors([x], ref, mask)[0]


def normwise_errors(xs: list[Any], ref: Any, mask: Any = None) -> list[float]:
    """:func:`normwise_error` of each of ``xs``, sharing the work on ``ref``.

    In chunks that stay in cache: a model's weights and gradients are up to 10^8 elements, and whole-
    tensor float64 temporaries made this twice as slow.
    """
    ref = _host(ref).reshape(-1)
    xs = [_host(x).reshape(-1) for x in xs]
    keep = None if mask is None else mask.reshape(-1)
    squares, scale = [0.0] * len(xs), 0.0
    for start in range(0, ref.numel(), CHUNK):
        part = slice(start, start + CHUNK)
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
    dev_error, cpu_error = normwise_errors([dev, cpu], ref64, mask)
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


def same_sign(*grads: Any) -> Any:
    """Where all ``grads`` clearly agree in sign (both Adam steps are lr * sign(g) to 0.1%), or None."""
    import torch

    if any(g is None for g in grads) or len({tuple(g.shape) for g in grads}) != 1:
        return None
    flat = [g.reshape(-1) for g in grads]
    mask = torch.empty(flat[0].numel(), dtype=torch.bool)
    for start in range(0, mask.numel(), CHUNK):   # in cache-sized chunks, as normwise_errors
        part = slice(start, start + CHUNK)
        first = flat[0][part]
        agree = first.abs() > SIGN_FLOOR
        for g in flat[1:]:
            # a positive product is the same sign; products of |g| > 1e-5 do not underflow
            agree &= (g[part].abs() > SIGN_FLOOR) & (g[part] * first > 0)
        mask[part] = agree
    return mask.reshape(grads[0].shape)
