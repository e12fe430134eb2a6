"""The results shipped in ``tunecl/tuning_db/`` can all be served: each names a registered algorithm at its
current version, and its parameters pass that algorithm's space for its problem on a stand-in of the device
that stored it (its fingerprint's limits, every capability a GPU of its vendor may have). A result that
fails here is dead weight at best; at worst it is the best result of its problem, which then runs the
default plan on the very device it was tuned for."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from tunecl import kernels
from tunecl.fingerprint import Fingerprint
from tunecl.problems import problem_from_key
from tunecl.runtime import CP_ASYNC, MMA_F16, MMA_TF32, WGMMA

SHIPPED = Path(__file__).resolve().parents[2] / "tunecl" / "tuning_db"
FILES = sorted(SHIPPED.glob("*.json"))


class StandIn:
    """What spaces read of a device, from a stored record's device fields (hashable: spaces are cached
    by device)."""

    def __init__(self, fields: dict):
        self.fingerprint = fingerprint = Fingerprint(**fields)
        self.local_mem_size = fingerprint.local_mem_size
        self.max_work_group_size = fingerprint.max_work_group_size
        self.max_alloc_size = fingerprint.global_mem_size // 4
        nvidia = "nvidia" in fingerprint.vendor.lower() and fingerprint.device_type == "gpu"
        self.capabilities = frozenset({MMA_TF32, MMA_F16, CP_ASYNC, WGMMA}) if nvidia else frozenset()


def test_there_are_shipped_results():
    assert len(FILES) >= 3, FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_shipped_result_is_servable(path):
    records = json.loads(path.read_text())["records"]
    registered = {a.name: a for kind in ("gemm", "conv", "attention") for a in kernels.algorithms(kind)}
    refused = collections.Counter()
    examples = {}
    devices: dict[str, StandIn] = {}
    for record in records:
        device = devices.setdefault(json.dumps(record["device"], sort_keys=True), StandIn(record["device"]))
        algorithm = registered.get(record["algorithm"])
        if algorithm is None:
            why = "no such algorithm"
        elif record["algorithm_version"] != algorithm.version:
            why = f"version {record['algorithm_version']}, registered {algorithm.version}"
        else:
            problem = problem_from_key(record["problem"])
            broken = algorithm.space(problem, device).violations(record["params"])
            why = ", ".join(broken)
        if why:
            refused[record["algorithm"]] += 1
            examples.setdefault(record["algorithm"], f"{record['problem']} {record['params']}: {why}")
    assert not refused, f"{sum(refused.values())} of {len(records)} unservable: {dict(refused)}; {examples}"
