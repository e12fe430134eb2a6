"""Problem values: validation, canonical keys that round-trip, FLOP counts, CLI spec parsing."""

import random

import pytest

from tunecl.problems import ConvProblem, GemmProblem, problem_from_key


def _random_conv(rng: random.Random) -> ConvProblem:
    while True:
        groups = rng.choice([1, 1, 2, 4, 32])
        try:
            return ConvProblem(
                n=rng.randint(1, 64), c=groups * rng.randint(1, 64), h=rng.randint(1, 300),
                w=rng.randint(1, 300), k=groups * rng.randint(1, 64), r=rng.randint(1, 7), s=rng.randint(1, 7),
                stride=(rng.randint(1, 3), rng.randint(1, 3)), padding=(rng.randint(0, 3), rng.randint(0, 3)),
                dilation=(rng.randint(1, 2), rng.randint(1, 2)), groups=groups,
                direction=rng.choice(["fwd", "bwd_data", "bwd_weight"]), dtype=rng.choice(["float32", "float16"]))
        except ValueError:  # the kernel did not fit the padded input: draw again
            continue


def _random_gemm(rng: random.Random) -> GemmProblem:
    return GemmProblem(rng.randint(1, 5000), rng.randint(1, 5000), rng.randint(1, 5000), rng.random() < 0.5,
                       rng.random() < 0.5, rng.randint(1, 64), rng.choice(["float32", "float16"]))


def test_keys_round_trip_for_1000_random_problems():
    rng = random.Random(1234)
    for i in range(1000):
        problem = _random_conv(rng) if i % 2 else _random_gemm(rng)
        again = problem_from_key(problem.key)
        assert again == problem
        assert again.key == problem.key


def test_conv_output_shape_and_flops():
    p = ConvProblem.parse("n=16,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1,dir=fwd")
    assert p.output_shape == (16, 64, 56, 56)
    assert p.weight_shape == (64, 64, 3, 3)
    assert p.flops == 2 * 16 * 64 * 56 * 56 * 64 * 9
    strided = ConvProblem(n=1, c=3, h=224, w=224, k=64, r=7, s=7, stride=2, padding=3)
    assert (strided.p, strided.q) == (112, 112)
    dilated = ConvProblem(n=1, c=8, h=10, w=9, k=8, r=3, s=3, dilation=2, groups=8)
    assert (dilated.p, dilated.q) == (6, 5)
    assert dilated.flops == 2 * 1 * 8 * 6 * 5 * 1 * 9


def test_conv_parse_spellings_and_defaults():
    a = ConvProblem.parse("n=1,c=4,h=8,w=8,k=4,r=3,padding=1,dilation=1x2,direction=bwd_data")
    assert a.s == 3 and a.padding == (1, 1) and a.dilation == (1, 2) and a.direction == "bwd_data"
    assert ConvProblem.parse("n=1,c=4,h=8,w=8,k=4,s=1x1".replace("s=1x1", "s=1")).r == 1


@pytest.mark.parametrize("spec, reason", [
    ("n=0,c=3,h=8,w=8,k=4,r=3", "n must be a positive integer"),
    ("n=1,c=3,h=8,w=8,k=4,r=3,groups=2", "groups=2 must divide"),
    ("n=1,c=3,h=2,w=2,k=4,r=5", "does not fit"),
    ("n=1,c=3,h=8,w=8,k=4,r=3,pad=-1", "padding must be"),
    ("n=1,c=3,h=8,w=8,k=4,r=3,dir=sideways", "direction must be one of"),
    ("n=1,c=3,h=8,w=8,k=4,r=3,color=red", "unknown convolution field"),
    ("n=1,c=3,h=8,w=8,k=4", "missing r="),
    ("n=1,c=x,h=8,w=8,k=4,r=3", "c must be an integer"),
    ("n=1,c=3,h=8,w=8,k=4,r=3,dtype=float64", "dtype 'float64' is not supported"),
])
def test_conv_validation_names_the_reason(spec, reason):
    with pytest.raises(ValueError, match=reason):
        ConvProblem.parse(spec)


