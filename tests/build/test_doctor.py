"""polyforge doctor: each check ok or missing, with the fix; exit 3 when a required one is missing."""

from __future__ import annotations

import json
import os

from buildkit import closed_url, redis_url  # noqa: F401 - fixtures
from conftest import run_cli
from polyforge.build import doctor
from polyforge.build import remote_cache
from polyforge.build import toolchain
from polyforge.gates import GATE_MODULES


def _by_name(checks):
    return {c.name: c for c in checks}


def test_checks_on_this_machine(tmp_path):
    checks = _by_name(doctor.checks(tmp_path))
    assert set(checks) == {"python", "cmake", "ninja", "c++ compiler", "c compiler", "nvcc", "cublas", "gpu", "ccache", "remote cache",
                           "disk"} | {f"python module {m}" for m in GATE_MODULES}
    assert checks["python"].ok and checks["cmake"].ok and checks["ninja"].ok
    assert "cmake version" in checks["cmake"].detail
    assert "GiB free" in checks["disk"].detail
    for check in checks.values():
        assert check.ok or check.fix, check  # every missing thing comes with a fix


def test_missing_tools_are_reported_with_fixes(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler, ccache, nvcc or nvidia-smi on PATH
    monkeypatch.setenv("CXX", "no-such-c++")
    monkeypatch.setenv("CUDACXX", str(tmp_path / "nvcc"))
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    checks = _by_name(doctor.checks(tmp_path))
    assert not checks["c++ compiler"].ok and "build-essential" in checks["c++ compiler"].fix
    assert not checks["ccache"].ok and not checks["ccache"].required and "apt-get install ccache" in checks["ccache"].fix
    assert not checks["nvcc"].ok and not checks["nvcc"].required
    assert not checks["gpu"].ok and "--arch" in checks["gpu"].fix
    assert checks["cmake"].ok  # from the Python package, not PATH


def test_doctor_cli(tmp_path):
    done = run_cli("doctor", "--json", cwd=tmp_path)
    report = json.loads(done.stdout)
    required_ok = all(c["ok"] for c in report["checks"] if c["required"])
    assert report["ok"] is required_ok and done.returncode == (0 if required_ok else 3)
    done = run_cli("doctor", "--json", cwd=tmp_path, env={"CXX": "no-such-c++", "PATH": os.environ["PATH"]})
    assert done.returncode == 3 and json.loads(done.stdout)["ok"] is False


def test_every_module_the_gates_import_is_checked(tmp_path, monkeypatch):
    checks = _by_name(doctor.checks(tmp_path))
    assert GATE_MODULES and all(checks[f"python module {m}"].ok for m in GATE_MODULES)
    assert all(checks[f"python module {m}"].required for m in GATE_MODULES)  # `polyforge up` runs the gates
    monkeypatch.setitem(GATE_MODULES, "no_such_module_for_doctor", "no-such-dist")
    missing = _by_name(doctor.checks(tmp_path))["python module no_such_module_for_doctor"]
    assert not missing.ok and missing.required and "pip install no-such-dist" in missing.fix


def test_doctor_cli_lists_the_gate_modules(tmp_path):
    done = run_cli("doctor", cwd=tmp_path)
    for module in GATE_MODULES:
        assert f"python module {module}" in done.stderr


def test_doctor_reports_the_remote(monkeypatch, redis_url, closed_url, tmp_path):
    monkeypatch.delenv(remote_cache.ENV_VAR, raising=False)
    assert doctor.remote_cache_check(None).ok and "none configured" in doctor.remote_cache_check(None).detail
    monkeypatch.setenv(remote_cache.ENV_VAR, redis_url)
    check = doctor.remote_cache_check(tmp_path / "build.yaml")
    assert check.ok and "answers" in check.detail and not check.required
    monkeypatch.setenv(remote_cache.ENV_VAR, closed_url)
    check = doctor.remote_cache_check(tmp_path / "build.yaml")
    assert not check.ok and "cannot reach" in check.detail and check.fix
    done = run_cli("doctor", "--json", cwd=tmp_path, env={remote_cache.ENV_VAR: closed_url})
    row = [c for c in json.loads(done.stdout)["checks"] if c["name"] == "remote cache"]
    assert row and row[0]["ok"] is False and row[0]["required"] is False
