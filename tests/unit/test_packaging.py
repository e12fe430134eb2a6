"""What an installed package needs: the shipped tuning results inside it, and the studies' default
storage beside the tuning DB it belongs to."""

from __future__ import annotations

import tomllib
from pathlib import Path

import setuptools

from tunecl import config

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_results_are_package_data():
    shipped = Path(config.Config.from_env({}).shipped_db)
    package = Path(config.__file__).resolve().parent
    assert shipped.parent == package and shipped.name == "tuning_db"
    assert sorted(p.name for p in shipped.glob("*.json")), "no shipped results"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setup = project["tool"]["setuptools"]
    found = setuptools.find_namespace_packages(str(ROOT), include=setup["packages"]["find"]["include"])
    assert "tunecl.tuning_db" in found   # a folder without __init__.py: packaged as a namespace package
    assert "*.json" in setup["package-data"]["*"]


def test_studies_live_next_to_the_db_they_belong_to(tmp_path):
    db = tmp_path / "team.sqlite"
    assert config.studies_next_to(str(db)) == f"sqlite:///{tmp_path / 'team-studies.sqlite'}"
    assert config.studies_next_to(f"sqlite:///{db}") == f"sqlite:///{tmp_path / 'team-studies.sqlite'}"
    env = {"TUNECL_DB": str(db)}
    assert config.Config.from_env(env).storage_url == f"sqlite:///{tmp_path / 'team-studies.sqlite'}"
    env["TUNECL_STORAGE"] = str(tmp_path / "elsewhere.sqlite")
    assert config.Config.from_env(env).storage_url == f"sqlite:///{tmp_path / 'elsewhere.sqlite'}"
    server = config.studies_next_to("postgresql://tunecl@db.example/tuning", tmp_path)
    assert server == f"sqlite:///{tmp_path / 'studies.sqlite'}"   # Optuna's tables cannot share tunecl's DB
