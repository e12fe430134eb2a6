"""Runs tunecl's kernels on the Oclgrind simulator; started by test_oclgrind.py in a child process.

``python oclgrind_child.py SUITE [--full]`` runs the cases of one suite (``gemm``, ``conv``,
``pointwise``, ``nn``, ``optim``) on the device ``TUNECL_DEVICE`` names (the parent selects Oclgrind
and sets its checks). Oclgrind writes its reports (invalid reads and writes, data races, barrier
divergence, API errors) to stderr as the kernels run; this script writes, also to stderr, one line
``@@oclgrind case <label>`` before each case, so the parent can tell which case a report belongs to,
and other ``@@oclgrind`` lines for what is not a report: a case that failed in Python (``error``), a
wrong result (``wrong``), a family that does not apply here (``skip``), the families that ran (``ran``)
and the end of the run (``done``). Each case waits for the device before the next marker. ``--full``
adds the random configs and shapes meant to run before a kernel change lands.

Shapes are tiny and odd (no dimension a multiple of a tile): Oclgrind interprets every work-item.
Harness buffers have no guard regions (``guard=0``), so an access just outside an operand falls
outside its OpenCL buffer, where Oclgrind sees it.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
import traceback
import warnings

MARK = "@@oclgrind"

GEMM_SHAPES = [(13, 7, 5, 1), (9, 11, 6, 2)]                        # (M, N, K, batch)
GEMM_FULL_SHAPES = [(1, 1, 1, 1), (5, 17, 3, 1), (33, 17, 9, 2)]
GEMM_DRAW_SHAPE = (64, 64, 64)   # random configs are drawn from its space (tiles up to 64, vectors)
GEMM_RANDOM = 1                  # random configs per family (and per transpose pair with --full)
GEMM_FULL_RANDOM = 6

CONV_SHAPES = {
    "3x3_s2_p1_g2": "n=1,c=4,h=5,w=5,k=6,r=3,s=3,stride=2,pad=1,groups=2",
    "3x3_s1_p1": "n=1,c=3,h=5,w=5,k=4,r=3,s=3,pad=1",
    "depthwise_s2": "n=1,c=3,h=5,w=5,k=3,r=3,s=3,stride=2,pad=1,groups=3",
    "1x1": "n=1,c=3,h=5,w=5,k=5,r=1,s=1",
}
CONV_FULL_SHAPES = {
    "3x3_s2_p1": "n=1,c=3,h=5,w=5,k=4,r=3,s=3,stride=2,pad=1",
    "groups2": "n=1,c=4,h=5,w=5,k=6,r=3,s=3,pad=1,groups=2",
    "1x1_s2": "n=2,c=3,h=5,w=7,k=4,r=1,s=1,stride=2",
    "5x5_p2": "n=1,c=2,h=7,w=5,k=3,r=5,s=5,pad=2",
    "dil2": "n=1,c=2,h=7,w=6,k=3,r=3,s=3,pad=2,dil=2",
    "asymmetric": "n=1,c=2,h=6,w=5,k=3,r=3,s=2,stride=2x1,pad=1x0,dil=1x2",
    "depthwise_x2": "n=1,c=2,h=5,w=5,k=4,r=3,s=3,pad=1,groups=2",
    "3x3_s1_b2": "n=2,c=3,h=7,w=5,k=5,r=3,s=3,pad=1",
}
# By default each family runs its default config in every direction on the first shape it applies to,
# and one seeded random config there in one direction (a different one per family); --full runs the
# default on every shape and CONV_FULL_RANDOM random configs per shape and direction.
CONV_FULL_RANDOM = 3

_ran: set[str] = set()
_seconds: dict[str, float] = {}   # case -> seconds it took


def say(kind: str, text: str) -> None:
    print(f"{MARK} {kind} {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def case(label: str, family: str = ""):
    """One case: its marker, then the body; a Python exception becomes an ``error`` line (the run goes on),
    and the device is drained before the next case so that Oclgrind's reports come before its marker."""
    say("case", label)
    start = time.perf_counter()
    try:
        yield
        _device().synchronize()
        if family:
            _ran.add(family)
    except Exception:
        say("error", f"{label}: " + traceback.format_exc().replace("\n", " | "))
    _seconds[label] = time.perf_counter() - start


def _device():
    from tunecl import runtime

    return runtime.select_device()


