"""vendor fetch / status / pack on synthetic upstream trees."""

from __future__ import annotations

import tarfile
import subprocess

import pytest
from typer.testing import CliRunner

from conftest import Proj, git_tree_id, write_pin
from polyforge.cli import app
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed
from polyforge.filelock import FileLock
from polyforge.hashing import sha256_file
from polyforge.upstream import vendor


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


def test_pack_compresses_with_the_project_lock_released(fetched: Proj, tmp_path, monkeypatch):
    """A full pack compresses for minutes: a writer (build, apply) started meanwhile must get
    the lock at once, not fail on a busy tree (it did: `polyforge up` lost a gate to a pack)."""
    chain = fetched.chain()
    real_compress = vendor.lzma.compress
    seen = []

    def compress_and_try_the_lock(data, preset):
        with FileLock(chain.project.lock_path, "vendored tree"):  # exclusive, fails at once if held
            seen.append(len(data))
        return real_compress(data, preset=preset)

    monkeypatch.setattr(vendor.lzma, "compress", compress_and_try_the_lock)
    monkeypatch.chdir(fetched.root)
    # through the command, which is where the whole pack once ran under the exclusive lock
    result = CliRunner().invoke(app, ["vendor", "pack", str(tmp_path / "p.tar.xz"), "--json"])
    assert result.exit_code == 0, result.output
    assert seen and seen[0] > 0
    with tarfile.open(tmp_path / "p.tar.xz") as tar:
        assert tar.getnames()


def test_pack_rejects_other_suffix(fetched: Proj, tmp_path):
    with pytest.raises(BadInput, match=".tar.xz"):
        vendor.pack(fetched.chain(), tmp_path / "a.zip")


def test_pack_never_creates_folders_and_refuses_a_bad_output_path(fetched: Proj, tmp_path):
    """Like `tar -cf /missing/x`: a missing output folder is refused (exit 2), not created;
    a parent that is a file, or an output that is a folder, is one BadInput line too."""
    chain = fetched.chain()
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(BadInput, match="its folder .*missing/dir does not exist"):
        vendor.pack(chain, out / "missing" / "dir" / "x.tar.xz")
    assert not (out / "missing").exists(), "pack created the missing folder"
    (out / "a-file").write_text("a file\n")
    with pytest.raises(BadInput, match="cannot write .*: a parent is not a folder .*a-file"):
        vendor.pack(chain, out / "a-file" / "x.tar.xz")
    assert (out / "a-file").read_text() == "a file\n"
    (out / "dir.tar.xz").mkdir()
    with pytest.raises(BadInput, match="it is a folder"):
        vendor.pack(chain, out / "dir.tar.xz")
    assert sorted(p.name for p in out.iterdir()) == ["a-file", "dir.tar.xz"]


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
    from polyforge.chain import verify
    assert verify.verify(chain).ok
    chain.unapply()
    assert chain.tree.snapshot() == fetched.upstream.pack_tree


# -- pruned packs carry any chain, including one that edits a pruned folder --------
def _docs_chain(fetched: Proj) -> None:
    from conftest import capture
    capture(fetched, "0001-docs", {"docs/build.md": "How to build, patched.\n", "src/llama.h": "patched\n"})
    capture(fetched, "0002-more", {"src/llama.h": "patched again\n", "docs/added.md": "new doc\n"})


def _second_project(fetched: Proj, tmp_path) -> Proj:
    import shutil
    root = tmp_path / "second"
    write_pin(root, fetched.upstream)
    shutil.copytree(fetched.patches, root / "patches")
    return Proj(root, fetched.upstream)


def test_pruned_pack_keeps_the_files_the_chain_touches(fetched: Proj, tmp_path):
    _docs_chain(fetched)
    info = vendor.pack(fetched.chain(), tmp_path / "base.tar.xz")
    with tarfile.open(info["path"]) as tar:
        names = tar.getnames()
    assert "llama.cpp/docs/build.md" in names and "llama.cpp/docs/more/notes.md" not in names
    from polyforge.chain.lockfile import ChainLock
    assert info["tree"] == ChainLock.read(fetched.patches / "chain.lock").pack_base_tree
    other = _second_project(fetched, tmp_path)
    result = vendor.fetch(other.chain(), source=info["path"])
    assert result.pruned
    chain = other.chain()
    assert [r["status"] for r in chain.apply()] == ["applied", "applied"]
    assert other.read("docs/build.md") == "How to build, patched.\n"
    from polyforge.chain import verify
    proof = verify.verify(chain)
    assert proof.ok, proof.as_dict()
    assert vendor.status(chain)["baseline_ok"]


