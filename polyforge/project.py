"""Where a polyforge project keeps things: one object, found from the working directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import overload

from .errors import BadInput

PIN_FILE = "vendor/pin.yaml"


class _Below:
    """A path the project keeps at a fixed place below its root: `Project.tree_dir` is
    `project.root / "vendor/llama.cpp"`."""

    def __init__(self, relative: str, doc: str | None = None) -> None:
        self.relative = relative
        self.__doc__ = doc

    @overload
    def __get__(self, project: None, owner: type) -> _Below: ...
    @overload
    def __get__(self, project: Project, owner: type) -> Path: ...

    def __get__(self, project: Project | None, owner: type) -> Path | _Below:
        return self if project is None else project.root / self.relative


@dataclass(frozen=True)
class Project:
    root: Path

    pin_file = _Below(PIN_FILE)
    pin_history_file = _Below("vendor/pin-history.yaml", "The pins a rebase moved away from, newest last.")
    vendor_dir = _Below("vendor")
    tree_dir = _Below("vendor/llama.cpp", "The vendored llama.cpp tree, its own git repository.")
    backups_dir = _Below("vendor/backups")
    rebase_dir = _Below("vendor/rebase", "A rebase in progress: its journal and the previous pin, patches and tree.")
    rebase_begin_dir = _Below("vendor/.rebase-begin", "vendor/rebase/ being made, renamed into place whole.")
    rebase_done_dir = _Below("vendor/.rebase-done", "vendor/rebase/ renamed at the end of a rebase, then deleted.")
    transaction_dir = _Below("vendor/transaction", "fold/move/rename's journal and the bytes it would restore.")
    lock_path = _Below("vendor/.lock", "Serialises every command that reads or changes the vendored tree.")
    patches_dir = _Below("patches")
    chain_lock_file = _Below("patches/chain.lock")
    build_root = _Below("build")
    gates_dir = _Below("gates")


def find_project(start: Path | None = None) -> Project:
    """POLYFORGE_ROOT if set, else the nearest directory upwards holding vendor/pin.yaml."""
    env_root = os.environ.get("POLYFORGE_ROOT")
    if env_root:
        root = Path(env_root).resolve()
        if not (root / PIN_FILE).is_file():
            raise BadInput(f"POLYFORGE_ROOT={env_root} has no {PIN_FILE}")
        return Project(root)
    here = (start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / PIN_FILE).is_file():
            return Project(candidate)
    raise BadInput(f"not inside a polyforge project (no {PIN_FILE} here or above {here})")


def cache_dir() -> Path:
    """The download and source cache (XDG cache dir); POLYFORGE_CACHE overrides it."""
    override = os.environ.get("POLYFORGE_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "polyforge"
