"""patches/chain.lock: the baseline tree id and, per patch, its sha256 and the tree after it.

`pack_base_tree` is the pruned baseline this chain needs: the baseline less the pin's
pack.prune folders, except the files any patch of the chain touches (so the chain applies on
it); each `pack_tree` is the tree applying the chain on it reaches. A pruned vendored tree
(from `vendor pack`) is verified against these as strictly as a full one against `tree`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from polyforge.errors import BadInput
from polyforge.textfile import read_text, write_text_atomic

VERSION = 1
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _field(raw: dict, key: str, pattern: re.Pattern | None, where: str, optional: bool = False):
    """One lock field, type-checked: a malformed lock is one BadInput line, never a traceback."""
    if key not in raw or (optional and raw[key] is None):
        if optional:
            return None
        raise KeyError(key)
    value = raw[key]
    if not isinstance(value, str) or (pattern is not None and not pattern.match(value)):
        raise BadInput(f"{where}: '{key}' is not {'a hex digest' if pattern else 'a string'}: {value!r}")
    return value


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
        write_text_atomic(path, self.render())

    @staticmethod
    def read(path: Path) -> "ChainLock | None":
        try:
            text = read_text(path)
        except FileNotFoundError:
            return None
        try:
            raw = json.loads(text)
        except RecursionError:
            raise BadInput(f"{path}: not valid JSON (nested too deeply)") from None
        except ValueError as exc:
            raise BadInput(f"{path}: not valid JSON ({exc})") from None
        try:
            if raw.get("version") != VERSION:
                raise BadInput(f"{path}: unsupported lock version {raw.get('version')!r}")
            if not isinstance(raw["patches"], list) or not all(isinstance(e, dict) for e in raw["patches"]):
                raise BadInput(f"{path}: 'patches' must be a list of objects")
            where = str(path)
            return ChainLock(
                base_tree=_field(raw, "base_tree", _HEX40, where),
                pack_base_tree=_field(raw, "pack_base_tree", _HEX40, where, optional=True),
                patches=tuple(LockEntry(name=_field(e, "name", None, where), sha256=_field(e, "sha256", _HEX64, where),
                                        tree=_field(e, "tree", _HEX40, where),
                                        pack_tree=_field(e, "pack_tree", _HEX40, where, optional=True))
                              for e in raw["patches"]),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise BadInput(f"{path}: malformed lock (missing {exc})" if isinstance(exc, KeyError)
                           else f"{path}: malformed lock ({exc})") from None
