"""Integration on the real pinned llama.cpp (fetched once per machine into the user cache)
with the test-only chain in tests/data/real-chain (captured with polyforge capture)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, git_tree_id, run_cli

pytestmark = pytest.mark.slow
REAL_CHAIN = ROOT / "tests" / "data" / "real-chain"
# the ids follow vendor/pin.yaml: a pin move (polyforge rebase) needs no edit here, and a pin
# whose ids are wrong fails below against plain git's own count
PIN = yaml.safe_load((ROOT / "vendor" / "pin.yaml").read_text())


def _project(base: Path, with_chain: bool = True) -> Path:
    root = base / "real"
    (root / "vendor").mkdir(parents=True)
    shutil.copy(ROOT / "vendor" / "pin.yaml", root / "vendor" / "pin.yaml")
    (root / "patches").mkdir()
    if with_chain:
        for path in REAL_CHAIN.iterdir():
            shutil.copy(path, root / "patches" / path.name)
    return root


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    root = _project(tmp_path_factory.mktemp("real"))
    done = run_cli("vendor", "fetch", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["tree"] == PIN["upstream"]["tree"]
    tree = root / "vendor/llama.cpp"
    copy = root / "plain-copy"
    shutil.copytree(tree, copy, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    assert git_tree_id(copy) == PIN["upstream"]["tree"], "every file of the tree, the sdist's gitlink dropped"
    shutil.rmtree(copy)
    return root


def test_lock_is_reproducible_across_machines(real: Path):
    committed = json.loads((REAL_CHAIN / "chain.lock").read_text())
    done = run_cli("lock", cwd=real)
    assert done.returncode == 0, done.stderr
    assert json.loads((real / "patches" / "chain.lock").read_text()) == committed


def test_apply_verify_unapply_on_the_real_tree(real: Path):
    done = run_cli("apply", "--json", cwd=real)
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in json.loads(done.stdout)["patches"]] == ["applied"] * 3
    tree = real / "vendor/llama.cpp"
    assert (tree / "tools/polyforge-hello/run.sh").stat().st_mode & 0o111
    assert not (tree / "tools/mtmd/README.md").exists()
    done = run_cli("verify-patches", "--json", cwd=real)
    proof = json.loads(done.stdout)
    assert done.returncode == 0 and proof["ok"], proof
    assert [p["tree"] for p in proof["patches"]] == [e["tree"] for e in json.loads((REAL_CHAIN / "chain.lock").read_text())["patches"]]
    done = run_cli("unapply", cwd=real)
    assert done.returncode == 0, done.stderr
    status = json.loads(run_cli("status", "--json", cwd=real).stdout)
    assert status["applied"] == [] and status["live_edits"] == [] and status["baseline_ok"]
    assert (tree / "tools/mtmd/README.md").exists()
    assert run_cli("apply", cwd=real).returncode == 0


def test_pruned_pack_carries_the_chain(real: Path, tmp_path):
    pack = tmp_path / "llama.tar.xz"
    done = run_cli("vendor", "pack", str(pack), "--json", cwd=real)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["tree"] == PIN["pack"]["tree"] and info["bytes"] < 12_000_000
    other = _project(tmp_path / "other")
    done = run_cli("vendor", "fetch", "--source", str(pack), "--json", cwd=other)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pruned"] is True
    assert run_cli("apply", cwd=other).returncode == 0
    done = run_cli("verify-patches", "--json", cwd=other)
    assert done.returncode == 0, done.stdout


def test_pruned_packs_carry_the_real_chain(tmp_path):
    """The project's own chain (its batch-invariance patch edits docs/build.md, inside a pruned folder) travels in a
    pruned pack and a patched pruned pack, and proves there."""
    def project(name: str, patches: Path) -> Path:
        root = tmp_path / name
        (root / "vendor").mkdir(parents=True)
        shutil.copy(ROOT / "vendor" / "pin.yaml", root / "vendor" / "pin.yaml")
        shutil.copytree(patches, root / "patches")
        return root

    full = project("full", ROOT / "patches")
    assert run_cli("vendor", "fetch", cwd=full).returncode == 0
    done = run_cli("lock", cwd=full)  # the lock as this code computes it; full tree ids are unchanged
    assert done.returncode == 0, done.stderr
    committed = json.loads((ROOT / "patches" / "chain.lock").read_text())
    relocked = json.loads((full / "patches" / "chain.lock").read_text())
    assert [(e["name"], e["sha256"], e["tree"]) for e in relocked["patches"]] == \
        [(e["name"], e["sha256"], e["tree"]) for e in committed["patches"]]
    pack = tmp_path / "llama.tar.xz"
    done = run_cli("vendor", "pack", str(pack), "--json", cwd=full)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tree"] == relocked["pack_base_tree"]

    pruned = project("pruned", full / "patches")
    done = run_cli("vendor", "fetch", "--source", str(pack), "--json", cwd=pruned)
    assert done.returncode == 0 and json.loads(done.stdout)["pruned"] is True, done.stderr
    done = run_cli("apply", cwd=pruned)
    assert done.returncode == 0, done.stderr
    assert (pruned / "vendor/llama.cpp/docs/build.md").is_file()
    done = run_cli("verify-patches", "--json", cwd=pruned)
    assert done.returncode == 0, done.stdout

    patched = tmp_path / "patched.tar.xz"
    done = run_cli("vendor", "pack", str(patched), "--patched", cwd=pruned)
    assert done.returncode == 0, done.stderr
    again = project("again", full / "patches")
    done = run_cli("vendor", "fetch", "--source", str(patched), cwd=again)
    assert done.returncode == 0, done.stderr
    done = run_cli("verify-patches", "--json", cwd=again)
    assert done.returncode == 0, done.stdout
    assert [p["tree"] for p in json.loads(done.stdout)["patches"]] == [e["pack_tree"] for e in relocked["patches"]]


def test_rebase_dry_run_onto_the_previous_pin(real: Path):
    """The report on a real second upstream: the test chain onto the pin before this one (from
    vendor/pin-history.yaml, fetched from PyPI), and nothing moves."""
    history = yaml.safe_load((ROOT / "vendor" / "pin-history.yaml").read_text())["pins"]
    onto = history[-1]["rebase_back"].split("--onto ", 1)[1].split()[0]
    before = json.loads(run_cli("status", "--json", cwd=real).stdout)
    done = run_cli("rebase", "--onto", onto, "--dry-run", "--json", cwd=real)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["dry_run"] and report["clean"] and report["new_tree"] == history[-1]["tree"]
    assert [p["name"] for p in report["patches"]] == sorted(p.name for p in REAL_CHAIN.glob("*.patch"))
    assert {p["status"] for p in report["patches"]} <= {"exact", "offsets", "three-way"}
    after = json.loads(run_cli("status", "--json", cwd=real).stdout)
    assert after == before
