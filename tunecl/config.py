"""One explicit configuration object, built from ``TUNECL_*`` environment variables when asked for.

Nothing reads the environment at import time: call :func:`get` where a setting is needed, and tests use
:func:`override` to change settings for a block of code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

import platformdirs

_APP = "tunecl"
# the shipped results are package data: <package>/tuning_db, in a checkout and in an installed wheel alike
_DEFAULT_SHIPPED_DB = Path(__file__).resolve().parent / "tuning_db"
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings of one tunecl process.

    Attributes:
        device: default device selector (``TUNECL_DEVICE``): an index, ``platform:device`` or a name part.
        db_url: SQLAlchemy URL of the user tuning DB (``TUNECL_DB``; a plain path means SQLite).
        storage_url: Optuna storage URL for studies (``TUNECL_STORAGE``; default :func:`studies_next_to` the DB).
        cache_dir: folder of the disposable compile cache (``TUNECL_CACHE_DIR``).
        fallback: what an op without a device kernel does (``TUNECL_FALLBACK``): ``warn``, ``silent``
            or ``error``.
        shipped_db: folder of the shipped read-only tuning results (``TUNECL_SHIPPED_DB``); defaults
            to the package's ``tuning_db/`` (``tunecl/tuning_db``); an empty string disables the shipped results.
        tune: what the backend does for a conv/GEMM shape without a stored result (``TUNECL_TUNE``):
            ``off`` (run the heuristic default) or ``on-miss`` (tune it with a small budget, store
            the result in the user DB and run it, like ``cudnn.benchmark``).
        winograd_cache: when the backend keeps a Winograd convolution's transformed weight between calls
            (``TUNECL_WINOGRAD_CACHE``): ``auto`` (weights that are plausibly not being trained: the
            forward without grad mode, or a weight that does not require grad), ``on`` (every weight)
            or ``off``; see :mod:`tunecl.backend.weight_cache`.
        winograd_cache_mb: the most MiB the transformed weights may hold (``TUNECL_WINOGRAD_CACHE_MB``).
        launch_batch: how many of the backend's small elementwise launches may wait on the host to be
            enqueued together (``TUNECL_LAUNCH_BATCH``): ``None`` (``auto``: 32 on CPU devices, whose
            worker threads share the host's cores and are woken once per enqueue, off elsewhere), or
            a number (0 or 1: off); see :meth:`tunecl.runtime.Device.defer`.
        flush_every: submit the queue's commands to the device (``clFlush``) every this many uses of
            the queue (``TUNECL_FLUSH_EVERY``): ``None`` (``auto``: 16 on GPUs and other non-CPU devices,
            off on CPU devices) or a number (0: never); see :attr:`tunecl.runtime.Device.queue`.
        optim_slots: tensors per launch of the multi-tensor optimizer and ``_foreach_*`` kernels
            (``TUNECL_OPTIM_SLOTS``): ``None`` (``auto``, the default: the most of 8, 16, 24 and 32 the
            device's kernel-argument bytes allow: 32 on NVIDIA, 8 on PoCL) or 1-8, 16, 24 or 32; see
            :func:`tunecl.kernels.ops.optim.slots_for`.
        addresses: whether the multi-tensor kernels may take their tensors' device addresses by value
            instead of a pointer argument per tensor (``TUNECL_ADDRESSES``): ``auto`` (the default:
            where a probe finds the device keeps buffers at their addresses) or ``off``; see
            :mod:`tunecl.runtime.addresses`.
        random: where dropout's masks and ``bernoulli_(p)`` on float32 or bool tensors are drawn
            (``TUNECL_RANDOM``): ``device`` (Philox on the device, keyed by one number drawn from torch's
            CPU generator per call, so ``torch.manual_seed`` reproduces them), ``host`` (torch's CPU
            generator draws every number as the CPU kernels do and the mask is uploaded: the CPU's
            masks bit for bit, at the cost of the host's draw and upload) or ``auto`` (the default:
            ``device`` on GPUs and other non-CPU devices, ``host`` on CPU devices, where the host's
            draw is the faster); see :mod:`tunecl.backend.random_draws`.
        backward_thread: which thread runs the backward passes of opencl tensors
            (``TUNECL_BACKWARD_THREAD``): ``caller`` (the thread that called ``backward``, as torch does for
            CPU tensors), ``worker`` (torch's autograd thread for the device) or ``auto`` (the default:
            ``caller``); see :mod:`tunecl.backend.autograd_engine`.
        foreach_runs: whether eager ``_foreach_*`` calls made without grad mode (a foreach optimizer's
            step) wait to run as one multi-tensor kernel per run of calls (``TUNECL_FOREACH_RUNS``): ``on``
            (the default) or ``off``; see :mod:`tunecl.backend.foreach_runs`.
    """

    device: str = "0"
    db_url: str = ""
    storage_url: str = ""
    cache_dir: str = ""
    fallback: str = "warn"
    shipped_db: str = ""
    tune: str = "off"
    winograd_cache: str = "auto"
    winograd_cache_mb: int = 512
    launch_batch: int | None = None
    flush_every: int | None = None
    optim_slots: int | None = None
    addresses: str = "auto"
    random: str = "auto"
    backward_thread: str = "auto"
    foreach_runs: str = "on"

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> Config:
        env = os.environ if env is None else env
        data_dir = Path(platformdirs.user_data_dir(_APP))
        cache_dir = env.get("TUNECL_CACHE_DIR") or platformdirs.user_cache_dir(_APP)
        return Config(
            device=env.get("TUNECL_DEVICE", "0") or "0",
            db_url=(db_url := normalize_db_url(env.get("TUNECL_DB") or str(data_dir / "tuning.sqlite"))),
            storage_url=normalize_db_url(env.get("TUNECL_STORAGE") or studies_next_to(db_url, data_dir)),
            cache_dir=cache_dir,
            fallback=(env.get("TUNECL_FALLBACK") or "warn").lower(),
            # unset means the default folder, set-but-empty means "no shipped results"
            shipped_db=env.get("TUNECL_SHIPPED_DB", str(_DEFAULT_SHIPPED_DB)),
            tune=(env.get("TUNECL_TUNE") or "off").lower(),
            winograd_cache=(env.get("TUNECL_WINOGRAD_CACHE") or "auto").lower(),
            winograd_cache_mb=_int(env, "TUNECL_WINOGRAD_CACHE_MB", 512),
            launch_batch=_count(env.get("TUNECL_LAUNCH_BATCH") or "auto", "TUNECL_LAUNCH_BATCH", "launches"),
            flush_every=_count(env.get("TUNECL_FLUSH_EVERY") or "auto", "TUNECL_FLUSH_EVERY", "queue uses"),
            optim_slots=_slots(env.get("TUNECL_OPTIM_SLOTS") or "auto"),
            addresses=_choice(env, "TUNECL_ADDRESSES", ADDRESS_MODES),
            random=(env.get("TUNECL_RANDOM") or "auto").lower(),
            backward_thread=_choice(env, "TUNECL_BACKWARD_THREAD", BACKWARD_THREADS),
            foreach_runs=_choice(env, "TUNECL_FOREACH_RUNS", FOREACH_RUNS),
        )


