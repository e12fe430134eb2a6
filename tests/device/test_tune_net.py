"""``tunecl tune --net``: workload extraction, tuning every problem, skipping what is stored."""

import json
import re
import sys
from pathlib import Path

import pytest

from tunecl.cli import main
from tunecl.db import shipped
from tunecl.problems import AttentionProblem, ConvProblem, GemmProblem
from tunecl.search.workload import net_problems

sys.path.insert(0, str(Path(__file__).parent))  # makes tiny_net importable as a user model


def test_workload_counts_every_direction():
    found = net_problems("tiny_net:build", batch=2, image_size=8, train=True)
    conv = ConvProblem(n=2, c=4, h=8, w=8, k=4, r=3, s=3, padding=1)
    assert found[conv] == 2 and found[conv.with_direction("bwd_data")] == 2
    first = ConvProblem(n=2, c=3, h=8, w=8, k=4, r=3, s=3, padding=1)
    assert found[first] == 1 and first.with_direction("bwd_data") not in found  # input needs no grad
    assert found[GemmProblem(2, 5, 4, trans_b=True)] == 1  # x @ W.T
    assert found[GemmProblem(5, 4, 2, trans_a=True)] == 1  # dW = dY.T @ X
    assert found[GemmProblem(2, 4, 5)] == 1  # dX = dY @ W
    assert sum(found.values()) == 3 + 3 + 2 + 3  # conv fwd, bwd_weight, bwd_data (not the first), linear
    inference = net_problems("tiny_net:build", batch=2, image_size=8)
    assert set(p.direction for p in inference if isinstance(p, ConvProblem)) == {"fwd"}


def test_workload_records_transposed_convolutions_as_the_regular_problems_the_backend_runs():
    from torch import nn

    from tunecl.search.workload import extract

    generator = nn.Sequential(nn.ConvTranspose2d(3, 4, 4, stride=2, padding=1), nn.ReLU(),
                              nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1, groups=2))
    found = extract(generator, batch=2, image_size=5, train=True)
    first = ConvProblem(n=2, c=4, h=10, w=10, k=3, r=4, s=4, stride=2, padding=1)  # maps 10x10 back to 5x5
    second = ConvProblem(n=2, c=2, h=20, w=20, k=4, r=3, s=3, stride=2, padding=1, groups=2)
    assert found == {first.with_direction("bwd_data"): 1, first.with_direction("bwd_weight"): 1,
                     second.with_direction("bwd_data"): 1, second.with_direction("bwd_weight"): 1,
                     second: 1}  # the regular fwd is the input gradient; the first input needs none
    assert set(extract(generator, batch=2, image_size=5)) == {first.with_direction("bwd_data"),
                                                               second.with_direction("bwd_data")}


def test_workload_records_the_fused_attention_problems_instead_of_their_products():
    found = net_problems("tiny_net:build_transformer", batch=2, image_size=3, train=True)
    plain = AttentionProblem(2, 2, 9, 9, 4, 4)
    causal = AttentionProblem(2, 2, 9, 9, 4, 4, causal=True)
    assert {p for p in found if isinstance(p, AttentionProblem)} == {
        plain, plain.with_direction("bwd"), causal, causal.with_direction("bwd")}
    assert all(found[p] == 1 for p in found if isinstance(p, AttentionProblem))
    # no batched product of the attention: the GEMMs are the linear layers' (batch 1)
    assert all(p.batch == 1 for p in found if isinstance(p, GemmProblem))
    inference = net_problems("tiny_net:build_transformer", batch=2, image_size=3)
    assert {p for p in inference if isinstance(p, AttentionProblem)} == {plain, causal}


