"""Workers sharing one study: what this worker knows of the study's trials, and whose each config is.

A :class:`StudyHistory` reads the study's trials (resumed ones, and those other workers finish
meanwhile), tells the study driver (:mod:`tunecl.search.driver`) whether a trial it asked is its own to
measure (:meth:`StudyHistory.claim`), fails trials left RUNNING by dead processes of this host and
waits for other workers' running trials when none of its own ran. See
:mod:`tunecl.search.strategies` for the guarantees workers sharing a study get.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import zlib
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from tunecl.search.budget import Key
from tunecl.search.result import Config, Result, config_key
from tunecl.search.space import SearchSpace

ATTR = "tunecl"  # user attribute of a trial: {"phase": ..., "result": Result.to_dict()}
WORKER_ATTR = "tunecl_worker"  # "host:pid" of the process that asked the trial
AWAIT_OTHERS_S = 600.0            # longest wait for other workers' running trials when none of ours ran
AWAIT_POLL_S = 0.2


def process_gone(worker: str) -> bool:
    """Whether ``host:pid`` names a process of this host that no longer exists."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, as another user's process
        return False
    return False


def this_worker() -> str:
    """The default name of this process in a study's trials: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


class StudyHistory:
    """A study's trials as one worker knows them, whichever worker (process, machine) measured them.

    Args:
        study: the study (its storage may be shared with other workers).
        space: decodes the configs of trials' params.
        worker: this worker's name in the trials (``WORKER_ATTR``).
        trial_budget: the trials the study may measure in all workers (None: no limit).
        on_shared: called once when another worker is first seen at work on the study after the first
            :meth:`sync` (when :attr:`shared` is already true after that one, the caller seeds by worker
            from the start).

    Attributes:
        results: every finished search result, in the order this worker learnt of them.
        seen: config key -> its first result.
        pending: configs of WAITING trials.
        elsewhere: configs other workers are measuring -> their trial number.
        running_elsewhere: numbers of other workers' RUNNING trials.
        absorbed: trial numbers read or told by this worker.
        shared: whether another worker was seen at work on this study.
    """

    def __init__(self, study: optuna.Study, space: SearchSpace, worker: str, trial_budget: int | None,
                 on_shared: Callable[[], None]):
        self.study, self.space, self.worker, self.trial_budget = study, space, worker, trial_budget
        self.on_shared = on_shared
        self.results: list[Result] = []
        self.seen: dict[Key, Result] = {}
        self.pending: set[Key] = set()
        self.elsewhere: dict[Key, int] = {}
        self.running_elsewhere: list[int] = []
        self.absorbed: set[int] = set()
        self.shared = False
        self.synced = False  # the first sync is done

    def sync(self) -> int:
        """Read the study's trials (one query); return how many it has.

        Absorbs every finished search result not read yet, whichever worker measured it (so the
        budget, the duplicate check and the winner cover all workers), and notes which configs wait
        and which other workers are measuring now. The driver calls it once at the start, once per
        proposal batch (after its params are written: see :meth:`claim`) and once before the final
        round.
        """
        trials = self.study.get_trials(deepcopy=False)
        pending: set[Key] = set()
        elsewhere: dict[Key, int] = {}
        running: list[int] = []
        others = False  # a result of another worker arrived since the first sync
        for trial in sorted(trials, key=lambda t: t.number):
            worker = trial.user_attrs.get(WORKER_ATTR)
            if trial.state == TrialState.WAITING:
                decoded = self._decode(trial.system_attrs.get("fixed_params", {}))
                if decoded:
                    pending.add(config_key(*decoded))
                continue
            if trial.state == TrialState.RUNNING:
                if worker == self.worker or self._fail_if_orphaned(trial):
                    continue
                running.append(trial.number)
                decoded = self._decode(trial.params)  # None while its params are being written
                if decoded:
                    elsewhere.setdefault(config_key(*decoded), trial.number)
                continue
            if trial.number in self.absorbed:
                continue
            self.absorbed.add(trial.number)
            others = others or self.synced
            info = trial.user_attrs.get(ATTR) or {}
            if info.get("phase") == "search" and "result" in info:
                try:
                    result = Result.from_dict(info["result"])
                except (KeyError, ValueError, TypeError, AttributeError):
                    continue  # a trial written by a foreign or newer tool: ignore it, don't crash
                self.add(result.key, result)
                if worker is not None and worker != self.worker:
                    others = True
        self.pending, self.elsewhere, self.running_elsewhere = pending, elsewhere, running
        if running or others:
            self._note_other_worker()
        self.synced = True
        return len(trials)

    def add(self, key: Key, result: Result) -> None:
        """Record a search result of config ``key`` (read back, or measured by this worker)."""
        self.results.append(result)
        self.seen.setdefault(key, result)

    def _note_other_worker(self) -> None:
        """Another worker is at work on this study: tell the owner of the sampler, once.

        Why: workers started together with one seed would otherwise propose the same configs in the
        same order, and each proposal would be measured by one worker and skipped by the other. A
        study resumed by one process alone keeps its reproducible seed.
        """
        if not self.shared:
            self.shared = True
            if self.synced:
                self.on_shared()

    def seed(self, base: int, trials: int) -> int:
        """The sampler seed after ``trials`` trials: offset by this worker's name once others are seen."""
        offset = zlib.crc32(self.worker.encode()) % 1_000_003 if self.shared else 0
        return base + trials + offset

    def _fail_if_orphaned(self, trial: FrozenTrial) -> bool:
        """Mark FAIL a RUNNING trial whose process (of this host) is gone; return whether it was."""
        if not process_gone(str(trial.user_attrs.get(WORKER_ATTR, ""))):
            return False
        storage = self.study._storage
        with contextlib.suppress(RuntimeError, ValueError):  # another worker marked it first
            storage.set_trial_user_attr(trial._trial_id, ATTR, {"phase": "interrupted"})
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        return True

    def _decode(self, params: dict[str, Any]) -> tuple[str, Config] | None:
        name = params.get("algorithm")
        if name not in self.space.spaces:
            return None
        try:
            return name, {p: int(params[f"{name}.{p}"]) for p in self.space.spaces[name].params}
        except (KeyError, TypeError, ValueError):
            return None

    def claim(self, number: int, key: Key, ahead: int = 0) -> str | None:
        """What to do with this worker's trial ``number`` of config ``key``, right after a sync that
        followed the writing of its params: None (measure it), ``"duplicate"`` (another worker has
        measured it: tell its result), ``"busy"`` (another worker is measuring it) or ``"surplus"``
        (finished and running trials of other workers already fill the trial budget).

        Why this is enough to never measure a config twice: of two trials of one config, the one
        synced later sees the other's params (written before that one's own sync) and yields to it,
        whether it is still RUNNING or finished; only a trial that went on to be measured makes the
        other yield. ``ahead`` counts this worker's own trials of the batch asked before this one.
        """
        if key in self.seen:
            return "duplicate"
        if key in self.elsewhere:
            return "busy"
        if self.trial_budget is not None:
            # only other workers' trials asked *before* this one count, so of two workers racing for
            # the last trial the earlier one always goes on (never both stop, never both measure)
            before = sum(1 for n in self.running_elsewhere if n < number)
            if len(self.results) + before + ahead >= self.trial_budget:
                return "surplus"
        return None

    def give_way(self, trial: Trial, why: str) -> None:
        """Tell a trial this worker will not measure (``busy``/``surplus``): FAIL, so that samplers
        ignore it and its config stays eligible."""
        self.absorbed.add(trial.number)
        with contextlib.suppress(Exception):
            trial.set_user_attr(ATTR, {"phase": why})
        self.study.tell(trial, state=TrialState.FAIL)

    def await_other_workers(self) -> None:
        """With no ok result yet while other workers measure this study's trials (they took the whole
        trial budget, or every config left), wait for those trials and take their results instead of
        ending without a winner; at most ``AWAIT_OTHERS_S`` (a trial of a dead worker of this host is
        failed by :meth:`sync`; one of another host may stay RUNNING)."""
        deadline = time.monotonic() + AWAIT_OTHERS_S
        while (self.running_elsewhere and not any(r.ok for r in self.results)
               and time.monotonic() < deadline):
            time.sleep(AWAIT_POLL_S)
            self.sync()