TUNE_MODES = ("off", "on-miss")
WINOGRAD_CACHE_MODES = ("auto", "on", "off")
RANDOM_MODES = ("auto", "device", "host")
ADDRESS_MODES = ("auto", "off")
BACKWARD_THREADS = ("auto", "caller", "worker")
FOREACH_RUNS = ("on", "off")


def _choice(env: dict[str, str], name: str, choices: tuple[str, ...]) -> str:
    """The environment variable ``name``, one of ``choices`` (unset or empty: the first)."""
    value = (env.get(name) or choices[0]).strip().lower()
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, not {env.get(name)!r}")
    return value


def _count(value: str, name: str, what: str) -> int | None:
    """``auto`` (None) or a count ≥ 0 from the environment variable ``name``."""
    if value.strip().lower() == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"{name} must be 'auto' or a number of {what}, not {value!r}") from None
    if count < 0:
        raise ValueError(f"{name} must not be negative, not {value!r}")
    return count


OPTIM_SLOTS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32)


def _slots(value: str) -> int | None:
    """``TUNECL_OPTIM_SLOTS``: ``auto`` (None) or one of :data:`OPTIM_SLOTS`."""
    if value.strip().lower() == "auto":
        return None
    try:
        slots = int(value)
    except ValueError:
        slots = -1
    if slots not in OPTIM_SLOTS:
        raise ValueError(f"TUNECL_OPTIM_SLOTS must be 'auto' or one of {', '.join(map(str, OPTIM_SLOTS))}, "
                         f"not {value!r}")
    return slots