def test_workload_records_the_products_of_attention_the_fused_kernels_do_not_compute():
    """Grouped-query heads, and dropout where it is drawn on the host (CPU devices, ``TUNECL_RANDOM=host``),
    take torch's math path on the device: their products are recorded. Dropout drawn on the device (a
    GPU's default) runs on the fused kernels: their problems are recorded."""
    import torch
    from torch import nn

    from tunecl import config
    from tunecl.search.workload import extract

    class Attention(nn.Module):
        def __init__(self, **options):
            super().__init__()
            self.proj, self.options = nn.Linear(3, 8), options

        def forward(self, x):
            t = self.proj(x.flatten(2).transpose(1, 2)).view(x.shape[0], -1, 2, 4).transpose(1, 2)
            key = t[:, :1] if self.options.get("enable_gqa") else t
            return nn.functional.scaled_dot_product_attention(t, key, key, **self.options).sum()

    math_routes = [({"enable_gqa": True}, "gpu", "auto"), ({"dropout_p": 0.5}, "cpu", "auto"),
                   ({"dropout_p": 0.5}, "gpu", "host")]
    for options, device_type, random in math_routes:
        with config.override(random=random):
            found = extract(Attention(**options), batch=2, image_size=3, train=True, device_type=device_type)
        assert not any(isinstance(p, AttentionProblem) for p in found), options
        assert any(isinstance(p, GemmProblem) and p.batch > 1 for p in found), options
    found = extract(Attention(dropout_p=0.5), batch=2, image_size=3, train=True, device_type="gpu")
    assert sorted(p.direction for p in found if isinstance(p, AttentionProblem)) == ["bwd", "fwd"]
    assert not any(isinstance(p, GemmProblem) and p.batch > 1 for p in found)
    assert torch.nn.functional.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"


@pytest.mark.slow
def test_tune_net_tunes_the_attention_problems_of_a_transformer(capsys, monkeypatch):
    from tunecl.kernels import attention

    # training on the fused kernels, as on a GPU (a CPU device trains on the math path's products)
    monkeypatch.setattr(attention, "math_for_training", lambda *args: False)
    args = ["tune", "--net", "tiny_net:build_transformer", "--batch", "1", "--image-size", "3", "--train",
            "--trials", "1", "--algorithms", "attention_flash", "--no-progress", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)["problems"]
    tuned = {r["problem"] for r in rows if r["status"] == "tuned"}
    assert {r["status"] for r in rows if r["problem"] not in tuned} == {"not applicable"}
    assert tuned == {f"attention:b=1,h=2,l=9,s=9,e=4,ev=4,causal={c},mask=none,dir={d},dtype=float32"
                     for c in (0, 1) for d in ("fwd", "bwd")}
    assert all(r["algorithm"] == "attention_flash" and r["tuned_ms"] > 0 for r in rows if r["status"] == "tuned")


def test_unknown_net_is_a_clear_error(capsys):
    assert main(["tune", "--net", "no_such_net_xyz", "--no-progress"]) == 1
    assert "unknown model 'no_such_net_xyz'" in capsys.readouterr().err


