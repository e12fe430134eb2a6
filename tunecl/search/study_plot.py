"""A tuning study as a picture: its optimization history and parameter importances in one PNG.

Drawn with matplotlib's object-oriented API on an Agg canvas, so nothing here selects a global backend
or opens a window. matplotlib is the optional ``plots`` extra: it is imported only when a plot is
drawn, and its absence is a :class:`~tunecl.errors.TuneclError` that says what to install.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tunecl.errors import TuneclError

MOST_BARS = 15  # importances drawn: a study of three GEMM families has ~50 parameters
CLAIMS_PREFIX = "tunecl:claims:"  # the bookkeeping studies of tunecl.search.claims, not tuning studies


@dataclasses.dataclass(frozen=True)
class StudyPlot:
    """What :func:`write_study_plot` drew."""

    study_name: str
    path: Path
    completed: int            # trials with a time (verified candidates)
    importances: dict[str, float]
    importance_note: str      # why there are no importances ("" when there are)


def tuning_studies(storage: optuna.storages.BaseStorage) -> list[str]:
    """The names of the tuning studies in ``storage`` (the workers' claim records left out)."""
    return sorted(s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
                  if not s.study_name.startswith(CLAIMS_PREFIX))


def find_study(storage: optuna.storages.BaseStorage, text: str | None) -> str:
    """The study named ``text``, or the one study whose name contains it, or with ``text`` None the
    storage's only study.

    Raises:
        TuneclError: no study, or several, match (the message lists the candidates).
    """
    names = tuning_studies(storage)
    if text is not None and text in names:
        return text
    matches = [n for n in names if text is None or text in n]
    if len(matches) == 1:
        return matches[0]
    if not names:
        raise TuneclError("the storage holds no tuning studies")
    what = "" if text is None else f" matching {text!r}"
    if not matches:
        raise TuneclError(f"no study{what}; the storage holds {len(names)}:\n" + _listing(names))
    raise TuneclError(f"{len(matches)} studies{what}; pick one with --study (a name or a part only it has):\n"
                      + _listing(matches))


def _listing(names: list[str], most: int = 20) -> str:
    shown = [f"  {n}" for n in names[:most]]
    return "\n".join(shown + ([f"  ... and {len(names) - most} more"] if len(names) > most else []))


def parameter_importances(study: optuna.Study) -> tuple[dict[str, float], str]:
    """Importances of the study's parameters (``algorithm`` and each algorithm's ``ALG.PARAM``)
    for the measured time, and "" — or no importances and the reason why."""
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(completed) < 2:
        return {}, f"importances need 2 or more measured trials ({len(completed)} so far)"
    try:
        # Optuna's default evaluator (PED-ANOVA in Optuna 4: no scikit-learn needed, unlike fANOVA);
        # it warns that the importances of a small study are rough, which the plot's title says anyway
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importances = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError) as error:
        return {}, f"importances not computable: {error}"
    if not importances:
        return {}, "no parameter varies between the measured trials"
    return dict(importances), ""


def write_study_plot(study: optuna.Study, path: str | Path) -> StudyPlot:
    """Write ``study``'s optimization history (every measured time and the best so far, per trial, by
    algorithm) and its parameter importances side by side to the PNG file ``path``.

    Raises:
        TuneclError: matplotlib is not installed, the study has no measured trial, or the file
            cannot be written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise TuneclError("plotting needs matplotlib: pip install 'tunecl[plots]' (or matplotlib)") from None
    path = Path(path)
    completed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                 if t.value is not None]
    if not completed:
        raise TuneclError(f"study {study.study_name} has no measured trial to plot")
    importances, note = parameter_importances(study)

    figure = Figure(figsize=(13, 5), layout="constrained")
    FigureCanvasAgg(figure)
    history, bars = figure.subplots(1, 2, width_ratios=(3, 2))
    _draw_history(history, completed)
    _draw_importances(bars, importances, note)
    figure.suptitle(study.study_name, fontsize=8)
    try:
        figure.savefig(path, format="png", dpi=100)
    except OSError as error:
        raise TuneclError(f"cannot write {path}: {error}") from None
    return StudyPlot(study.study_name, path, len(completed), importances, note)


def _draw_history(axes: Any, completed: list[optuna.trial.FrozenTrial]) -> None:
    by_algorithm: dict[str, list[tuple[int, float]]] = {}
    for trial in completed:
        name = str(trial.params.get("algorithm", "?"))
        by_algorithm.setdefault(name, []).append((trial.number, trial.value * 1e3))
    for name, points in sorted(by_algorithm.items()):
        axes.scatter([n for n, _ in points], [ms for _, ms in points], s=14, label=name, alpha=0.8)
    best, steps = float("inf"), []
    for trial in sorted(completed, key=lambda t: t.number):
        best = min(best, trial.value * 1e3)
        steps.append((trial.number, best))
    axes.step([n for n, _ in steps], [ms for _, ms in steps], where="post", color="black", linewidth=1,
              label="best so far")
    axes.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")  # 0.5, 2, 40 rather than 5x10^-1 on a log axis
    axes.yaxis.set_major_formatter(plain)
    times = [t.value for t in completed]
    # within a decade the major ticks are too few to read a value off; over several, minor labels crowd
    axes.yaxis.set_minor_formatter(plain if max(times) < 10 * min(times) else NullFormatter())
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("trial")
    axes.set_ylabel("time per call (ms, log scale)")
    axes.set_title(f"optimization history ({len(completed)} measured trials)")
    axes.legend(fontsize=7)


def _draw_importances(axes: Any, importances: dict[str, float], note: str) -> None:
    axes.set_title("parameter importances (Optuna's default evaluator)")
    if not importances:
        axes.text(0.5, 0.5, note, ha="center", va="center", wrap=True, transform=axes.transAxes)
        axes.set_axis_off()
        return
    shown = [n for n in list(importances)[:MOST_BARS] if importances[n] > 0]
    if len(shown) < len(importances):
        axes.set_title(f"parameter importances, the top {len(shown)} of {len(importances)}")
    names = shown[::-1]  # the most important on top
    axes.barh(names, [importances[n] for n in names])
    axes.set_xlabel("importance for the time (normalized to sum 1)")
    axes.tick_params(axis="y", labelsize=7)