def test_patched_pruned_pack_with_a_chain_that_edits_a_pruned_folder(fetched: Proj, tmp_path):
    _docs_chain(fetched)
    info = vendor.pack(fetched.chain(), tmp_path / "patched.tar.xz", patched=True)
    other = _second_project(fetched, tmp_path)
    assert vendor.fetch(other.chain(), source=info["path"]).pruned
    chain = other.chain()
    assert [a.name for a in chain.tree.applied()] == ["0001-docs.patch", "0002-more.patch"]
    from polyforge.chain import verify
    assert verify.verify(chain).ok
    chain.unapply()
    from polyforge.chain.lockfile import ChainLock
    assert chain.tree.snapshot() == ChainLock.read(fetched.patches / "chain.lock").pack_base_tree
    assert other.read("docs/build.md") == "How to build.\n"


def test_lock_pack_trees_are_what_applying_on_the_pruned_baseline_reaches(fetched: Proj):
    from polyforge.chain.engine import run_chain
    from polyforge.git import prune_tree
    from polyforge.chain.lockfile import ChainLock
    _docs_chain(fetched)
    chain = fetched.chain()
    lock = ChainLock.read(fetched.patches / "chain.lock")
    git = chain.tree.git
    # the pruned baseline: docs/ less everything but the file the chain edits
    assert lock.pack_base_tree == prune_tree(git, fetched.upstream.tree, ("docs",), {"docs/build.md"})
    steps = run_chain(git, lock.pack_base_tree, chain.patches())
    assert [s.tree for s in steps] == [e.pack_tree for e in lock.patches]


def test_verify_on_the_full_tree_catches_stale_pack_trees(fetched: Proj):
    from polyforge.chain import verify
    from polyforge.chain.lockfile import ChainLock, LockEntry
    _docs_chain(fetched)
    path = fetched.patches / "chain.lock"
    lock = ChainLock.read(path)
    first = lock.patches[0]
    stale = (LockEntry(first.name, first.sha256, first.tree, "e" * 40),) + lock.patches[1:]
    ChainLock(lock.base_tree, lock.pack_base_tree, stale).write(path)
    proof = verify.verify(fetched.chain())
    assert not proof.ok
    assert any("0001-docs.patch" in p and "pack" in p for p in proof.problems), proof.problems


def test_a_pack_made_for_another_chain_is_refused_by_name(fetched: Proj, tmp_path):
    plain = vendor.pack(fetched.chain(), tmp_path / "plain.tar.xz")  # no chain yet: docs/ pruned whole
    _docs_chain(fetched)
    other = _second_project(fetched, tmp_path)
    with pytest.raises(VerificationFailed, match="another chain"):
        vendor.fetch(other.chain(), source=plain["path"])


def test_the_same_pin_and_chain_make_the_same_commits_however_the_tree_arrived(fetched: Proj, tmp_path):
    """A build reads the vendored repository (ggml and llama.cpp embed `git rev-parse --short HEAD`
    and the commit count): a tree fetched from its source and one the baseline cache served, with
    the same chain applied, stand on the same commits."""
    from conftest import capture
    capture(fetched, "0001-a", {"src/llama.h": "patched\n"})
    capture(fetched, "0002-b", {"README.md": "patched too\n"})
    other = _second_project(fetched, tmp_path)
    assert vendor.fetch(other.chain()).source == "cache"
    other.chain().apply()

    def commits(proj: Proj) -> list[str]:
        return subprocess.run(["git", "-C", str(proj.tree), "rev-list", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.split()
    assert len(commits(fetched)) == 3 and commits(other) == commits(fetched)
