"""Compile candidates in worker processes ahead of their (serial) measurement: ``tunecl tune --jobs J``.

Compilation dominates tuning time and measuring must stay serial (one kernel at a time on the device),
so with ``jobs > 1`` the study driver asks for up to J trials at once, hands each valid config to
:meth:`Prebuilder.prepare`, then evaluates them one by one in the main process. A worker (a spawned
process with its own OpenCL context on the same device) runs ``algorithm.build`` once: that fills
the on-disk compile cache (``TUNECL_CACHE_DIR``, or the driver's, see :meth:`tunecl.runtime.Device.build`),
so the main process's own build of the same program is a fast load. A config the compiler rejects in the worker is reported as
COMPILE_ERROR at once, without compiling it again. Anything else going wrong with a worker (the
algorithm cannot be pickled, the pool broke) only loses the head start: the main process then builds
as it would with ``jobs=1``.

The worker processes are started once per device and job count and kept for the next problem
(``tunecl tune --net`` tunes dozens in a row; starting J processes that each open the device took a
second or more of every problem's budget). A problem's unstarted builds are cancelled when it ends; a
pool that broke is replaced for the next problem; the pools are shut down at exit.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tunecl import runtime
from tunecl.kernels.base import Algorithm
from tunecl.problems import Problem
from tunecl.runtime import build
from tunecl.search.evaluate import CANDIDATE_ERRORS, _describe
from tunecl.search.result import Config, Result, Status

BUILD_TIMEOUT = 300.0  # seconds a worker build may take, counted from when the result is needed

_worker_device: runtime.Device | None = None

# (device selector, jobs) -> the build processes, kept across problems (module docstring)
_pools: dict[tuple[str, int], concurrent.futures.ProcessPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(selector: str, jobs: int) -> concurrent.futures.ProcessPoolExecutor:
    with _pools_lock:
        pool = _pools.get((selector, jobs))
        if pool is None:
            pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(selector,))
            _pools[(selector, jobs)] = pool
        return pool


def _drop_pool(selector: str, jobs: int, pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Forget a broken pool (the next problem starts a new one)."""
    with _pools_lock:
        if _pools.get((selector, jobs)) is pool:
            del _pools[(selector, jobs)]
    pool.shutdown(wait=False, cancel_futures=True)


def shutdown_pools() -> None:
    """Stop every kept pool of build processes (at exit; tests)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.shutdown(wait=False, cancel_futures=True)


atexit.register(shutdown_pools)


def _init_worker(selector: str) -> None:
    global _worker_device
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    build.KEEP_AT_FIRST_BUILD = True   # the main process loads what this one builds
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
    """Builds of one problem's candidates in the kept pool of ``jobs`` processes for its device.

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
        self._pending: list[Future[Any]] = []

    def prepare(self, algorithm: str, config: Config) -> Callable[[], Result]:
        """Start building ``config`` in a worker; return what finishes its evaluation here."""
        pool = _pool(self.selector, self.jobs)
        future: Future[Any] | None
        try:
            future = pool.submit(_build_in_worker, self.algorithms[algorithm], self.problem, dict(config))
        except (RuntimeError, concurrent.futures.BrokenExecutor):
            _drop_pool(self.selector, self.jobs, pool)
            future = None
        else:
            self._pending.append(future)

        def finish() -> Result:
            if future is not None:
                try:
                    pid, error = future.result(timeout=self.timeout)
                except concurrent.futures.TimeoutError:
                    future.cancel()
                    return Result(algorithm, dict(config), Status.COMPILE_ERROR,
                                  message=f"build did not finish within {self.timeout:g} s in a worker")
                except concurrent.futures.BrokenExecutor:
                    _drop_pool(self.selector, self.jobs, pool)   # this build is lost; so is the head start
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
        """Cancel this problem's builds that have not started (the pool stays for the next problem)."""
        for future in self._pending:
            future.cancel()
        self._pending = []