def _trust_split_finishes() -> None:
    """The kernels' split finishes run unprobed here: the probe's million work-items would take Oclgrind
    minutes (tests/device/test_split_finish.py checks the probe on the CI's device)."""
    from tunecl.kernels import split_finish

    split_finish.PROBE = False


def _check(label: str, binding) -> None:
    try:
        message = binding.check()
    finally:
        binding.release()
    if message:
        say("wrong", f"{label}: {message}")


# ---- GEMM and convolution families at their defaults and at seeded random configs ---------------------

def _gemm_suite(full: bool) -> None:
    from tunecl import kernels
    from tunecl.problems import GemmProblem

    device = _device()
    transposes = [(False, False), (False, True), (True, False), (True, True)]
    shapes = GEMM_SHAPES + (GEMM_FULL_SHAPES if full else [])
    for algorithm in kernels.algorithms("gemm"):
        probe = GemmProblem(*GEMM_SHAPES[0][:3])
        if not algorithm.applies(probe, device):
            say("skip", f"{algorithm.name}: does not apply on this device (capabilities: "
                        f"{', '.join(sorted(device.capabilities)) or 'none'})")
            continue
        for index, (m, n, k, batch) in enumerate(shapes):
            for ta, tb in transposes if full or index == 0 else transposes[index::2]:
                p = GemmProblem(m, n, k, ta, tb, batch=batch)
                _gemm_case(algorithm, p, algorithm.default(p, device), "default", seed=index)
        count = GEMM_FULL_RANDOM if full else GEMM_RANDOM
        for ta, tb in transposes if full else transposes[1:2]:
            configs = algorithm.space(GemmProblem(*GEMM_DRAW_SHAPE, ta, tb), device).configs()
            rng = random.Random(f"{algorithm.name}/{ta}{tb}")
            for i, config in enumerate(rng.sample(configs, min(count, len(configs)))):
                m, n, k, batch = shapes[i % len(shapes)]
                _gemm_case(algorithm, GemmProblem(m, n, k, ta, tb, batch=batch), config, "random", seed=i)
    _gemm_tiled_variants(full)


def _gemm_case(algorithm, p, config, kind: str, seed: int = 0, build=None) -> None:
    from tunecl.search.harness import GemmHarness

    device = _device()
    label = f"{algorithm.name} {kind} {p.key} {config}"
    with case(label, algorithm.name):
        plan = (build or algorithm.build)(p, device, config)
        _check(label, GemmHarness(p, device, seed=seed, guard=0).bind(plan))


# gemm_tiled's variants that its space here leaves out: split K (a workspace and a reduce launch), a
# stream-K tail (a workspace and a fixup launch; its G = STREAMK x compute units, 1 on Oclgrind, so the
# shapes have an odd number of 16 x 16 tiles), and cp.async staging built with plain copies instead
# (ASYNC 1-3), as PoCL's tests build them.
GEMM_SPLITK = [((13, 7, 21, 1), 2)] + [((9, 11, 6, 2), 4), ((5, 17, 3, 1), 8)]
GEMM_STREAMK = [((33, 7, 9, 1), 2, 1)] + [((17, 33, 20, 1), 2, 0), ((7, 7, 25, 3), 1, 1)]
GEMM_ASYNC = [((13, 7, 5, 1), 3, (False, True))] + [((9, 11, 6, 2), 4, (True, False)),
                                                     ((33, 17, 9, 1), 2, (True, True))]


def _small_tiles(**changes: int) -> dict[str, int]:
    """A 16 x 16-tile gemm_tiled config with scalar loads, valid for every layout."""
    return {"MWG": 16, "NWG": 16, "KWG": 8, "SPLITK": 1, "STREAMK": 0, "MDIMC": 8, "NDIMC": 8, "VWM": 2,
            "VWN": 2, "STRM": 0, "STRN": 0, "KWI": 2, "SA": 1, "SB": 1, "MDIMA": 8, "NDIMB": 8, "VWA": 1,
            "VWB": 1, "PAD": 0, "GM": 1, "RWGS": 0, "MAXRREG": 0, "DB": 0, "ASYNC": 0, **changes}


