"""Validated settings: the upstream pin (vendor/pin.yaml). YAML in, frozen dataclasses out."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import BadInput
from .textfile import read_text

SOURCE_KINDS = ("pypi-sdist", "git", "archive", "dir")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _need(mapping: dict, key: str, where: str, kind: type = str) -> Any:
    if key not in mapping:
        raise BadInput(f"{where}: missing '{key}'")
    value = mapping[key]
    if not isinstance(value, kind):
        raise BadInput(f"{where}: '{key}' must be a {kind.__name__}")
    return value


def _optional_str(mapping: dict, key: str, where: str, default: str | None = None) -> str | None:
    value = mapping.get(key, default)
    if value is not None and not isinstance(value, str):
        raise BadInput(f"{where}: '{key}' must be a str, not {type(value).__name__}")
    return value


def _hex(value: Any, pattern: re.Pattern, what: str, where: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise BadInput(f"{where}: '{what}' is not a lowercase hex digest: {value!r}")
    return value


@dataclass(frozen=True)
class Source:
    """One place the baseline can come from; `location` may reference ${ENV} variables."""

    name: str
    kind: str
    location: str | None = None  # url or path (git, archive, dir)
    sha256: str | None = None  # pypi-sdist and archive
    subdir: str | None = None  # folder inside an archive that holds the tree
    package: str | None = None  # pypi-sdist
    version: str | None = None  # pypi-sdist
    filename: str | None = None  # pypi-sdist
    index: str = "https://pypi.org/simple"

    def resolved_location(self) -> str | None:
        """The location with ${VAR} expanded; None when it names an unset variable."""
        if self.location is None:
            return None
        missing = [v for v in re.findall(r"\$\{(\w+)\}", self.location) if not os.environ.get(v)]
        if missing:
            return None
        return os.path.expandvars(self.location)

    @staticmethod
    def parse(raw: Any, where: str) -> "Source":
        if not isinstance(raw, dict):
            raise BadInput(f"{where}: a source must be a mapping")
        name = _need(raw, "name", where)
        kind = _need(raw, "kind", where)
        where = f"{where} '{name}'"
        if kind not in SOURCE_KINDS:
            raise BadInput(f"{where}: unknown kind '{kind}' (one of {', '.join(SOURCE_KINDS)})")
        sha = raw.get("sha256")
        if sha is not None:
            _hex(str(sha), _HEX64, "sha256", where)
        if kind == "pypi-sdist":
            for key in ("package", "version", "filename", "sha256"):
                _need(raw, key, where, str)
        elif kind == "archive":
            _need(raw, "sha256", where)
            _need(raw, "location", where)
        else:
            _need(raw, "location", where)
        return Source(
            name=name, kind=kind, location=_optional_str(raw, "location", where), sha256=sha,
            subdir=_optional_str(raw, "subdir", where), package=_optional_str(raw, "package", where),
            version=str(raw["version"]) if "version" in raw else None,
            filename=_optional_str(raw, "filename", where),
            index=_optional_str(raw, "index", where, "https://pypi.org/simple") or "https://pypi.org/simple",
        )


@dataclass(frozen=True)
class Pin:
    """The upstream llama.cpp a project patches; every source must yield `tree`."""

    project: str
    release: str
    commit: str
    tree: str
    pack_prune: tuple[str, ...]
    pack_tree: str | None  # tree id of the baseline less `pack_prune`, all of it (a chain may keep files: chain.lock)
    sources: tuple[Source, ...] = field(default_factory=tuple)

    def source(self, name: str) -> Source:
        for src in self.sources:
            if src.name == name:
                return src
        names = ", ".join(s.name for s in self.sources)
        raise BadInput(f"no source named '{name}' in the pin (sources: {names})")

    @staticmethod
    def load(path: Path) -> "Pin":
        try:
            raw = yaml.safe_load(read_text(path))
        except FileNotFoundError:
            raise BadInput(f"pin file missing: {path}") from None
        except yaml.YAMLError as exc:
            raise BadInput(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        except RecursionError:
            raise BadInput(f"{path}: not valid YAML (nested too deeply)") from None
        where = str(path)
        if not isinstance(raw, dict):
            raise BadInput(f"{where}: must be a mapping")
        upstream = _need(raw, "upstream", where, dict)
        pack = raw.get("pack") or {}
        if not isinstance(pack, dict):
            raise BadInput(f"{where}: 'pack' must be a mapping")
        sources = _need(raw, "sources", where, list)
        if not sources:
            raise BadInput(f"{where}: 'sources' is empty")
        parsed = tuple(Source.parse(s, f"{where}: source") for s in sources)
        names = [s.name for s in parsed]
        if len(set(names)) != len(names):
            raise BadInput(f"{where}: source names repeat: {names}")
        pack_tree = pack.get("tree")
        if pack_tree is not None:
            _hex(pack_tree, _HEX40, "pack.tree", where)
        prune = pack.get("prune") or []
        if not isinstance(prune, list) or not all(isinstance(p, str) and p and "/" not in p.strip("/") for p in prune):
            raise BadInput(f"{where}: 'pack.prune' must be a list of top-level folder names")
        return Pin(
            project=_optional_str(upstream, "project", where, "llama.cpp") or "llama.cpp",
            release=str(_need(upstream, "release", where)),
            commit=_hex(_need(upstream, "commit", where), _HEX40, "commit", where),
            tree=_hex(_need(upstream, "tree", where), _HEX40, "tree", where),
            pack_prune=tuple(p.strip("/") for p in prune),
            pack_tree=pack_tree,
            sources=parsed,
        )
