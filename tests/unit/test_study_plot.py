"""``tunecl db plot``: a study's optimization history and parameter importances as a PNG (no OpenCL)."""

from __future__ import annotations

import sys

import optuna
import pytest
from optuna.trial import TrialState

from tunecl.cli import main
from tunecl.search.study_plot import parameter_importances, write_study_plot
from tunecl.search.tuner import open_storage

NAME = "tunecl:0123456789abcdef:gemm:m=64,n=64,k=64,ta=0,tb=0,batch=1,dtype=float32:gemm_tiled@1+gemm_direct@1#0:tpe"
OTHER = NAME.replace("m=64,n=64,k=64", "m=32,n=32,k=32")


def make_study(storage_url: str | None, name: str = NAME, trials: int = 12, seed: int = 0) -> optuna.Study:
    """A study shaped like the tuner's: a categorical ``algorithm``, then that algorithm's parameters;
    the time depends mostly on MWG; a few candidates fail (pruned, no time). ``storage_url`` None: in memory."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(storage_url) if storage_url is not None else None
    study = optuna.create_study(storage=storage, study_name=name, direction="minimize",
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    for number in range(trials):
        trial = study.ask()
        algorithm = trial.suggest_categorical("algorithm", ["gemm_tiled", "gemm_direct"])
        if algorithm == "gemm_tiled":
            mwg = trial.suggest_categorical("gemm_tiled.MWG", [16, 32, 64])
            kwg = trial.suggest_categorical("gemm_tiled.KWG", [8, 16])
            time = 1e-3 * 64 / mwg + 1e-6 * kwg
        else:
            time = 2e-3 + 1e-5 * trial.suggest_categorical("gemm_direct.WGS", [8, 16])
        if number % 7 == 3:
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, time)
    if storage is not None:  # a workers' claim record in the same storage is no tuning study
        optuna.create_study(storage=storage, study_name="tunecl:claims:0123456789abcdef", load_if_exists=True)
    return study


def assert_png(path, width: int, height: int) -> None:
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = matplotlib.image.imread(path)   # decodes the whole image: a truncated file raises
    assert pixels.shape[:2] == (height, width)
    assert pixels[..., :3].std() > 0.05     # something is drawn, not a blank canvas


def test_db_plot_writes_the_history_and_importances_as_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    make_study(str(tmp_path / "studies.sqlite"))
    out = tmp_path / "study.png"
    assert main(["db", "plot", "--study", "m=64,n=64", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}: 10 measured trials of {NAME}\n"
    assert_png(out, 1300, 500)


def test_the_importances_cover_every_parameter_and_sum_to_one():
    """Optuna's evaluator ranks by how the best trials differ from the rest: the block size MWG, which
    sets the time, counts; gemm_direct's WGS, whose trials are never among the best, counts nothing."""
    importances, note = parameter_importances(make_study(None, trials=40, seed=0))
    assert note == ""
    assert set(importances) == {"algorithm", "gemm_tiled.MWG", "gemm_tiled.KWG", "gemm_direct.WGS"}
    assert sum(importances.values()) == pytest.approx(1.0)
    assert importances["gemm_tiled.MWG"] > 0.3 and importances["gemm_direct.WGS"] == 0.0


def test_a_study_with_one_measured_trial_is_drawn_with_a_note_instead_of_importances(tmp_path):
    pytest.importorskip("matplotlib")
    study = make_study(None, trials=1)
    plot = write_study_plot(study, tmp_path / "one.png")
    assert (plot.completed, plot.importances) == (1, {})
    assert plot.importance_note == "importances need 2 or more measured trials (1 so far)"
    assert_png(tmp_path / "one.png", 1300, 500)


def test_choosing_the_study(tmp_path, capsys):
    storage = str(tmp_path / "studies.sqlite")
    make_study(storage)
    make_study(storage, OTHER, trials=3)
    assert main(["db", "plot", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tunecl: error: 2 studies; pick one with --study") and f"\n  {OTHER}\n" in err
    assert "claims" not in err
    assert main(["db", "plot", "--study", "conv:", str(tmp_path / "x.png")]) == 1
    assert capsys.readouterr().err.startswith("tunecl: error: no study matching 'conv:'; the storage holds 2:")
    assert not (tmp_path / "x.png").exists()


def test_a_missing_storage_is_an_error_that_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "typo-studies.sqlite"
    assert main(["db", "plot", "--storage", str(missing), str(tmp_path / "x.png")]) == 1
    assert capsys.readouterr().err == f"tunecl: error: no study storage at {missing}\n"
    assert not missing.exists()


def test_without_matplotlib_it_says_what_to_install(tmp_path, capsys, monkeypatch):
    make_study(str(tmp_path / "studies.sqlite"))
    for module in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main(["db", "plot", "--study", NAME, str(tmp_path / "x.png")]) == 1
    assert capsys.readouterr().err == (
        "tunecl: error: plotting needs matplotlib: pip install 'tunecl[plots]' (or matplotlib)\n")
    assert not (tmp_path / "x.png").exists()