def _gemm_tiled_variants(full: bool) -> None:
    from tunecl.kernels.gemm import gemm_tiled
    from tunecl.problems import GemmProblem

    tiled = gemm_tiled.GemmTiled()
    device = _device()
    take = (lambda cases: cases) if full else (lambda cases: cases[:1])
    for (m, n, k, batch), splitk in take(GEMM_SPLITK):
        p = GemmProblem(m, n, k, batch=batch)
        _gemm_case(tiled, p, {**tiled.default(p, device), "SPLITK": splitk}, "split-K")
    for (m, n, k, batch), streamk, db in take(GEMM_STREAMK):
        _gemm_case(tiled, GemmProblem(m, n, k, batch=batch), _small_tiles(STREAMK=streamk, DB=db), "stream-K")
    emulated = (lambda p, dev, config: tiled.build(p, dev, config, emulate=True))
    for (m, n, k, batch), mode, (ta, tb) in take(GEMM_ASYNC):
        _gemm_case(tiled, GemmProblem(m, n, k, ta, tb, batch=batch), _small_tiles(ASYNC=mode),
                   "cp.async emulated", build=emulated)


def _conv_suite(full: bool) -> None:
    from tunecl import kernels
    from tunecl.problems import DIRECTIONS, ConvProblem
    from tunecl.search.harness_conv import ConvHarness

    device = _device()
    shapes = {**CONV_SHAPES, **(CONV_FULL_SHAPES if full else {})}
    for index, algorithm in enumerate(kernels.algorithms("conv")):
        applied = False
        for d, direction in enumerate(DIRECTIONS):
            for shape, spec in shapes.items():
                p = ConvProblem.parse(spec).with_direction(direction)
                if not algorithm.applies(p, device):
                    continue
                applied = True
                config = algorithm.default(p, device)
                label = f"{algorithm.name} default {p.key} {config}"
                with case(label, algorithm.name):
                    plan = algorithm.build(p, device, config)
                    _check(label, ConvHarness(p, device, seed=1, guard=0).bind(plan))
                count = CONV_FULL_RANDOM if full else int(d == index % len(DIRECTIONS))
                configs = algorithm.space(p, device).configs() if count else []
                rng = random.Random(f"{algorithm.name}/{shape}/{direction}")
                for i, config in enumerate(rng.sample(configs, min(count, len(configs)))):
                    label = f"{algorithm.name} random {p.key} {config}"
                    with case(label, algorithm.name):
                        _check(label, ConvHarness(p, device, seed=i, guard=0).bind(
                            algorithm.build(p, device, config)))
                if not full:
                    break
        if not applied:
            say("skip", f"{algorithm.name}: applies to none of the shapes on this device (capabilities: "
                        f"{', '.join(sorted(device.capabilities)) or 'none'})")
    _split_finishes(device, full)


# reductions split over work-groups and finished by the last work-group of each tile (split_finish.cl):
# (family, shape, direction, SPLIT)
CONV_SPLITS = [("conv_implicit_gemm", "n=2,c=3,h=5,w=5,k=4,r=3,s=3,pad=1", "bwd_weight", 4),
               ("conv_depthwise", "n=2,c=3,h=6,w=6,k=3,r=3,s=3,pad=1,groups=3", "bwd_weight", 2),
               ("conv_implicit_gemm", "n=1,c=4,h=5,w=5,k=6,r=3,s=3,stride=2,pad=1,groups=2", "bwd_weight", 2),
               ("conv_implicit_gemm", "n=1,c=3,h=5,w=7,k=5,r=3,s=3,pad=1", "fwd", 2)]
# conv_1x1's weight gradient with its images added in the GEMM's launch (gemm_tiled's SUM_BATCH), and with
# split K too: (shape, g_SPLITK)
COLUMN_SUMS = [("n=2,c=4,h=5,w=4,k=6,r=1,s=1", 1), ("n=3,c=5,h=4,w=5,k=4,r=1,s=1,stride=2", 2)]