@pytest.mark.slow
def test_tune_net_then_skip_what_is_stored(capsys, tmp_path, monkeypatch):
    args = ["tune", "--net", "tiny_net:build", "--batch", "1", "--image-size", "6", "--trials", "2",
            "--no-progress", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert len(first["problems"]) == 3 and {p["status"] for p in first["problems"]} == {"tuned"}
    assert all(p["tuned_ms"] > 0 and p["default_ms"] > 0 and p["seconds"] > 0 for p in first["problems"])
    assert first["tuning_seconds"] == pytest.approx(sum(p["seconds"] for p in first["problems"]))
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert {p["status"] for p in second["problems"]} == {"skipped"}
    assert all(p["seconds"] is None for p in second["problems"]) and second["tuning_seconds"] == 0
    assert [p["tuned_ms"] for p in second["problems"]] == [p["tuned_ms"] for p in first["problems"]]
    # shipped results for this exact device count as tuned too (a fresh user DB), unless --retune
    (tmp_path / "shipped").mkdir()
    assert main(["db", "export", "-o", str(tmp_path / "shipped" / "this-device.json")]) == 0
    capsys.readouterr()
    monkeypatch.setenv("TUNECL_SHIPPED_DB", str(tmp_path / "shipped"))
    monkeypatch.setenv("TUNECL_DB", str(tmp_path / "fresh.sqlite"))
    shipped.clear_cache()
    try:
        assert main(args) == 0
        third = json.loads(capsys.readouterr().out)
        assert {p["status"] for p in third["problems"]} == {"shipped"}
        assert [p["tuned_ms"] for p in third["problems"]] == [p["tuned_ms"] for p in first["problems"]]
        assert main(args + ["--retune"]) == 0
        assert {p["status"] for p in json.loads(capsys.readouterr().out)["problems"]} == {"tuned"}
    finally:
        shipped.clear_cache()


def test_a_search_restricted_to_some_algorithms_tunes_only_them(capsys):
    """--algorithms: one problem searches only the families named (a --try of another is a usage error);
    a net tunes the problems they apply to, lists the others as not applicable, and counts a problem as
    tuned once each named family that applies has a result."""
    args = ["tune", "--gemm", "33,17,9", "--algorithms", "gemm_direct", "--trials", "2", "--no-progress",
            "--json"]
    assert main(args) == 0
    outcome = json.loads(capsys.readouterr().out)
    assert set(outcome["per_algorithm"]) == {"gemm_direct"} and outcome["winner"]["algorithm"] == "gemm_direct"
    assert main(args + ["--try", "gemm_tiled:MWG=32"]) == 2
    assert "gemm_tiled is not searched for" in capsys.readouterr().err
    assert main(["tune", "--conv", "n=1,c=2,h=4,w=4,k=2,r=3,pad=1", "--algorithms", "gemm_direct",
                 "--no-progress"]) == 1
    assert "no convolution algorithm applies" in capsys.readouterr().err

    net = ["tune", "--net", "tiny_net:build", "--batch", "1", "--image-size", "6", "--trials", "2",
           "--algorithms", "conv_direct", "--no-progress", "--json"]
    runs = []
    for _ in range(2):
        assert main(net) == 0
        problems = json.loads(capsys.readouterr().out)["problems"]
        runs.append({(p["problem"].split(":")[0], p["status"], p["algorithm"]) for p in problems})
        assert len(problems) == 3
    assert runs[0] == {("conv", "tuned", "conv_direct"), ("gemm", "not applicable", None)}, runs[0]
    assert runs[1] == {("conv", "skipped", "conv_direct"), ("gemm", "not applicable", None)}, runs[1]


def test_a_failed_problem_says_why(device, tmp_path, capsys, monkeypatch):
    """No candidate verifies (a family that zero-fills C, the only one registered): the row is
    ``failed``, and its reason, in the summary and the JSON, counts the statuses and quotes the failed
    default's check."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tuning_algorithms import WrongGemm, gemm_algorithms

    from tunecl import tune
    from tunecl.cli.tune import print_net_summary
    from tunecl.db import TuningDB

    wrong = WrongGemm(gemm_algorithms()[0])
    monkeypatch.setattr(tune, "algorithms", lambda kind: [wrong])
    problem = GemmProblem(33, 17, 29)
    with TuningDB(str(tmp_path / "tuning.sqlite")) as db:
        [row] = tune.tune_workload({problem: 2}, device, db, trials=2, algorithms=[wrong],
                              storage_url=f"sqlite:///{tmp_path / 'studies.sqlite'}")
    assert (row.status, row.algorithm, row.tuned_s) == ("failed", None, None)
    assert re.fullmatch(rf"\d+ wrong result; {wrong.name} default: wrong result \d+ of 561 elements wrong .*",
                        row.reason), row.reason
    print_net_summary([row], "db")
    assert f"failed    {problem.key}: {row.reason}" in capsys.readouterr().out
    print_net_summary([row], "db", json_out=True)
    assert json.loads(capsys.readouterr().out)["problems"][0]["reason"] == row.reason
