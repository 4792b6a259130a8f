"""A plain (non-editable) `pip install .` into a fresh venv has everything the main job's
Python side needs, run from outside the checkout: the CLI, doctor's checks of the modules
the gates import, the gate list, and a random-weight GGUF made by the installed package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from polyforge.gates import GATE_MODULES, runner

pytestmark = pytest.mark.slow


def test_a_plain_install_runs_from_anywhere(tmp_path):
    # build from a copy of what the package is made of: building in the checkout would
    # write setuptools' build/ into polyforge's own build root
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "polyforge", source / "polyforge", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "COLUMNS")}
    done = subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           str(source)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the project is found through POLYFORGE_ROOT; nothing of the checkout is on sys.path
    env.update(POLYFORGE_ROOT=str(ROOT), POLYFORGE_CACHE=str(tmp_path / "cache"), PYTHONDONTWRITEBYTECODE="1")

    def polyforge(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([venv / "bin" / "polyforge", *args], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=600)

    where = subprocess.run([venv / "bin" / "python", "-c", "import polyforge; print(polyforge.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(venv)
    assert polyforge("--help").returncode == 0
    report = json.loads(polyforge("doctor", "--json").stdout)
    modules = {c["name"]: c for c in report["checks"] if c["name"].startswith("python module ")}
    assert set(modules) == {f"python module {m}" for m in GATE_MODULES}
    assert all(c["ok"] for c in modules.values()), modules
    listed = polyforge("gate", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {g["name"] for g in json.loads(listed.stdout)} == {p.stem for p in runner.gate_files(ROOT / "gates")}
    made = polyforge("models", "fetch", "random:tiny,n_layer=1", "--json")
    assert made.returncode == 0, made.stderr
    path = Path(json.loads(made.stdout)[0]["path"])
    assert path.is_relative_to(tmp_path / "cache") and path.read_bytes()[:4] == b"GGUF"