def _split_finishes(device, full: bool) -> None:
    from tunecl import kernels
    from tunecl.problems import ConvProblem
    from tunecl.search.harness_conv import ConvHarness

    for name, spec, direction, split in CONV_SPLITS if full else CONV_SPLITS[:2]:
        algorithm = next(a for a in kernels.algorithms("conv") if a.name == name)
        p = ConvProblem.parse(spec).with_direction(direction)
        config = next((c for c in algorithm.space(p, device).configs() if c["SPLIT"] == split), None)
        if config is None:
            say("skip", f"{name}: no SPLIT {split} config of {p.key} on this device")
            continue
        label = f"{name} split-finish {p.key} {config}"
        with case(label, algorithm.name):
            _check(label, ConvHarness(p, device, seed=2, guard=0).bind(algorithm.build(p, device, config)))
    algorithm = next(a for a in kernels.algorithms("conv") if a.name == "conv_1x1")
    for spec, splitk in COLUMN_SUMS if full else COLUMN_SUMS[:1]:
        p = ConvProblem.parse(spec).with_direction("bwd_weight")
        config = next((c for c in algorithm.space(p, device).configs() if c["g_SPLITK"] == splitk
                       and not c.get("g_STREAMK") and not c.get("g_ASYNC")), None)
        if config is None:
            say("skip", f"conv_1x1: no g_SPLITK {splitk} config of {p.key} on this device")
            continue
        label = f"conv_1x1 images-sum {p.key} {config}"
        with case(label, algorithm.name):
            plan = algorithm.build(p, device, config)
            if not plan.sums_images:
                say("wrong", f"{label}: the plan does not add its images in the GEMM's launch")
            _check(label, ConvHarness(p, device, seed=2, guard=0).bind(plan))


# ---- the backend's kernels through small torch calls -------------------------------------------------

def _compare(label: str, got, want, atol: float = 1e-4, rtol: float = 1e-4) -> None:
    import torch

    got_list = got if isinstance(got, (tuple, list)) else [got]
    want_list = want if isinstance(want, (tuple, list)) else [want]
    for g, w in zip(got_list, want_list, strict=True):
        if isinstance(w, torch.Tensor):
            try:
                torch.testing.assert_close(g.cpu(), w, atol=atol, rtol=rtol, equal_nan=True)
            except AssertionError as error:
                say("wrong", f"{label}: " + str(error).replace("\n", " | "))


def _op(label: str, fn, *inputs, grad: bool = False, atol: float = 1e-4) -> None:
    """``fn`` on the opencl device against the CPU, forward (and backward through a weighted sum)."""
    import torch

    with case(label, label.split()[0]):
        cpu = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
        dev = [x.detach().to("opencl").requires_grad_(grad and x.is_floating_point()) for x in inputs]
        want, got = fn(*cpu), fn(*dev)
        _compare(label, got, want, atol=atol)
        if grad:
            first = want[0] if isinstance(want, tuple) else want
            weight = torch.randn(first.shape)
            (first * weight).sum().backward()
            ((got[0] if isinstance(got, tuple) else got) * weight.to("opencl")).sum().backward()
            _compare(label + " backward", [d.grad for d in dev if d.grad is not None],
                     [c.grad for c in cpu if c.grad is not None], atol=atol)


def _pointwise_suite(full: bool) -> None:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x, y = torch.randn(3, 5, 7), torch.randn(5, 7)
    odd = torch.randn(13)                       # float4 lanes plus a tail of one
    _op("pointwise add_mul_relu", lambda a, b: ((a * 2 + b).relu() - 0.5).sigmoid(), x, y, grad=True)
    _op("pointwise float4_tail", lambda a: torch.tanh(a) * a + 1, odd, grad=True)
    _op("pointwise strided_transposed", lambda a, b: a.transpose(1, 2)[:, ::2] * b.t()[::2], x, y)
    _op("pointwise where_clamp", lambda a, b: torch.where(a > 0, a, b).clamp(-0.5, 0.5), x, y)
    _op("pointwise gelu_silu", lambda a: F.gelu(a) + F.silu(a), x, grad=True)
    _op("pointwise int_bool", lambda a: ((a * 10).long() * 3 + 1 > 2) & (a > -1), x)
    _op("pointwise half", lambda a: (a.half() * 3).float(), x)
    _op("pointwise copy_cat", lambda a, b: torch.cat([a.reshape(-1, 7), b], 0).contiguous(), x, y)
    _op("reduce sum_mean", lambda a: (a.sum(1), a.mean((0, 2)), a.sum()), x, grad=True)
    _op("reduce amax_argmax", lambda a: (a.amax(2), a.argmax(1), a.min()), x)
    _op("reduce var_norm", lambda a: (a.var(0), a.norm(dim=2)), x, grad=True)
    _op("reduce long_row", lambda a: a.sum(0), torch.randn(1031, 3))
    _op("reduce any_all", lambda a: ((a > 0).any(1), (a > -3).all()), x)
    _op("softmax last_dim", lambda a: torch.softmax(a, -1), x, grad=True)
    _op("softmax log_dim1", lambda a: torch.log_softmax(a, 1), x, grad=True)
    with case("random bernoulli_dropout", "random"):
        torch.empty(37, device="opencl").bernoulli_(0.3).cpu()
        F.dropout(torch.ones(5, 7, device="opencl"), 0.4).cpu()
    from tunecl import config

    with case("random device_draws", "random"), config.override(random="device"):   # the Philox kernels
        torch.empty(37, device="opencl").bernoulli_(0.3).cpu()
        F.dropout(torch.ones(41, device="opencl")[4:], 0.4).cpu()   # one launch, at a storage offset
    if full:
        big = torch.randn(2, 3, 33, 17)
        _op("pointwise broadcast4d", lambda a, b: a * b[:, :, :1] + b.mean(), big, big[:1], grad=True)
        _op("reduce permuted", lambda a: a.permute(3, 1, 0, 2).sum((1, 3)), big, grad=True)
        _op("softmax long", lambda a: torch.softmax(a, 0), torch.randn(517, 3), grad=True)


