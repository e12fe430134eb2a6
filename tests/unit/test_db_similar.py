"""Which stored results a search starts from (``tunecl.db.similar``) and how the tuner takes them."""

from __future__ import annotations

import json
import math

import pytest

from tunecl.db import TuningDB, shipped
from tunecl.db.exchange import export_document
from tunecl.db.similar import distance, nearest_configs, similar_configs
from tunecl.kernels.base import Constraint, Space
from tunecl.problems import AttentionProblem, ConvProblem, GemmProblem
from tunecl.search.space import SearchSpace
from tunecl.search.tuner import Tuner

CONV = ConvProblem(16, 64, 56, 56, 64, 3, 3, padding=1)


def conv(**changes) -> ConvProblem:
    fields = {"n": 16, "c": 64, "h": 56, "w": 56, "k": 64, "r": 3, "s": 3, "padding": 1, **changes}
    return ConvProblem(**fields)


def test_distance_sums_log_ratios_of_the_sizes_of_comparable_problems():
    assert distance(CONV, CONV) == 0
    assert distance(CONV, conv(n=64)) == pytest.approx(math.log(4))
    assert distance(CONV, conv(n=32, c=128, h=28, w=28)) == pytest.approx(4 * math.log(2))   # h·w: 4x
    assert distance(GemmProblem(16, 1000, 2048, False, True), GemmProblem(64, 1000, 2048, False, True)) \
        == pytest.approx(math.log(4))


@pytest.mark.parametrize("other", [
    conv(direction="bwd_data"), conv(r=1, s=1, padding=0), conv(stride=2), conv(dtype="float16"),
    conv(groups=64), conv(groups=2), GemmProblem(16, 64, 64)])
def test_problems_that_differ_in_kernel_shape_are_not_comparable(other):
    assert distance(CONV, other) is None


def test_attention_compares_over_batch_heads_and_lengths_within_one_head_shape_direction_and_mask():
    base = AttentionProblem(2, 4, 128, 128, 64, 64)
    assert distance(base, AttentionProblem(8, 2, 128, 512, 64, 64)) == pytest.approx(5 * math.log(2))
    for other in (AttentionProblem(2, 4, 128, 128, 32, 32), AttentionProblem(2, 4, 128, 128, 64, 32),
                  AttentionProblem(2, 4, 128, 128, 64, 64, causal=True), AttentionProblem(2, 4, 128, 128, 64, 64, mask="bool"),
                  base.with_direction("bwd"), AttentionProblem(2, 4, 128, 128, 64, 64, dtype="float16")):
        assert distance(base, other) is None, other


def test_depthwise_convs_compare_with_depthwise_ones_of_other_widths():
    assert distance(conv(c=32, k=32, groups=32), conv(c=96, k=96, groups=96)) == pytest.approx(2 * math.log(3))


def _record(fingerprint, problem, algorithm, params, time_s, status="ok"):
    from tunecl.db.records import Record

    return Record(fingerprint, problem.key, algorithm, 1, params, time_s if status == "ok" else None,
                  status=status)


def test_nearest_problem_first_fastest_first_each_config_once(fingerprint):
    fp = fingerprint()
    records = [
        _record(fp, conv(n=64), "winograd", {"T": 4}, 2e-3),          # 4x away
        _record(fp, conv(n=32), "im2col", {"T": 8}, 3e-3),            # 2x away, slower
        _record(fp, conv(n=32), "winograd", {"T": 2}, 1e-3),          # 2x away, faster
        _record(fp, conv(n=8), "im2col", {"T": 8}, 1e-3),             # 2x away, a repeat of a config
        _record(fp, CONV, "im2col", {"T": 1}, 1e-4),                  # the problem itself: not a hint
        _record(fp, conv(r=1, s=1, padding=0), "im2col", {"T": 3}, 1e-4),   # not comparable
        _record(fp, conv(n=33), "direct", {"T": 5}, None, status="failed:wrong_result"),
    ]
    assert nearest_configs(records, CONV, 10) == [("winograd", {"T": 2}), ("im2col", {"T": 8}),
                                                   ("winograd", {"T": 4})]
    assert nearest_configs(records, CONV, 1) == [("winograd", {"T": 2})]
    assert nearest_configs(records, CONV, 0) == []


def test_similar_configs_read_the_user_db_and_the_shipped_results_of_the_device_model(fingerprint, tmp_path):
    mine, other_driver, other_model = fingerprint(), fingerprint(driver="2.0"), fingerprint(name="Other GPU")
    with TuningDB(str(tmp_path / "user.sqlite")) as db:
        db.record(mine, conv(n=32), "im2col", 1, {"T": 8}, 1e-3)
        db.record(other_model, conv(n=16, c=32), "im2col", 1, {"T": 99}, 1e-5)   # another model: never
        with TuningDB(str(tmp_path / "ship.sqlite")) as source:
            source.record(other_driver, conv(n=64), "winograd", 1, {"T": 4}, 1e-3)
            document = export_document(source)
        folder = tmp_path / "shipped"
        folder.mkdir(exist_ok=True)
        (folder / "acme.json").write_text(json.dumps(document))
        shipped.clear_cache()
        assert similar_configs(db, mine, CONV, 5) == [("im2col", {"T": 8}), ("winograd", {"T": 4})]
        assert similar_configs(db, mine, CONV, 0) == []


def _space() -> SearchSpace:
    tiles = Space({"T": (1, 2, 4, 8), "V": (1, 2)}, [Constraint("no 4", lambda c: c["T"] != 4)],
                  implied={"V": 1})
    return SearchSpace({"tiled": tiles}, {"tiled": {"T": 1, "V": 1}}, seeds=(("tiled", {"T": 2, "V": 1}),))


def test_the_tuner_keeps_hints_of_its_algorithms_as_valid_configs_each_once():
    tuner = Tuner.__new__(Tuner)
    tuner.hints = [("tiled", {"T": 8, "V": 2}), ("tiled", {"T": 4, "V": 2}), ("tiled", {"T": 1}),
                   ("tiled", {"T": 2, "V": 1}), ("other", {"T": 8}), ("tiled", {"U": 8, "T": 8}),
                   ("tiled", {"T": 8, "V": 2}), ("tiled", {"T": 8})]
    # T=4 is invalid: the nearest valid config (T=2, the smaller at one step) is taken; a config without
    # the implied V means V=1; the default, the seed, other algorithms and parameter sets, and repeats are
    # left out
    assert tuner._resolve_hints(_space()) == (("tiled", {"T": 8, "V": 2}), ("tiled", {"T": 2, "V": 2}),
                                              ("tiled", {"T": 8, "V": 1}))
