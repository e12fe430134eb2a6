"""Several workers on one study: storage URLs, and the driver sharing trials between workers.

The workers are :class:`StudyDriver` s of one process interleaved deterministically (each given its
own worker id), so every race is replayed in a fixed order without threads or OpenCL.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState
from test_strategies import Replay, make_space  # the replay evaluator and its synthetic space

from tunecl.search.claims import Claims
from tunecl.search.coordination import ATTR, WORKER_ATTR
from tunecl.search.result import config_key
from tunecl.search.strategies import TPE, Budget, Exhaustive, RandomSearch
from tunecl.search.tuner import open_storage


def test_open_storage_understands_journal_rdb_and_plain_paths(tmp_path):
    journal = open_storage(f"journal://{tmp_path}/deep/studies.log")
    assert isinstance(journal, optuna.storages.JournalStorage)
    optuna.create_study(storage=journal, study_name="s").enqueue_trial({"x": 1})
    assert (tmp_path / "deep" / "studies.log").exists()
    again = optuna.load_study(study_name="s", storage=open_storage(f"journal://{tmp_path}/deep/studies.log"))
    assert len(again.trials) == 1
    rdb = open_storage(str(tmp_path / "sub" / "studies.sqlite"))
    assert isinstance(rdb, optuna.storages.RDBStorage) and (tmp_path / "sub").is_dir()
    with pytest.raises(ValueError, match="without a file"):
        open_storage("journal:///")


# -- two workers on one study -----------------------------------------------------------------------
# Worker "b" runs a whole search *inside* one evaluation of worker "a", so "a" has a trial RUNNING
# (being measured) the whole time "b" works: the deterministic form of two concurrent workers.

def _searches(storage, name):
    """Phase-"search" trials of the study (each is one measurement) as (worker, config key)."""
    study = optuna.load_study(study_name=name, storage=storage)
    out = []
    for t in study.get_trials():
        info = t.user_attrs.get(ATTR) or {}
        if info.get("phase") == "search":
            r = info["result"]
            out.append((t.user_attrs[WORKER_ATTR], config_key(r["algorithm"], r["config"])))
    return out, study


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("strategy", [TPE, RandomSearch, Exhaustive], ids=lambda s: s.name)
def test_two_workers_share_the_budget_and_never_measure_a_config_twice(strategy, jobs):
    space = make_space()
    storage = optuna.storages.InMemoryStorage()
    b_calls = Replay(space)
    b_logs = []

    class A(Replay):
        def __call__(self, algorithm, config):
            if not self.calls:  # a's first measurement: b does all its work meanwhile
                b = strategy(storage, "shared", seed=0, worker="b", jobs=jobs)
                b_logs.append(b.search(space, b_calls, Budget(trials=10, top_k=0)))
            return super().__call__(algorithm, config)

    a_calls = A(space)
    log = strategy(storage, "shared", seed=0, worker="a", jobs=jobs).search(space, a_calls,
                                                                           Budget(trials=10, top_k=0))
    measured = [config_key(a, c) for a, c in a_calls.calls + b_calls.calls]
    assert len(measured) == 10 and len(set(measured)) == 10  # two workers together: N, each once
    searches, _ = _searches(storage, "shared")
    assert sorted(k for _, k in searches) == sorted(measured)
    assert {w for w, _ in searches} == {"a", "b"}
    # b counted a's running trials (a batch of ``jobs``) against the budget; a's winner is chosen
    # from both workers' results
    assert len(b_logs[0].results) == 10 - jobs and len(log.results) == 10
    assert log.evaluated == len(a_calls.calls) and log.resumed == 10 - len(a_calls.calls)
    best = min((r for r in log.results if r.ok), key=lambda r: r.time)
    assert log.winner == best


def test_a_config_measured_by_another_worker_is_told_its_result_and_one_being_measured_is_skipped():
    space = make_space()
    storage = optuna.storages.InMemoryStorage()
    tiled = {"X": 1, "Y": 1}  # a's first measurement: the default of 'tiled'
    b_calls = Replay(space)
    b_first: list = []

    class A(Replay):
        def __call__(self, algorithm, config):
            if not self.calls:
                study = optuna.load_study(study_name="s", storage=storage)
                # b was told about a's proposal too late (a race): its next trial is a's config
                study.enqueue_trial({"algorithm": "tiled", "tiled.X": 1, "tiled.Y": 1})
                log = RandomSearch(storage, "s", seed=5, worker="b").search(space, b_calls,
                                                                            Budget(trials=4, top_k=0))
                b_first.append(log.results[0])
                # ... and a will next be handed a config b has measured
                study.enqueue_trial({"algorithm": b_first[0].algorithm,
                                     **{f"{b_first[0].algorithm}.{p}": v for p, v in b_first[0].config.items()}})
            return super().__call__(algorithm, config)

    a_calls = A(space)
    log = RandomSearch(storage, "s", seed=5, worker="a").search(space, a_calls, Budget(trials=8, top_k=0))
    searches, study = _searches(storage, "s")
    keys = [k for _, k in searches]
    assert len(keys) == 8 and len(set(keys)) == 8
    assert b_calls.count("tiled", tiled) == 0 and a_calls.count("tiled", tiled) == 1
    assert b_calls.count(b_first[0].algorithm, b_first[0].config) == 1
    assert a_calls.count(b_first[0].algorithm, b_first[0].config) == 0
    phases = [(t.user_attrs.get(WORKER_ATTR), (t.user_attrs.get(ATTR) or {}).get("phase"), t)
              for t in study.get_trials()]
    busy = [t for w, p, t in phases if p == "busy"]
    assert [t.user_attrs[WORKER_ATTR] for t in busy] == ["b"] and busy[0].state == TrialState.FAIL
    told = [t for w, p, t in phases if w == "a" and p == "duplicate"
            and t.user_attrs[ATTR]["result"]["config"] == b_first[0].config]
    assert told and told[0].value == b_first[0].time  # b's measurement, not a new one
    assert log.duplicates >= 1


def test_a_worker_left_nothing_to_measure_waits_for_the_others_results(monkeypatch):
    """Another worker's running trials fill the whole budget: this worker measures nothing, waits for them
    and ends with their winner instead of failing with no candidate."""
    import threading

    from tunecl.search import coordination

    monkeypatch.setattr(coordination, "AWAIT_POLL_S", 0.01)
    space = make_space()
    storage = optuna.storages.InMemoryStorage()
    measuring, release = threading.Event(), threading.Event()

    class Slow(Replay):
        def __call__(self, algorithm, config):
            measuring.set()
            release.wait(10)
            return super().__call__(algorithm, config)

    a_calls, a_logs = Slow(space), []
    a = threading.Thread(target=lambda: a_logs.append(
        RandomSearch(storage, "s", seed=1, worker="a").search(space, a_calls, Budget(trials=1, top_k=0))))
    a.start()
    assert measuring.wait(10)
    threading.Timer(0.3, release.set).start()
    b_calls = Replay(space)
    log = RandomSearch(storage, "s", seed=1, worker="b").search(space, b_calls, Budget(trials=1, top_k=0))
    a.join(10)
    assert b_calls.calls == [] and log.evaluated == 0
    assert log.winner is not None and log.winner == a_logs[0].winner


# -- claims on problems (tune --net) ----------------------------------------------------------------

def test_claims_hold_off_other_workers_until_done_or_stale():
    storage = optuna.storages.InMemoryStorage()
    now = [1000.0]
    a = Claims(storage, "dev", worker="host-a:1", clock=lambda: now[0], stale_after=600)
    b = Claims(storage, "dev", worker="host-b:2", clock=lambda: now[0], stale_after=600)
    assert a.holder("fp32:p") is None and a.claim("fp32:p")
    assert b.holder("fp32:p") == "host-a:1" and a.holder("fp32:p") is None
    now[0] += 500
    a.beat("fp32:p")  # a heartbeat keeps the claim alive
    now[0] += 500
    assert b.holder("fp32:p") == "host-a:1"
    now[0] += 601  # a fell silent: its claim is stale and b takes it over
    assert b.holder("fp32:p") is None and b.claim("fp32:p") and a.holder("fp32:p") == "host-b:2"
    b.release("fp32:p")
    assert a.holder("fp32:p") is None and a.done_elsewhere("fp32:p") and not b.done_elsewhere("fp32:p")
    # a race: both write before either reads back; the last writer holds it, the other one learns
    # that it lost (and tunes along in the shared study)
    a._write("fp32:q", {})
    b._write("fp32:q", {})
    assert a.holder("fp32:q") == "host-b:2" and b.holder("fp32:q") is None