def _nn_suite(full: bool) -> None:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5) * 2 + 1
    for training in (True, False):
        def bn(v, w, b, training=training):
            stats = torch.zeros(3, device=v.device), torch.ones(3, device=v.device)
            return F.batch_norm(v, *stats, w, b, training=training, momentum=0.3, eps=1e-4)
        _op(f"norm batch_norm_{'train' if training else 'eval'}", bn, x, torch.rand(3) + 0.5, torch.randn(3),
            grad=True, atol=3e-4)

    def batch_stats(v):
        return F.batch_norm(v, None, None, training=True)
    _op("norm batch_norm_1d", batch_stats, torch.randn(7, 3), grad=True, atol=3e-4)
    _op("norm batch_norm_relu", lambda v: batch_stats(v).relu(), x, grad=True, atol=3e-4)
    from tunecl.backend import state
    norm = state.get().norm
    for parts in (1, 3):   # the reductions finished inside the elementwise launches, an in-place relu folded
        norm.force_parts = parts
        try:
            _op(f"norm batch_norm_relu_p{parts}", lambda v: batch_stats(v).relu_(), x, grad=True, atol=3e-4)
            # a residual added inside the normalising launch: into y, into a sum, into the residual
            _op(f"norm batch_norm_residual_p{parts}", lambda v, r: batch_stats(v).add_(r).relu_(), x, x.flip(0),
                grad=True, atol=3e-4)
            _op(f"norm batch_norm_sum_p{parts}", lambda v, r: r + batch_stats(v), x, x.flip(0), grad=True, atol=3e-4)
            _op(f"norm batch_norm_sum_into_p{parts}", lambda v, r: batch_stats(v).add_(batch_stats(r)).relu_(),
                x, x.flip(0), grad=True, atol=3e-4)
        finally:
            norm.force_parts = None
    _op("pool max3s2p1", lambda v: F.max_pool2d(v, 3, 2, 1), x, grad=True)
    _op("pool max2_indices", lambda v: F.max_pool2d(v, 2, return_indices=True), x, grad=True)
    _op("pool avg3s2p1_ceil", lambda v: F.avg_pool2d(v, 3, 2, 1, ceil_mode=True, count_include_pad=False), x,
        grad=True)
    _op("pool adaptive", lambda v: F.adaptive_avg_pool2d(v, (2, 3)), x, grad=True)
    _op("pool adaptive1", lambda v: F.adaptive_avg_pool2d(v, 1), x, grad=True)
    logits, target, weight = torch.randn(5, 7), torch.tensor([1, 0, 6, 3, 3]), torch.rand(7)
    for reduction in ("mean", "sum", "none"):
        _op(f"loss cross_entropy_{reduction}", lambda a, b: F.cross_entropy(a, b, reduction=reduction),
            logits, target, grad=True)
    _op("loss nll_weighted_ignore",
        lambda a, b: F.nll_loss(F.log_softmax(a, 1), b, weight=weight.to(a.device), ignore_index=3),
        logits, target, grad=True)
    # the CTC recursions and gradient; the first call's last sample's repeated labels do not fit its input (an
    # infinite loss that zero_infinity zeroes), the second's middle sample has an empty target
    log_probs = torch.randn(6, 3, 5).log_softmax(2)
    _op("ctc loss_padded", lambda a, t: F.ctc_loss(a, t, [6, 5, 2], [3, 2, 2], reduction="sum", zero_infinity=True),
        log_probs, torch.tensor([[1, 1, 2], [3, 4, 0], [2, 2, 0]]), grad=True)
    _op("ctc loss_concatenated", lambda a, t: F.ctc_loss(a, t, [6, 4, 5], [2, 0, 3], reduction="none"),
        log_probs, torch.tensor([4, 1, 2, 3, 2]), grad=True)
    _op("index index_select", lambda a, i: a.index_select(1, i), x.reshape(6, 5, 5),
        torch.tensor([4, 0, 2, 2]))
    _op("index gather", lambda a, i: a.gather(1, i), torch.randn(4, 6), torch.randint(0, 6, (4, 3)))
    _op("index scatter", lambda a, i, v: a.scatter(0, i, v), torch.randn(5, 3),
        torch.tensor([[4, 0, 1], [2, 3, 0]]), torch.randn(2, 3))
    _op("index scatter_value", lambda a, i: a.scatter(1, i, 1.5), torch.randn(3, 7),
        torch.tensor([[6], [0], [3]]))
    _op("linear gemm", F.linear, torch.randn(5, 7), torch.randn(3, 7), torch.randn(3), grad=True)
    _op("conv conv2d", lambda a, w: F.conv2d(a, w, stride=2, padding=1), x, torch.randn(4, 3, 3, 3),
        grad=True, atol=1e-3)
    _op("conv conv2d_groups", lambda a, w: F.conv2d(a, w, padding=1, groups=3), x, torch.randn(3, 1, 3, 3),
        grad=True, atol=1e-3)
    # the fused attention kernels: lengths past one 32-row tile, odd head dims
    q, k, v = torch.randn(1, 2, 37, 6), torch.randn(1, 2, 41, 6), torch.randn(1, 2, 41, 3)
    _op("attention sdpa_fused", lambda a, b, c: F.scaled_dot_product_attention(a, b, c), q, k, v, grad=True)
    from tunecl import config
    from tunecl.kernels import attention

    with case("attention sdpa_dropout", "attention"), config.override(random="device"):
        trained_on_math, attention.math_for_training = attention.math_for_training, lambda *args: False
        try:   # the fused kernels' dropout variant, forward and backward (values are checked by the tests)
            leaves = [t.to("opencl").requires_grad_() for t in (q, k, v)]
            F.scaled_dot_product_attention(*leaves, dropout_p=0.3).sum().backward()
            torch.stack([t.grad.sum() for t in leaves]).cpu()
        finally:
            attention.math_for_training = trained_on_math
    if full:
        keep = torch.rand(37, 41) > 0.3
        _op("attention sdpa_causal", lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
            q, k, v, grad=True)
        _op("attention sdpa_bool_mask", lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m),
            q, k, v, keep, grad=True)
        _op("norm batch_norm_wide", batch_stats, torch.randn(3, 5, 9, 11), grad=True, atol=3e-4)
        _op("pool max_dilated_ceil", lambda v: F.max_pool2d(v, 3, 2, 1, dilation=2, ceil_mode=True),
            torch.randn(2, 3, 9, 7), grad=True)
        _op("pool adaptive_up", lambda v: F.adaptive_avg_pool2d(v, (7, 6)), x, grad=True)
        _op("conv conv2d_1x1_s2", lambda a, w: F.conv2d(a, w, stride=2), torch.randn(2, 3, 7, 5),
            torch.randn(5, 3, 1, 1), grad=True, atol=1e-3)


