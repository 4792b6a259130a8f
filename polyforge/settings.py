"""Validated settings: the upstream pin (vendor/pin.yaml). YAML in, frozen dataclasses out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import schema
from .errors import BadInput
from .source import SourceKind, source_from_pin


@dataclass(frozen=True)
class Pin:
    """The upstream llama.cpp a project patches; every source must yield `tree`."""

    project: str
    release: str
    commit: str
    tree: str
    pack_prune: tuple[str, ...]
    pack_tree: str | None  # tree id of the baseline less `pack_prune`, all of it (a chain may keep files: chain.lock)
    sources: tuple[SourceKind, ...] = field(default_factory=tuple)  # polyforge.source: one class per kind

    @staticmethod
    def load(path: Path) -> "Pin":
        where = str(path)
        try:
            raw = schema.mapping(schema.load_yaml(path), where)
        except FileNotFoundError:
            raise BadInput(f"pin file missing: {path}") from None
        upstream = schema.need(raw, "upstream", dict, where)
        pack = schema.optional(raw, "pack", dict, where, {})
        sources = schema.need(raw, "sources", list, where)
        if not sources:
            raise BadInput(f"{where}: 'sources' is empty")
        commit = schema.hex_digest(schema.need(upstream, "commit", str, where, section="upstream"), 40, where,
                                   "upstream.commit")
        parsed = tuple(source_from_pin(s, f"{where}: source", commit) for s in sources)
        names = [s.name for s in parsed]
        if len(set(names)) != len(names):
            raise BadInput(f"{where}: source names repeat: {names}")
        pack_tree = pack.get("tree")
        if pack_tree is not None:
            schema.hex_digest(pack_tree, 40, where, "pack.tree")
        prune = schema.str_list(pack, "prune", where, section="pack")
        if not all(p and "/" not in p.strip("/") for p in prune):
            raise BadInput(f"{where}: 'pack.prune' must be a list of top-level folder names")
        return Pin(
            project=schema.optional(upstream, "project", str, where, "llama.cpp", section="upstream"),
            release=schema.need(upstream, "release", str, where, section="upstream"),
            commit=commit,
            tree=schema.hex_digest(schema.need(upstream, "tree", str, where, section="upstream"), 40, where,
                                   "upstream.tree"),
            pack_prune=tuple(p.strip("/") for p in prune),
            pack_tree=pack_tree,
            sources=parsed,
        )
