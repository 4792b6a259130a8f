"""The one rule of which files count toward a tree's identity: its three forms agree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from polyforge.git import Git
from polyforge.tree_identity import counted_files, excluded_by, excluded_entry, git_exclude_pathspecs

XCFRAMEWORK = b"#!/bin/bash\n# upstream's own script: content, although it is named build-*\n"


def _tree(root: Path, elsewhere: Path) -> None:
    """Build outputs of every shape beside content that resembles them."""
    elsewhere.mkdir()
    (elsewhere / "CMakeCache.txt").write_text("cache\n")
    files = {
        "README.md": "readme\n",
        "build/CMakeCache.txt": "cache\n",
        "build-x/bin/llama-cli": "binary\n",
        "src/build/x.c": "content: only top-level build folders are outputs\n",
        "buildx/y.c": "content\n",
        "src/__pycache__/m.pyc": "pyc\n",
        "gguf-py/gguf/__pycache__/a.pyc": "pyc\n",
        "__pycache__/top.pyc": "pyc\n",
        "src/__pycache__.txt": "content\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "build-xcframework.sh").write_bytes(XCFRAMEWORK)
    (root / "build-y").symlink_to(elsewhere)  # a build folder kept elsewhere
    (root / "build-gone").symlink_to(root / "no-such-folder")  # its folder since deleted
    (root / "docs").mkdir()
    (root / "docs" / "readme-link").symlink_to("../README.md")  # a symlink that is content
    (root / "ggml").mkdir()
    (root / "ggml" / "__pycache__").symlink_to(elsewhere)


def _git_listing(root: Path) -> dict[str, str]:
    """path -> blob of what `git add` takes with the pathspecs, as VendoredTree.snapshot does."""
    git = Git(root)
    git.run("init", "-q")
    git.run("add", "-A", "-f", "--", ".", *git_exclude_pathspecs(root))
    out = git.run("ls-files", "-s", "-z", strip=False)
    listing = {}
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        listing[path] = meta.split()[1]
    return listing


def _predicate_listing(root: Path) -> set[str]:
    """Every file and symlink under root (nothing pruned, .git included) the predicate keeps."""
    kept = set()
    for folder, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            rel = Path(folder, name).relative_to(root).as_posix()
            is_link = os.path.islink(os.path.join(folder, name))
            if excluded_by(rel) is None and (not is_link or excluded_entry(rel, True) is None):
                kept.add(rel)
    return kept


def test_predicate_walk_and_git_pathspecs_agree(tmp_path):
    root = tmp_path / "tree"
    root.mkdir()
    _tree(root, tmp_path / "elsewhere")
    by_git = _git_listing(root)  # also makes .git, which the other two must leave out
    assert any((root / ".git").iterdir())
    by_walk = set(counted_files(root))
    by_predicate = _predicate_listing(root)
    expected = {"README.md", "build-xcframework.sh", "src/build/x.c", "buildx/y.c", "src/__pycache__.txt",
                "docs/readme-link"}
    assert set(by_git) == by_walk == by_predicate == expected
    assert by_git["build-xcframework.sh"] == Git(root).run("hash-object", "build-xcframework.sh")


def test_files_through_a_build_symlink_are_excluded(tmp_path):
    # git never lists them (it does not follow the symlink); a patch naming one is refused
    assert excluded_by("build-y/CMakeCache.txt") == "build-*/"
    assert excluded_by("ggml/__pycache__/CMakeCache.txt") == "**/__pycache__/"


@pytest.mark.parametrize(("path", "pattern"), [
    ("build/x.c", "build/"), ("build-cuda/CMakeCache.txt", "build-*/"), ("__pycache__/m.pyc", "**/__pycache__/"),
    ("gguf-py/gguf/__pycache__/m.pyc", "**/__pycache__/"), ("src/__pycache__", "**/__pycache__/"),
    (".git/config", ".git/"), ("build", None), ("build-xcframework.sh", None), ("src/build/x.c", None),
    ("buildx/y.c", None), ("src/__pycache__.txt", None),
])
def test_excluded_by_names_the_pattern(path, pattern):
    assert excluded_by(path) == pattern


def test_a_top_level_build_entry_is_excluded_as_folder_or_symlink_only():
    assert excluded_entry("build-x", folder_or_link=True) == "build-*/"
    assert excluded_entry("build-x", folder_or_link=False) is None
    assert excluded_entry("src/build-x", folder_or_link=True) is None