def _optim_suite(full: bool) -> None:
    """Two steps of each optimizer in both of the fused kernels' layouts: the CPU one (one element per
    work-item, bias corrections once per work-group) and the GPU one (work-items striding over a tensor)."""
    import torch
    from torch.optim import SGD, Adam, AdamW

    from tunecl.backend import memory, state
    from tunecl.kernels.ops.fused import Chain, Step

    makers = {
        "adam_fused": lambda p: Adam(p, lr=1e-2, fused=True),
        "adamw_fused_amsgrad": lambda p: AdamW(p, lr=1e-2, weight_decay=0.1, amsgrad=True, fused=True),
        "adam_foreach": lambda p: Adam(p, lr=1e-2, foreach=True),
        "sgd_momentum_fused": lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3,
                                            fused=True),
        "sgd_foreach": lambda p: SGD(p, lr=0.1, momentum=0.9, foreach=True),
    }
    optim = state.get().optim
    layouts = [(optim.cpu_layout, optim.items), (not optim.cpu_layout, 64 if optim.cpu_layout else 1 << 12)]
    torch.manual_seed(0)
    shapes = [(3, 5), (7,), (1,), (2, 3, 3)] + ([(33, 9), (257,)] if full else [])
    values = [torch.randn(s) for s in shapes]
    grads = [torch.randn(s) for s in shapes]
    for cpu_layout, items in layouts:
        optim.cpu_layout, optim.items = cpu_layout, items
        for name, make in makers.items():
            label = f"optim {name} {'cpu' if cpu_layout else 'gpu'}_layout"
            with case(label, "optim"):
                results = []
                for device in ("cpu", "opencl"):
                    params = [torch.nn.Parameter(v.clone().to(device)) for v in values]
                    opt = make(params)
                    for _ in range(2):
                        for p, g in zip(params, grads, strict=True):
                            p.grad = g.clone().to(device)
                        opt.step()
                    results.append([p.detach().cpu() for p in params])
                _compare(label, results[1], results[0], atol=1e-5, rtol=1e-4)
        # foreach_chain (a compiled graph's run of foreach ops): a 0-dim column whose values one work-item of
        # each work-group computes and shares through local memory, and two written columns
        label = f"optim foreach_chain {'cpu' if cpu_layout else 'gpu'}_layout"
        with case(label, "optim"):
            steps = [torch.tensor(float(k + 1)) for k in range(len(values))]
            a, b, s = ([t.to("opencl") for t in column] for column in (values, grads, steps))
            chain = Chain(3, (Step("pow", (0.9, "v2"), ()), Step("mul", ("v0", "t0"), ()),
                              Step("add", ("t1", "v1"), (0.5,)), Step("sqrt", ("t0",), ()),
                              Step("div", ("v1", "t3"), ())))
            columns = [[(memory.buffer_of(t), t.storage_offset()) for t in column] for column in (a, b, s)]
            optim.chain(chain, (False, False, True), [(0, 2), (1, 4)], columns, [t.numel() for t in values])
            _compare(label, a + b, [v * 0.9 ** t + 0.5 * g for v, g, t in zip(values, grads, steps)]
                     + [g / (0.9 ** t).sqrt() for g, t in zip(grads, steps)], atol=1e-5, rtol=1e-4)
    optim.cpu_layout, optim.items = layouts[0]