def test_a_transposed_convolution_is_the_regular_one_mapping_its_output_back():
    # DCGAN's 4x4/stride 2/pad 1 upsampling of 64 channels at 8x8 to 32 at 16x16
    up = ConvProblem.transposed(n=2, c=64, h=8, w=8, k=32, r=4, s=4, stride=2, padding=1)
    assert up == ConvProblem(n=2, c=32, h=16, w=16, k=64, r=4, s=4, stride=2, padding=1)
    assert up.output_shape == (2, 64, 8, 8) and up.weight_shape == (64, 32, 4, 4)  # conv_transpose2d's x, w
    # output_padding only adds rows the regular convolution never reaches; groups, dilation, non-square
    odd = ConvProblem.transposed(1, 6, 5, 7, 4, 3, 2, stride=(3, 2), padding=(1, 0), output_padding=(2, 1),
                                 dilation=(2, 1), groups=2)
    assert (odd.h, odd.w) == (4 * 3 - 2 + 4 + 2 + 1, 6 * 2 + 1 + 1 + 1) and (odd.p, odd.q) == (5, 7)
    assert (odd.c, odd.k, odd.groups, odd.weight_shape) == (4, 6, 2, (6, 2, 3, 2))


@pytest.mark.parametrize("kwargs, reason", [
    ({"stride": 1, "dilation": 2, "output_padding": 1}, "must be smaller than the stride"),
    ({"stride": 2, "output_padding": 2}, "must be smaller than the stride"),
    ({"padding": 3}, "output would be"),
    ({"output_padding": -1}, "output_padding must be"),
])
def test_a_transposed_convolution_without_a_regular_one_is_refused(kwargs, reason):
    with pytest.raises(ValueError, match=reason):
        ConvProblem.transposed(1, 4, 2, 2, 3, 3, 3, **kwargs)


def test_gemm_spec_and_validation():
    assert GemmProblem.from_spec("64,1000,2048,0,1") == GemmProblem(64, 1000, 2048, False, True)
    assert GemmProblem.from_spec("8,8,8,1,1,4").batch == 4
    assert GemmProblem.from_spec("8,8,8,dtype=float16") == GemmProblem(8, 8, 8, dtype="float16")
    assert GemmProblem.from_spec("8,8,8,0,1,2,dtype=float16").key == "gemm:m=8,n=8,k=8,ta=0,tb=1,batch=2,dtype=float16"
    assert GemmProblem.from_spec("8,8,8,dtype=float32") == GemmProblem(8, 8, 8)
    assert GemmProblem(2, 3, 4, batch=5).flops == 2 * 2 * 3 * 4 * 5
    for spec, reason in [("0,4,4", "m must be a positive integer"), ("4,4", "expected M,N,K"),
                         ("4,4,4,2,0", "ta must be 0 or 1"), ("a,4,4", "must be integers"),
                         ("4,4,4,dtype=int8", "dtype 'int8' is not supported"), ("4,4,dtype=float16", "expected M,N,K")]:
        with pytest.raises(ValueError, match=reason):
            GemmProblem.from_spec(spec)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        GemmProblem(1, 1, -3)


@pytest.mark.parametrize("key", ["", "gemm", "matmul:m=1,n=1,k=1", "gemm:m=1,n=1", "gemm:m=1,n=1,k=1,x=2",
                                 "gemm:m=1,m=2,n=1,k=1", "conv:n=1"])
def test_bad_keys_raise_value_error(key):
    with pytest.raises(ValueError):
        problem_from_key(key)


def test_fingerprint_keys_ignore_global_memory():
    from tunecl.fingerprint import Fingerprint

    base = dict(vendor="v", name="n", driver_version="1", opencl_c_version="OpenCL C 1.2", device_type="cpu",
                compute_units=2, max_work_group_size=4096, local_mem_size=1 << 20, global_mem_size=10 << 30)
    a, b = Fingerprint(**base), Fingerprint(**{**base, "global_mem_size": 7 << 30})
    assert a.key == b.key and a.model_key == b.model_key
    c = Fingerprint(**{**base, "driver_version": "2"})
    assert c.model_key == a.model_key and c.key != a.key
    assert Fingerprint.from_dict(a.to_dict()) == a
