"""Which files of a working tree count toward its identity (its git tree id): the one rule.

Every file and mode counts, except build outputs that live inside the tree (documented in
the README): a top-level build/ or build-*/, whether a folder or a symlink (to a folder
elsewhere, or dangling once that folder is gone), and every __pycache__ at any depth. A
top-level *file* named build-* is content: upstream has build-xcframework.sh. Git metadata
(.git) is never content either; git itself never adds it.

The rule is stated once, in `excluded_entry`; the snapshot (git pathspecs), a patch's paths
(a predicate on a relative path) and a walk of the live tree (the files that count) all
derive from it, so they cannot disagree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

# The build outputs as documented and reported (verify --json names them); git glob syntax.
EXCLUDED_PATHS = ("build/", "build-*/", "**/__pycache__/")
_GIT_DIR = ".git/"
# a glob, not a literal: __pycache__ may be at any depth; '**/' also matches the top level
_PYCACHE_SPECS = (":(exclude,glob)**/__pycache__", ":(exclude,glob)**/__pycache__/**")


def _build_name(name: str) -> bool:
    return name == "build" or name.startswith("build-")


def excluded_entry(rel: str, folder_or_link: bool) -> str | None:
    """The pattern under which the entry at `rel` (posix, relative to the tree root) leaves the
    identity, with everything below it; None if it counts. `folder_or_link`: the entry is a
    folder or a symlink, not a regular file. Only the entry itself is judged, not its parents."""
    name = rel.rsplit("/", 1)[-1]
    if name == ".git":
        return _GIT_DIR
    if name == "__pycache__":
        return EXCLUDED_PATHS[2]
    if "/" not in rel and folder_or_link and _build_name(name):
        return EXCLUDED_PATHS[0] if name == "build" else EXCLUDED_PATHS[1]
    return None


def excluded_by(path: str) -> str | None:
    """The pattern a regular file at `path` (posix, relative) falls under, through itself or
    any folder above it; None if it counts toward the identity."""
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        pattern = excluded_entry("/".join(parts[:depth]), folder_or_link=depth < len(parts))
        if pattern:
            return pattern
    return None


def counted_files(root: Path) -> Iterator[str]:
    """Every file under root that counts, as a posix path relative to root: os.walk with the
    excluded folders pruned. Symlinks are not followed; like git, a symlink (to a folder too)
    is listed as a file."""
    for folder, dirs, files in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        prefix = "" if rel_folder == "." else f"{rel_folder.replace(os.sep, '/')}/"
        # os.walk lists a symlink to a folder among dirs, without descending into it
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in links and not excluded_entry(prefix + d, True)]
        for name in [*links, *files]:
            # only a top-level build name needs the entry's type: no lstat for the others
            is_link = name in links or (not prefix and _build_name(name) and os.path.islink(os.path.join(folder, name)))
            if not excluded_entry(prefix + name, is_link):
                yield prefix + name


def git_exclude_pathspecs(root: Path) -> list[str]:
    """Pathspecs for `git add` that leave out what does not count. Top-level build entries are
    named one by one as literal pathspecs: git refuses a glob such as build/** when build is a
    symlink ("beyond a symbolic link"), and a literal name covers the symlink itself as well as
    a real folder. Git leaves .git out by itself."""
    names = []
    with os.scandir(root) as entries:
        for entry in entries:
            if excluded_entry(entry.name, entry.is_symlink() or entry.is_dir()) in EXCLUDED_PATHS[:2]:
                names.append(f":(exclude,literal){entry.name}")
    return [*sorted(names), *_PYCACHE_SPECS]
