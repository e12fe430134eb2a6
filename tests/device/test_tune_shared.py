"""Two concurrent ``tunecl tune --net`` processes on one Optuna storage and one tuning DB.

They must finish with every problem stored once per (problem, algorithm) and no config measured twice
across the study (a trial told another worker's result is not a measurement). The storage is Optuna's
journal file storage — the way CI runs this test, needing no server. Where PostgreSQL (``initdb``,
``pg_ctl``) and a driver (psycopg2 or psycopg) are installed, the same test also runs against a
server the test starts in its tmp_path; CI does not install PostgreSQL for it.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest

from tunecl.db import TuningDB
from tunecl.search.coordination import ATTR, WORKER_ATTR
from tunecl.search.result import config_key
from tunecl.search.tuner import open_storage
from tunecl.search.workload import net_problems

HERE = Path(__file__).parent
REPO = HERE.parent.parent
NET = ["--net", "tiny_net:build", "--batch", "1", "--image-size", "6"]


def _tune_twice_at_once(storage: str, db: str) -> list[dict]:
    path = [str(HERE), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TUNECL_SHIPPED_DB="")
    command = [sys.executable, "-m", "tunecl", "tune", *NET, "--trials", "3", "--storage", storage,
               "--db", db, "--no-progress", "--json"]
    workers = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    for worker, (out, err) in zip(workers, outputs, strict=True):
        assert worker.returncode == 0, err
    return [json.loads(out) for out, _ in outputs]


def _check(storage_url: str, db_url: str, reports: list[dict]) -> None:
    problems = {p.key for p in net_problems("tiny_net:build", batch=1, image_size=6)}
    for report in reports:
        assert {row["problem"] for row in report["problems"]} == problems
        assert {row["status"] for row in report["problems"]} <= {"tuned", "skipped"}
    with TuningDB(db_url) as db:
        records = db.results()
    stored = collections.Counter((r.problem, r.algorithm, r.algorithm_version, r.precision) for r in records)
    assert {problem for problem, *_ in stored} == problems
    assert set(stored.values()) == {1}
    storage = open_storage(storage_url)
    measured = collections.Counter()
    workers = set()
    for summary in optuna.get_all_study_summaries(storage):
        if summary.study_name.startswith("tunecl:claims:"):
            continue
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        searched = 0
        for trial in study.get_trials(deepcopy=False):
            info = trial.user_attrs.get(ATTR) or {}
            if info.get("phase") == "search":  # a measurement (duplicates carry another's result)
                result = info["result"]
                measured[(summary.study_name, config_key(result["algorithm"], result["config"]))] += 1
                workers.add(trial.user_attrs[WORKER_ATTR])
                searched += 1
        assert searched <= 3  # --trials 3 is for both workers together
    assert measured and max(measured.values()) == 1, [k for k, n in measured.items() if n > 1]


@pytest.mark.slow
def test_two_processes_on_one_journal_storage_share_the_work(tmp_path):
    storage, db = f"journal://{tmp_path}/studies.log", f"sqlite:///{tmp_path}/db.sqlite"
    _check(storage, db, _tune_twice_at_once(storage, db))


def _postgres_driver() -> str | None:
    for module in ("psycopg2", "psycopg"):
        try:
            __import__(module)
        except ImportError:
            continue
        return module
    return None


@pytest.fixture
def postgres_url(tmp_path):
    """A PostgreSQL server of this test, in tmp_path (skips where PostgreSQL or a driver is missing, fails
    instead with ``TUNECL_TEST_POSTGRES=required``, which ``.ci/run`` sets once it has installed both;
    run as root, the server runs as the ``postgres`` user in a temporary folder of its own)."""
    initdb, pg_ctl, driver = shutil.which("initdb"), shutil.which("pg_ctl"), _postgres_driver()
    if not (initdb and pg_ctl and driver):
        missing = "PostgreSQL (initdb, pg_ctl) or its Python driver is not installed"
        if os.environ.get("TUNECL_TEST_POSTGRES") == "required":  # CI installed them: a skip is a failure
            pytest.fail(f"{missing}, but TUNECL_TEST_POSTGRES=required")
        pytest.skip(missing)
    run_as: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root: run it as the postgres user
        if not shutil.which("runuser"):
            pytest.skip("running as root without runuser to start PostgreSQL as another user")
        run_as = ["runuser", "-u", "postgres", "--"]
    if run_as:  # pytest's tmp_path is private to root: give the server a folder it can reach
        home = Path(tempfile.mkdtemp(prefix="tunecl-pg-"))
        shutil.chown(home, "postgres")
    else:
        home = tmp_path
    data = home / "pg"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # a throwaway server: nothing is synced to disk (initdb --no-sync, fsync off), which takes seconds
    subprocess.run([*run_as, initdb, "-D", str(data), "-U", "tunecl", "--auth=trust", "--no-sync"],
                   check=True, capture_output=True)
    settings = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
    subprocess.run([*run_as, pg_ctl, "-D", str(data), "-l", str(data / "log"), "-w", "-o", settings, "start"],
                   check=True, capture_output=True)
    try:
        scheme = f"postgresql+{driver}"
        yield f"{scheme}://tunecl@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], check=False,
                       capture_output=True)
        if home != tmp_path:
            shutil.rmtree(home, ignore_errors=True)


@pytest.mark.slow
def test_two_processes_on_one_postgresql_server_share_the_work(tmp_path, postgres_url):
    db = f"sqlite:///{tmp_path}/db.sqlite"
    _check(postgres_url, db, _tune_twice_at_once(postgres_url, db))
