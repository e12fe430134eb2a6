"""Compile candidates in worker processes ahead of their (serial) measurement: ``tunecl tune --jobs J``.

Compilation dominates tuning time and measuring must stay serial (one kernel at a time on the device),
so with ``jobs > 1`` the study driver asks for up to J trials at once, hands each valid config to
:meth:`Prebuilder.prepare`, then evaluates them one by one in the main process. A worker (a spawned
process with its own OpenCL context on the same device) runs ``algorithm.build`` once: that fills
pyopencl's on-disk binary cache (``TUNECL_CACHE_DIR``), so the main process's own build of the same
program is a fast binary load. A config the compiler rejects in the worker is reported as
COMPILE_ERROR at once, without compiling it again. Anything else going wrong with a worker (the
algorithm cannot be pickled, the pool broke) only loses the head start: the main process then builds
as it would with ``jobs=1``.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tunecl import runtime
from tunecl.kernels.base import Algorithm
from tunecl.problems import Problem
from tunecl.search.evaluate import CANDIDATE_ERRORS, _describe
from tunecl.search.result import Config, Result, Status

BUILD_TIMEOUT = 300.0  # seconds a worker build may take, counted from when the result is needed

_worker_device: runtime.Device | None = None


def _init_worker(selector: str) -> None:
    global _worker_device
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    _worker_device = runtime.select_device(selector)


def _build_in_worker(algorithm: Algorithm, problem: Problem, config: Config) -> tuple[int, str | None]:
    """Build one candidate; return (worker pid, the compile error's description or None)."""
    assert _worker_device is not None
    try:
        algorithm.build(problem, _worker_device, dict(config))
    except CANDIDATE_ERRORS as error:
        return os.getpid(), _describe(error)
    return os.getpid(), None


class Prebuilder:
    """A pool of ``jobs`` build processes for one problem on one device (started on first use).

    Attributes:
        built: builds that finished in a worker (successful or not).
        worker_pids: the processes those builds ran in.
    """

    def __init__(self, device: runtime.Device, problem: Problem, algorithms: dict[str, Algorithm],
                 evaluate: Callable[[str, Config], Result], jobs: int, timeout: float = BUILD_TIMEOUT):
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.selector = f"{device.entry.platform_index}:{device.entry.device_index}"
        self.problem, self.algorithms, self.evaluate = problem, algorithms, evaluate
        self.jobs, self.timeout = jobs, timeout
        self.built = 0
        self.worker_pids: set[int] = set()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.jobs, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(self.selector,))
        return self._pool

    def prepare(self, algorithm: str, config: Config) -> Callable[[], Result]:
        """Start building ``config`` in a worker; return what finishes its evaluation here."""
        try:
            future: Future[Any] | None = self._executor().submit(
                _build_in_worker, self.algorithms[algorithm], self.problem, dict(config))
        except (RuntimeError, concurrent.futures.BrokenExecutor):
            future = None

        def finish() -> Result:
            if future is not None:
                try:
                    pid, error = future.result(timeout=self.timeout)
                except concurrent.futures.TimeoutError:
                    future.cancel()
                    return Result(algorithm, dict(config), Status.COMPILE_ERROR,
                                  message=f"build did not finish within {self.timeout:g} s in a worker")
                except Exception:  # noqa: BLE001, S110 - a broken worker only loses the head start
                    pass
                else:
                    self.built += 1
                    self.worker_pids.add(pid)
                    if error is not None:
                        return Result(algorithm, dict(config), Status.COMPILE_ERROR, message=error)
            return self.evaluate(algorithm, config)

        return finish

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