# Two kernels with known faults: the parent checks that Oclgrind reports each of them, so a run whose
# checks are off (a missing environment variable, another device) cannot pass for a clean one.
CANARY_SOURCE = """
__kernel void canary_write_past_end(__global float *x, const int n) {
  x[get_global_id(0) + 1] = 1.0f;   // the last work-item writes x[n]
}
__kernel void canary_local_race(__global float *x) {
  __local float shared[1];
  shared[0] = (float)get_local_id(0);   // every work-item writes the same word, no barrier between
  barrier(CLK_LOCAL_MEM_FENCE);
  x[get_global_id(0)] = shared[0];
}
"""


def _canary_suite(full: bool) -> None:
    import numpy as np

    device = _device()
    program = device.build(CANARY_SOURCE)
    with case("canary write_past_end", "canary"):
        buffer = device.alloc(4 * 8)
        device.launch(device.kernel(program, "canary_write_past_end", [None, np.int32]), (8,), (8,),
                      buffer, np.int32(8))
    with case("canary local_race", "canary"):
        buffer = device.alloc(4 * 8)
        device.launch(device.kernel(program, "canary_local_race"), (8,), (8,), buffer)


SUITES = {"canary": _canary_suite, "gemm": _gemm_suite, "conv": _conv_suite, "pointwise": _pointwise_suite,
          "nn": _nn_suite, "optim": _optim_suite}


def main(argv: list[str]) -> int:
    suite, full = argv[0], "--full" in argv[1:]
    warnings.simplefilter("ignore")   # warnings are no reports; keep stderr for Oclgrind's
    _trust_split_finishes()
    if suite in ("pointwise", "nn", "optim"):
        import tunecl.backend  # noqa: F401  (makes "opencl" a torch device)
    device = _device()
    say("device", f"{device.name} [{device.entry.platform}]")
    SUITES[suite](full)
    say("ran", " ".join(sorted(_ran)))
    for label in sorted(_seconds, key=_seconds.get, reverse=True)[:5]:
        say("slowest", f"{_seconds[label]:.2f} s {label}")
    say("done", suite)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
