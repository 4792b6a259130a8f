"""patches/chain.lock: the baseline tree id and, per patch, its sha256 and the tree after it.

`pack_tree` ids are the same trees less the pin's pack.prune folders, so a pruned vendored
tree (from `vendor pack --prune`) is verified as strictly as a full one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import BadInput

VERSION = 1


@dataclass(frozen=True)
class LockEntry:
    name: str
    sha256: str
    tree: str
    pack_tree: str | None = None


@dataclass(frozen=True)
class ChainLock:
    base_tree: str
    pack_base_tree: str | None = None
    patches: tuple[LockEntry, ...] = field(default_factory=tuple)

    def entry(self, name: str) -> LockEntry | None:
        return next((e for e in self.patches if e.name == name), None)

    def render(self) -> str:
        data = {"version": VERSION, "base_tree": self.base_tree, "pack_base_tree": self.pack_base_tree,
                "patches": [asdict(e) for e in self.patches]}
        return json.dumps(data, indent=2) + "\n"

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".lock.tmp")
        tmp.write_text(self.render())
        tmp.replace(path)

    @staticmethod
    def read(path: Path) -> "ChainLock | None":
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise BadInput(f"{path}: not valid JSON ({exc})") from None
        try:
            if raw.get("version") != VERSION:
                raise BadInput(f"{path}: unsupported lock version {raw.get('version')!r}")
            return ChainLock(
                base_tree=raw["base_tree"], pack_base_tree=raw.get("pack_base_tree"),
                patches=tuple(LockEntry(**e) for e in raw["patches"]),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise BadInput(f"{path}: malformed lock ({exc})") from None
