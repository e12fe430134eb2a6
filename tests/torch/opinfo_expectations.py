"""What the OpInfo suite (test_opinfo.py) expects of particular ops, each with its reason.

Random ops are compared like any other: the device draws from torch's CPU generator with the calls the
CPU kernels make (see tunecl/backend/ops/creation.py), so under one seed both sides draw the same numbers.
"""

from __future__ import annotations

from typing import Any


class NotStrided(Exception):
    """A sample with a sparse or otherwise non-strided tensor (opencl tensors are strided)."""


_UNINITIALISED = "returns uninitialised memory: its values differ between any two allocations"

# Ops whose opencl and CPU results may legitimately differ: never compared.
SKIP: dict[str, str] = {
    "empty": _UNINITIALISED,
    "empty_like": _UNINITIALISED,
    "empty_permuted": _UNINITIALISED,
    "empty_strided": _UNINITIALISED,
    "new_empty": _UNINITIALISED,
    "new_empty_strided": _UNINITIALISED,
    "to": "its samples convert to the CPU and float64 (moves between devices are tested in test_copies.py)",
}

# Samples that are not compared: op -> (predicate on the CPU sample, reason).
SKIP_SAMPLES: dict[str, tuple[Any, str]] = {
    "nn.functional.scaled_dot_product_attention": (
        lambda s: s.kwargs.get("dropout_p", 0) > 0,
        "with dropout the CPU's fused attention kernel and the device's math path draw the mask differently"),
}

# Ops whose tensor arguments (all but the input) stay on the CPU, as torch requires.
CPU_ARGS: dict[str, str] = {
    "tensor_split": "tensor_indices_or_sections must be a CPU tensor (torch checks it)",
}

# Errors that refuse a sample clearly: message pattern -> why it is accepted.
CLEAR_ERRORS: dict[str, str] = {
    r"\w+ is not supported on the OpenCL device; use \w+": "a dtype the device does not store (named, with "
                                                            "what to use)",
    r"opencl tensors are strided only": "a sparse (or other non-strided) result",
}

_FLOAT64_INSIDE = ("makes float64 tensors inside (its decomposition or derivative); runs on the CPU as a whole "
                   "(fallback.CPU_AUTOGRAD_OPS)")
# Ops that must match: a clear error for them is a failure. op -> why they can.
MUST_MATCH: dict[str, str] = {
    **{name: _FLOAT64_INSIDE for name in (
        "quantile", "nanquantile", "renorm", "linalg.lstsq", "linalg.lstsq.grad_oriented", "linalg.matrix_rank",
        "linalg.matrix_rank.hermitian", "linalg.pinv", "linalg.pinv.hermitian", "linalg.pinv.singular",
        "pinverse")},
    "nn.functional.batch_norm": "an empty input's statistics are float32 (ops/composite.py), not the CPU's "
                                "accumulate type",
}

# Looser comparisons than assert_close's defaults: op -> keyword arguments of assert_close, with the reason.
TOLERANCES: dict[str, dict[str, float]] = {
    "nn.functional.scaled_dot_product_attention": {"atol": 5e-5, "rtol": 5e-5},
    "nn.functional.conv3d": {"atol": 1e-4, "rtol": 1e-5},
    "nn.functional.conv_transpose3d": {"atol": 1e-4, "rtol": 1e-5},
    "matmul": {"atol": 5e-5, "rtol": 1e-5},
    "__rmatmul__": {"atol": 5e-5, "rtol": 1e-5},
}
GRAD_TOLERANCES: dict[str, dict[str, float]] = {
    "ldexp": {"atol": 1e-5, "rtol": 5e-6},
    "native_layer_norm": {"atol": 1e-4, "rtol": 1.3e-6},
    "nn.functional.layer_norm": {"atol": 1e-4, "rtol": 1.3e-6},
    "nn.functional.conv3d": {"atol": 1e-4, "rtol": 1e-5},
    "nn.functional.conv_transpose3d": {"atol": 1e-4, "rtol": 1e-5},
}
TOLERANCE_REASONS: dict[str, str] = {
    "nn.functional.scaled_dot_product_attention": "the CPU runs its fused flash-attention kernel (blockwise "
    "online softmax), the device torch's math path (matmul, softmax, matmul): float32 sums in another order "
    "differ by ~1e-5",
    "ldexp": "the gradient of a 0-dim exponent sums input * ln2 * 2**other over the input's elements, and those "
    "terms cancel (sample 3: 50 terms, sum |t| = 3327 against a sum of -28.85): the device's serial float32 sum "
    "and the CPU's vectorised one differ by 8.4e-5 (2.9e-6 relative, on the H200; its pow is 1 ulp off too)",
    **{name: "sample 12 (a (5, 5, 10, 10) by (10,) product of values up to 9 in magnitude): CPU torch's float32 "
       "result is 1.8e-5 from float64 and the device's 2.3e-5 (sums of 10 products cancelling, in another "
       "order), so the two are 2.1e-5 apart (4.3e-6 relative)" for name in ("matmul", "__rmatmul__")},
    **{name: "each result sums products of values up to 9 in magnitude in the 2-d plans' order per depth tap, "
       "then over the taps, the CPU in another order: conv3d's outputs of 64 products (sample 12) 4.2e-5 apart "
       "where they cancel to ~1, its weight gradients of 1,320 products (sample 8) 3.4e-5 apart (2.2e-6 "
       "relative); conv_transpose3d's outputs 3.1e-5 apart (sample 0, 7.4e-6 relative)"
       for name in ("nn.functional.conv3d", "nn.functional.conv_transpose3d")},
    **{name: "over one element the input gradient is exactly 0 (g - mean(g) - xhat mean(g xhat), xhat = 0); the "
       "device's kernel gives 0, the CPU's a * dy + b * x + c form leaves rounding noise of rstd * ulp(dy) "
       "(2.4e-5 at eps 1e-5, rstd 316)" for name in ("native_layer_norm", "nn.functional.layer_norm")},
}

# Ops compared with CPU torch computing in float64 (the results rounded to float32 once), not in float32:
# op -> why CPU torch's float32 kernel is no reference.
_TRIGAMMA = ("CPU torch's float trigamma (digamma's derivative, polygamma of order 1) reflects negative "
             "arguments through sin(pi * x) in float: off by up to 20% near the negative integers (the "
             "device reduces the argument exactly: within 3e-6 of float64, test_math_and_reduction_ops.py)")
FLOAT64_REFERENCE: dict[str, str] = {
    "digamma": _TRIGAMMA,
    "special.digamma": _TRIGAMMA,
    "polygamma.polygamma_n_0": _TRIGAMMA,
    "polygamma.polygamma_n_1": _TRIGAMMA,
    **{f"polygamma.polygamma_n_{n}": _TRIGAMMA + "; this variant's first sample asks for order 1 too"
       for n in (2, 3, 4)},
    "special.polygamma.special_polygamma_n_0": _TRIGAMMA,
}

# Ops whose gradients are not compared: op -> reason.
NO_GRAD_CHECK: dict[str, str] = {}
