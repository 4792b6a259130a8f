"""vendor fetch / status / pack on synthetic upstream trees."""

from __future__ import annotations

import tarfile
import subprocess

import pytest

from conftest import Proj, git_tree_id, make_upstream, write_pin
from polyforge import vendor
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed
from polyforge.hashing import sha256_file


def test_fetch_dir_source_yields_pinned_tree(proj: Proj):
    result = vendor.fetch(proj.chain())
    assert result.tree == proj.upstream.tree
    assert proj.read("README.md").startswith("# tiny upstream")
    # upstream's own .gitignore ignores bench.log: it must still be part of the baseline
    assert (proj.tree / "bench.log").exists()
    assert proj.chain().tree.baseline_tree() == proj.upstream.tree
    assert (proj.tree / "scripts/tool.sh").stat().st_mode & 0o111


def test_fetch_twice_is_a_noop(proj: Proj):
    vendor.fetch(proj.chain())
    again = vendor.fetch(proj.chain())
    assert again.already and again.tree == proj.upstream.tree


def test_fetch_mismatch_names_both_ids(proj: Proj, tmp_path):
    (proj.upstream.path / "README.md").write_text("tampered\n")
    got = git_tree_id(proj.upstream.path)
    with pytest.raises(VerificationFailed) as info:
        vendor.fetch(proj.chain())
    assert got in info.value.message and proj.upstream.tree in info.value.message
    assert not proj.tree.exists()
    assert not list((proj.root / "vendor").glob(".incoming-*")), "no half-extracted folder left behind"


def test_sdist_gitlink_file_is_dropped(proj: Proj):
    (proj.upstream.path / ".git").write_text("gitdir: ../../.git/modules/vendor/llama.cpp\n")
    result = vendor.fetch(proj.chain())
    assert result.tree == proj.upstream.tree
    assert (proj.tree / ".git").is_dir()


def _tar(folder, out, prefix="pkg-1.0/vendor/llama.cpp"):
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname=prefix)
    return out


def test_archive_source_with_pinned_sha(tmp_path, upstream, cache, monkeypatch):
    archive = _tar(upstream.path, tmp_path / "up.tar.gz")
    root = tmp_path / "p"
    write_pin(root, upstream, [{"name": "mirror", "kind": "archive", "location": "${MIRROR}",
                                "sha256": sha256_file(archive), "subdir": "pkg-1.0/vendor/llama.cpp"}])
    monkeypatch.chdir(root)
    monkeypatch.setenv("MIRROR", str(archive))
    result = vendor.fetch(Proj(root, upstream).chain())
    assert result.source == "mirror" and result.tree == upstream.tree


def test_archive_sha_mismatch(tmp_path, upstream, cache, monkeypatch):
    archive = _tar(upstream.path, tmp_path / "up.tar.gz")
    root = tmp_path / "p"
    write_pin(root, upstream, [{"name": "mirror", "kind": "archive", "location": str(archive),
                                "sha256": "0" * 64, "subdir": "pkg-1.0/vendor/llama.cpp"}])
    monkeypatch.chdir(root)
    with pytest.raises(VerificationFailed, match="sha256"):
        vendor.fetch(Proj(root, upstream).chain())


def test_truncated_archive_is_bad_input(tmp_path, upstream, cache, monkeypatch):
    archive = _tar(upstream.path, tmp_path / "up.tar.gz")
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    root = tmp_path / "p"
    write_pin(root, upstream)
    monkeypatch.chdir(root)
    with pytest.raises(BadInput, match="truncated or corrupt"):
        vendor.fetch(Proj(root, upstream).chain(), source=str(archive))


def test_unset_mirror_variable_falls_through_to_next_source(tmp_path, upstream, cache, monkeypatch):
    root = tmp_path / "p"
    write_pin(root, upstream, [
        {"name": "mirror", "kind": "archive", "location": "${UNSET_MIRROR_VAR}", "sha256": "0" * 64},
        {"name": "local", "kind": "dir", "location": str(upstream.path)},
    ])
    monkeypatch.chdir(root)
    monkeypatch.delenv("UNSET_MIRROR_VAR", raising=False)
    result = vendor.fetch(Proj(root, upstream).chain())
    assert result.source == "local"
    assert any("mirror" in s for s in result.skipped)


