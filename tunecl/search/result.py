"""What one evaluation of a candidate returns: a :class:`Status` and a frozen :class:`Result`.

Evaluation never raises into the search (Kernel Tuner's ``ErrorConfig`` idea): every outcome, good or
bad, is a value the strategy can rank, store and show.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
from collections.abc import Mapping
from typing import Any

Config = dict[str, int]


class Status(str, enum.Enum):
    """How an evaluation ended. Only ``OK`` results may win or be stored as servable."""

    OK = "ok"
    COMPILE_ERROR = "compile_error"  # the build (or kernel creation) failed
    LAUNCH_ERROR = "launch_error"  # enqueueing or running the plan failed
    WRONG_RESULT = "wrong_result"  # output differs from the reference or wrote outside its region
    TIMEOUT = "timeout"  # measuring took longer than the per-candidate limit
    INVALID = "invalid"  # the config breaks a constraint of its space (never compiled)


@dataclasses.dataclass(frozen=True)
class Result:
    """The outcome of evaluating one config of one algorithm.

    Attributes:
        algorithm: name of the algorithm (kernel family variant).
        config: the parameter values evaluated.
        status: how it ended.
        times: raw device-time samples in seconds (empty unless measured).
        message: why it failed, or a note about the measurement ("" when there is nothing to say).
    """

    algorithm: str
    config: Config
    status: Status
    times: tuple[float, ...] = ()
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def time(self) -> float:
        """Median of the samples in seconds; ``inf`` when failed or not measured (so it never wins)."""
        if not self.ok or not self.times:
            return math.inf
        return float(statistics.median(self.times))

    @property
    def key(self) -> tuple[str, tuple[tuple[str, int], ...]]:
        """A hashable identity of (algorithm, config), equal for equal configs in any order."""
        return config_key(self.algorithm, self.config)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable form (kept as an Optuna user attribute; inverse of :meth:`from_dict`)."""
        return {"algorithm": self.algorithm, "config": dict(self.config), "status": self.status.value,
                "times": list(self.times), "message": self.message}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Result:
        """Rebuild a Result from :meth:`to_dict` output (raises KeyError/ValueError when malformed)."""
        return Result(str(data["algorithm"]), {str(k): int(v) for k, v in data["config"].items()},
                      Status(data["status"]), tuple(float(t) for t in data.get("times", ())),
                      str(data.get("message", "")))


def summarize(result: Result) -> dict[str, Any]:
    """A compact JSON form for records kept per study: the samples' count, min, median and max instead
    of every sample, and ``time_s``, the time the result is ranked by (None when it cannot win).

    :func:`from_summary` rebuilds a Result that ranks exactly as the original (its one sample is
    ``time_s``)."""
    data: dict[str, Any] = {"algorithm": result.algorithm, "config": dict(result.config),
                            "status": result.status.value, "message": result.message,
                            "time_s": result.time if math.isfinite(result.time) else None}
    if result.times:
        data["samples"] = {"count": len(result.times), "min": min(result.times),
                           "median": float(statistics.median(result.times)), "max": max(result.times)}
    return data


def from_summary(data: Mapping[str, Any]) -> Result:
    """Rebuild a Result from :func:`summarize` output, or from :meth:`Result.to_dict` output (which
    keeps every sample); raises KeyError/ValueError/TypeError when malformed."""
    if "times" in data:
        return Result.from_dict(data)
    time_s = data["time_s"]
    return Result(str(data["algorithm"]), {str(k): int(v) for k, v in data["config"].items()},
                  Status(data["status"]), () if time_s is None else (float(time_s),),
                  str(data.get("message", "")))


def config_key(algorithm: str, config: Mapping[str, int]) -> tuple[str, tuple[tuple[str, int], ...]]:
    """The hashable identity of one candidate: its algorithm and sorted parameter values."""
    return algorithm, tuple(sorted((str(k), int(v)) for k, v in config.items()))


def format_config(config: Mapping[str, int]) -> str:
    """``MWG=64 NWG=32 ...`` in the config's own order (the family's parameter order)."""
    return " ".join(f"{k}={v}" for k, v in config.items()) or "(no parameters)"
