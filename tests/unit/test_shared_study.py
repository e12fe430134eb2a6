"""Several workers on one study: storage URLs, and the driver sharing trials between workers.

The workers are :class:`StudyDriver` s of one process interleaved deterministically (each given its
own worker id), so every race is replayed in a fixed order without threads or OpenCL.
"""

from __future__ import annotations

import optuna
import pytest

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