def test_git_source_from_local_repository(tmp_path, upstream, cache, monkeypatch):
    repo = tmp_path / "upstream-git"
    subprocess.run(["cp", "-a", str(upstream.path), str(repo)], check=True)
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A", "-f"], ["git", "commit", "-qm", "up"]):
        subprocess.run(cmd, cwd=repo, check=True, env=env)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, env=env).stdout.strip()
    subprocess.run(["git", "config", "uploadpack.allowAnySHA1InWant", "true"], cwd=repo, check=True, env=env)
    root = tmp_path / "p"
    write_pin(root, upstream, [{"name": "git", "kind": "git", "location": f"file://{repo}"}])
    pin_file = root / "vendor" / "pin.yaml"
    pin_file.write_text(pin_file.read_text().replace("1" * 40, commit))
    monkeypatch.chdir(root)
    result = vendor.fetch(Proj(root, upstream).chain())
    assert result.source == "git" and result.tree == upstream.tree


def test_unreachable_sources_are_an_environment_error(tmp_path, upstream, cache, monkeypatch):
    root = tmp_path / "p"
    write_pin(root, upstream, [{"name": "git", "kind": "git", "location": f"file://{tmp_path}/nope"}])
    monkeypatch.chdir(root)
    with pytest.raises(EnvironmentProblem, match="no source could be fetched"):
        vendor.fetch(Proj(root, upstream).chain())


def test_force_moves_an_edited_tree_to_backups(fetched: Proj):
    fetched.write("src/llama.cpp", "my precious edit\n")
    result = vendor.fetch(fetched.chain(), force=True)
    assert result.backup is not None
    from pathlib import Path
    assert (Path(result.backup) / "src/llama.cpp").read_text() == "my precious edit\n"
    assert fetched.read("src/llama.cpp") != "my precious edit\n"


def test_baseline_cache_serves_the_second_fetch(fetched: Proj):
    (fetched.upstream.path / "README.md").write_text("the source changed, the cache did not\n")
    result = vendor.fetch(fetched.chain(), force=True)
    assert result.source == "cache" and result.tree == fetched.upstream.tree


def test_pack_round_trip_is_pruned_and_reproducible(fetched: Proj, tmp_path):
    chain = fetched.chain()
    first = vendor.pack(chain, tmp_path / "a.tar.xz")
    second = vendor.pack(chain, tmp_path / "b.tar.xz")
    assert first["sha256"] == second["sha256"], "same tree, same bytes"
    assert first["tree"] == fetched.upstream.pack_tree
    with tarfile.open(tmp_path / "a.tar.xz") as tar:
        names = tar.getnames()
    assert not any("/docs/" in n for n in names)
    # a fresh project vendors from the pruned pack and knows it is pruned
    root = tmp_path / "other"
    write_pin(root, fetched.upstream)
    other = Proj(root, fetched.upstream)
    result = vendor.fetch(other.chain(), source=str(tmp_path / "a.tar.xz"))
    assert result.pruned and result.tree == fetched.upstream.pack_tree
    assert vendor.status(other.chain())["baseline_ok"]


def test_pack_rejects_other_suffix(fetched: Proj, tmp_path):
    with pytest.raises(BadInput, match=".tar.xz"):
        vendor.pack(fetched.chain(), tmp_path / "a.zip")


def test_patched_pack_is_recognised_and_its_chain_rebuilt(fetched: Proj, tmp_path):
    from conftest import capture
    capture(fetched, "0001-a", {"src/llama.h": "patched\n", "src/new.c": "new\n"})
    capture(fetched, "0002-b", {"README.md": "patched too\n"})
    info = vendor.pack(fetched.chain(), tmp_path / "patched.tar.xz", patched=True)
    root = tmp_path / "other"
    write_pin(root, fetched.upstream)
    import shutil
    shutil.copytree(fetched.patches, root / "patches")
    other = Proj(root, fetched.upstream)
    result = vendor.fetch(other.chain(), source=info["path"])
    assert result.pruned
    chain = other.chain()
    assert [a.name for a in chain.tree.applied()] == ["0001-a.patch", "0002-b.patch"]
    assert chain.tree.baseline_tree() == fetched.upstream.pack_tree
    from polyforge import verify
    assert verify.verify(chain).ok
    chain.unapply()
    assert chain.tree.snapshot() == fetched.upstream.pack_tree
