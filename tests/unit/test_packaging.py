"""What an installed package needs: the shipped tuning results and the OpenCL sources inside it (checked
on a real wheel, installed outside the checkout), and the studies' default storage beside the tuning DB it
belongs to."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import setuptools

from tunecl import config
from tunecl.db import shipped

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


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout, installed without dependencies into a fresh folder.

    The build runs in the test's interpreter without build isolation when its setuptools can build
    wheels, else in pip's isolated build environment (which fetches setuptools>=68).
    """
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    shutil.copytree(ROOT / "tunecl", source / "tunecl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    build = [*pip, "wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(source)]
    done = subprocess.run([*build, "--no-build-isolation", "--no-index"], check=False, cwd=work,
                          capture_output=True, text=True)
    if done.returncode != 0:
        done = subprocess.run(build, check=False, cwd=work, capture_output=True, text=True)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    wheels = sorted((work / "dist").glob("tunecl-*.whl"))
    assert len(wheels) == 1, wheels
    target = work / "site"
    install = [*pip, "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheels[0])]
    done = subprocess.run(install, check=False, cwd=work, capture_output=True, text=True)
    assert done.returncode == 0, f"pip install failed:\n{done.stderr[-2000:]}"
    return target


LOOKUP = """
import json, sys
from pathlib import Path
import tunecl
from tunecl.db import TuningDB
from tunecl.db.exchange import read_document

folder = Path(tunecl.__file__).parent / "tuning_db"
record = next(r for f in sorted(folder.glob("*.json")) for r in read_document(f) if r.time_s is not None)
with TuningDB(sys.argv[1]) as db:
    hit = db.lookup(record.device, record.problem, precision=record.precision)
print(json.dumps({"tunecl": tunecl.__file__, "problem": record.problem, "time_s": record.time_s,
                  "hit": None if hit is None else [hit.source, hit.problem, hit.time_s]}))
"""


def test_the_installed_wheel_serves_its_shipped_results(installed_wheel, tmp_path):
    """From outside the checkout, the wheel's tunecl (not the checkout's) counts the shipped results in
    an empty DB and serves one shipped problem from them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECL_")}
    env.update(PYTHONPATH=str(installed_wheel), HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path / "data"))
    db = tmp_path / "empty.sqlite"

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], check=False, cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args}: {done.stderr[-2000:]}"
        return done.stdout

    run("-m", "tunecl", "db", "upgrade", "--db", str(db))
    stats = json.loads(run("-m", "tunecl", "db", "stats", "--db", str(db), "--json"))
    expected = shipped.load(ROOT / "tunecl" / "tuning_db")
    assert stats["results"] == 0
    assert Path(stats["shipped"]["folder"]) == installed_wheel / "tunecl" / "tuning_db"
    assert stats["shipped"]["results"] == sum(len(rs) for rs in expected.by_device.values()) > 0
    assert len(stats["shipped"]["files"]) == len(expected.files)

    found = json.loads(run("-c", LOOKUP, str(db)))
    assert Path(found["tunecl"]).resolve() == (installed_wheel / "tunecl" / "__init__.py").resolve()
    assert found["hit"] is not None, f"no plan served for {found['problem']}"
    source, problem, time_s = found["hit"]
    assert source == "shipped" and problem == found["problem"] and time_s <= found["time_s"]


def test_the_installed_wheel_holds_every_opencl_source(installed_wheel):
    """Every ``.cl`` file of the checkout is in the wheel, where the package reads it as a resource: the
    kernel families' and the capability probes' (``runtime/capabilities.cl``)."""
    package = ROOT / "tunecl"
    sources = sorted(p.relative_to(package) for p in package.rglob("*.cl"))
    assert Path("runtime", "capabilities.cl") in sources
    missing = [str(p) for p in sources if not (installed_wheel / "tunecl" / p).is_file()]
    assert not missing, f"not in the wheel: {missing}"


EXPAND = """
import hashlib, json
import tunecl
from tunecl.kernels.base import read_source
# a conv kernel whose mma includes live with the GEMM core, and a library kernel with its own include
texts = {name: read_source(package, name) for package, name in
         (("tunecl.kernels.conv", "conv_implicit_gemm_mma.cl"), ("tunecl.kernels.ops", "pointwise.cl"))}
print(json.dumps({"tunecl": tunecl.__file__, **{n: hashlib.sha256(t.encode()).hexdigest() for n, t in texts.items()}}))
"""


def test_the_installed_wheel_expands_includes_across_the_kernel_folders(installed_wheel, tmp_path):
    """The wheel's tunecl finds a kernel's includes in the other kernel folders, as the checkout does:
    the expanded program text is the same."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNECL_")}
    env.update(PYTHONPATH=str(installed_wheel), HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", EXPAND], check=False, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    installed = json.loads(done.stdout)
    assert Path(installed.pop("tunecl")).resolve() == (installed_wheel / "tunecl" / "__init__.py").resolve()
    here = subprocess.run([sys.executable, "-c", EXPAND], check=True, cwd=ROOT, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT)})
    checkout = json.loads(here.stdout)
    assert Path(checkout.pop("tunecl")).resolve() == (ROOT / "tunecl" / "__init__.py").resolve()
    assert installed == checkout and len(installed) == 2
