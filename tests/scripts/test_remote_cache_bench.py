"""scripts/remote_cache_bench.py on the tiny CMake project (a git repository of its own): the four
builds, the second clone's compilations all from the remote, the down remote's one warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from buildkit import TINY_TARGETS, tiny_project

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "remote_cache_bench.py"


def test_four_builds_side_by_side(tmp_path, monkeypatch):
    proj = tiny_project(tmp_path, monkeypatch)
    (proj.root / ".gitignore").write_text("/vendor/llama.cpp/\n/vendor/.lock\n/build/\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny"]):
        subprocess.run(["git", *args], cwd=proj.root, check=True)
    targets = [a for t in TINY_TARGETS for a in ("--target", t)]
    done = subprocess.run([sys.executable, str(SCRIPT), "--repo", str(proj.root), "-j", "2", *targets, "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert list(rows) == ["cold", "cold+remote", "second clone", "remote down"]
    assert rows["cold"]["compiler_cache"]["compiled"] == 3 and rows["cold"]["compiler_cache"]["remote"] is None
    second = rows["second clone"]["compiler_cache"]
    assert second["compilations"] == second["remote_hits"] == 3 and second["compiled"] == 0
    assert rows["cold+remote"]["compiler_cache"]["remote_hits"] == 0
    down = rows["remote down"]
    assert len(down["warnings"]) == 1 and down["compiler_cache"]["remote"] is None and down["compiler_cache"]["compiled"] == 3
    assert all(r["same_binaries"] and r["ratio_to_cold"] > 0 and r["cpu_seconds"] > 0 for r in rows.values())


def test_bad_arguments_exit_2(tmp_path):
    (tmp_path / "kept").mkdir()
    done = subprocess.run([sys.executable, str(SCRIPT), "--keep", str(tmp_path / "kept")], capture_output=True, text=True)
    assert done.returncode == 2 and "already exists" in done.stderr