def _int(env: dict[str, str], name: str, default: int) -> int:
    value = env.get(name) or ""
    try:
        return int(value) if value.strip() else default
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {value!r}") from None


def studies_next_to(db_url: str, data_dir: Path | None = None) -> str:
    """The default Optuna storage for the tuning DB ``db_url``: for a SQLite file ``NAME.sqlite``, the file
    ``NAME-studies.sqlite`` beside it (so another DB never resumes this one's studies); for a server DB,
    ``studies.sqlite`` in the user data folder (Optuna's tables cannot share a database with tunecl's:
    both keep an ``alembic_version`` table)."""
    db_url = normalize_db_url(db_url)
    if db_url.startswith("sqlite:///") and db_url != "sqlite:///:memory:":
        path = Path(db_url[len("sqlite:///"):])
        return "sqlite:///" + str(path.with_name(f"{path.stem}-studies.sqlite"))
    return normalize_db_url(str((data_dir or Path(platformdirs.user_data_dir(_APP))) / "studies.sqlite"))


def normalize_db_url(value: str) -> str:
    """Turn a plain file path into a SQLite URL; leave real URLs (``scheme://...``) alone."""
    if "://" in value:
        return value
    return "sqlite:///" + str(Path(value).expanduser().absolute())


_override: Config | None = None


def get() -> Config:
    """The current configuration: an active :func:`override`, else the environment."""
    return _override if _override is not None else Config.from_env()


# os.environ's own dict (encoded keys and values; os.environ[...] = ... and putenv through it update it):
# a lookup there costs ~0.1 µs, through os.environ.get ~1 µs
_environ = getattr(os.environ, "_data", None)


class Derived(Generic[T]):
    """A value a hot path derives from :func:`get` (which reads the environment, ~25 µs): derived again
    only when the active :func:`override` or one of the environment variables ``names`` changes, so a
    read costs ~0.5 µs. ``derive`` may raise ``ValueError`` for a bad setting (raised at every read)."""

    def __init__(self, derive: Callable[[Config], T], *names: str) -> None:
        self._derive = derive
        self._names = names
        self._keys = tuple(os.environ.encodekey(name) for name in names) if _environ is not None else ()
        self._source: tuple | None = None
        self._value: T | None = None

    def __call__(self) -> T:
        if _environ is not None:
            source = (_override, *(_environ.get(key) for key in self._keys))
        else:
            source = (_override, *(os.environ.get(name) for name in self._names))
        if source != self._source:
            self._value = self._derive(get())
            self._source = source
        return self._value   # type: ignore[return-value]


@contextlib.contextmanager
def override(**changes: str) -> Iterator[Config]:
    """Use a configuration with ``changes`` applied inside the ``with`` block (for tests and tools)."""
    global _override
    previous = _override
    _override = dataclasses.replace(get(), **changes)
    try:
        yield _override
    finally:
        _override = previous
