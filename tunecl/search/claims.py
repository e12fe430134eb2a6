"""Claims on problems, so that several ``tunecl tune --net`` processes on one storage split a workload.

A claim is a user attribute of one bookkeeping study per device (``tunecl:claims:<device key>``) in the
Optuna storage the workers share: key = the problem (and precision), value = ``{"worker": "host:pid",
"beat": <unix time>}`` while the worker tunes it, ``"done": true`` added when it has finished.

Races: ``set_user_attr`` is last-writer-wins, so two workers may both believe they won a claim made at
the same moment (each writes, then reads its own value back before the other writes). That costs time,
never correctness: a worker that finds its claim lost simply tunes along in the same study, where the
study driver shares trials between workers (no config measured twice, one trial budget; see
:mod:`tunecl.search.coordination`). A claim is *stale*, and taken over, when its worker's heartbeat (rewritten
at most every ``HEARTBEAT_EVERY`` seconds while it evaluates candidates) is older than ``STALE_AFTER``
seconds — across machines this assumes roughly synchronized clocks — or when its worker is a process of
this host that no longer exists.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import optuna

from tunecl.search.coordination import process_gone, this_worker
from tunecl.search.strategies import quiet_optuna

STALE_AFTER = 600.0  # seconds without a heartbeat after which another worker takes a claim over
HEARTBEAT_EVERY = 30.0  # seconds between two heartbeat writes of one claim


class Claims:
    """The claims of the workers tuning on one device through one Optuna storage.

    Args:
        storage: the Optuna storage the workers share.
        device_key: names the bookkeeping study (claims are per device).
        worker: this worker's name (default ``host:pid``).
        clock: wall-clock seconds (tests pass a fake one).
        stale_after: seconds without a heartbeat after which a claim is stale.
    """

    def __init__(self, storage: optuna.storages.BaseStorage, device_key: str, worker: str | None = None,
                 clock: Callable[[], float] = time.time, stale_after: float = STALE_AFTER):
        with quiet_optuna():
            # creation with load_if_exists is atomic per study name: concurrent workers get one study
            self.study = optuna.create_study(storage=storage, study_name=f"tunecl:claims:{device_key}",
                                             load_if_exists=True)
        self.worker = worker or this_worker()
        self.clock = clock
        self.stale_after = stale_after
        self._beats: dict[str, float] = {}

    def _read(self, key: str) -> dict[str, Any]:
        value = self.study.user_attrs.get(key)  # read from the storage on every access
        return value if isinstance(value, dict) else {}

    def _live(self, value: dict[str, Any]) -> bool:
        beat = value.get("beat")
        worker = str(value.get("worker", ""))
        return (isinstance(beat, (int, float)) and self.clock() - beat < self.stale_after
                and not process_gone(worker))

    def holder(self, key: str) -> str | None:
        """The other worker tuning ``key`` now (a live, unfinished claim), or None."""
        value = self._read(key)
        worker = value.get("worker")
        if worker is None or worker == self.worker or value.get("done") or not self._live(value):
            return None
        return str(worker)

    def done_elsewhere(self, key: str) -> bool:
        """Whether another worker has finished tuning ``key``."""
        value = self._read(key)
        return bool(value.get("done")) and value.get("worker") != self.worker

    def claim(self, key: str) -> bool:
        """Claim ``key`` for this worker; False when another worker's claim won the race (the caller
        may still tune along: the study is safe to share)."""
        self._write(key, {})
        return self.holder(key) is None

    def beat(self, key: str) -> None:
        """Refresh this worker's claim on ``key`` (at most every ``HEARTBEAT_EVERY`` seconds)."""
        if self.clock() - self._beats.get(key, -float("inf")) >= HEARTBEAT_EVERY:
            self._write(key, {})

    def release(self, key: str) -> None:
        """Mark ``key`` finished by this worker."""
        self._write(key, {"done": True})

    def _write(self, key: str, extra: dict[str, Any]) -> None:
        now = self.clock()
        self._beats[key] = now
        self.study.set_user_attr(key, {"worker": self.worker, "beat": now, **extra})


def claim_key(problem_key: str, precision: str) -> str:
    """The claim of a problem tuned at a precision (an fp32 and a TF32 run are different work)."""
    return f"{precision}:{problem_key}"


__all__ = ["HEARTBEAT_EVERY", "STALE_AFTER", "Claims", "claim_key"]
