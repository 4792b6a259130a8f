"""Where a polyforge project keeps things: one object, found from the working directory."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput

PIN_FILE = "vendor/pin.yaml"


@dataclass(frozen=True)
class Project:
    root: Path

    @property
    def pin_file(self) -> Path:
        return self.root / PIN_FILE

    @property
    def vendor_dir(self) -> Path:
        return self.root / "vendor"

    @property
    def tree_dir(self) -> Path:
        """The vendored llama.cpp tree, its own git repository."""
        return self.vendor_dir / "llama.cpp"

    @property
    def backups_dir(self) -> Path:
        return self.vendor_dir / "backups"

    @property
    def lock_path(self) -> Path:
        """Serialises every command that reads or changes the vendored tree."""
        return self.vendor_dir / ".lock"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def chain_lock_file(self) -> Path:
        return self.patches_dir / "chain.lock"

    @property
    def build_root(self) -> Path:
        return self.root / "build"

    @property
    def gates_dir(self) -> Path:
        return self.root / "gates"

    @property
    def scripts_dir(self) -> Path:
        return self.root / "scripts"


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
