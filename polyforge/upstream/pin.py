"""The upstream pin (vendor/pin.yaml): YAML in, a validated frozen dataclass out; and the
writer `polyforge rebase` uses to move it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from polyforge import schema
from polyforge.errors import BadInput
from polyforge.upstream.source import SourceKind, source_from_pin


@dataclass(frozen=True)
class Pin:
    """The upstream llama.cpp a project patches; every source must yield `tree`."""

    project: str
    release: str
    commit: str | None  # None: the tree's upstream commit is not recorded (an sdist that omits it)
    tree: str
    pack_prune: tuple[str, ...]
    pack_tree: str | None  # tree id of the baseline less `pack_prune`, all of it (a chain may keep files: chain.lock)
    sources: tuple[SourceKind, ...] = field(default_factory=tuple)  # polyforge.upstream.source: one class per kind

    @staticmethod
    def load(path: Path) -> "Pin":
        where = str(path)
        try:
            raw = schema.mapping(schema.load_yaml(path), where)
        except FileNotFoundError:
            raise BadInput(f"pin file missing: {path}") from None
        # a misspelt key (`prnue:`) must not pass for an absent one
        schema.only(raw, ("upstream", "pack", "sources"), where)
        upstream = schema.need(raw, "upstream", dict, where)
        schema.only(upstream, ("project", "release", "commit", "tree"), where, section="upstream")
        pack = schema.optional(raw, "pack", dict, where, {})
        schema.only(pack, ("prune", "tree"), where, section="pack")
        sources = schema.need(raw, "sources", list, where)
        if not sources:
            raise BadInput(f"{where}: 'sources' is empty")
        commit = schema.optional(upstream, "commit", str, where, section="upstream")
        if commit is not None:
            schema.hex_digest(commit, 40, where, "upstream.commit")
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

    @property
    def label(self) -> str:
        return tree_label(self.release, self.commit)


def tree_label(release: str, commit: str | None) -> str:
    """How messages name a pinned tree: release and short commit."""
    return f"{release} ({commit[:12]})" if commit else release


def render_pin(*, project: str, release: str, commit: str | None, tree: str, pack_prune: tuple[str, ...],
               pack_tree: str | None, sources: list[dict]) -> str:
    """vendor/pin.yaml's text, with the comments that say what each part is."""
    upstream = {"project": project, "release": release, **({"commit": commit} if commit else {}), "tree": tree}
    lines = ["# The upstream llama.cpp this project patches. Every source below must yield the same tree:",
             "# `tree` is the git tree id of the vendored baseline over every file and mode (a submodule",
             "# gitlink file an sdist ships is packaging debris and is dropped)."]
    if not commit:
        lines.append("# No `commit`: the source does not record which upstream commit its tree is.")
    lines += [_yaml({"upstream": upstream}), ""]
    if pack_prune:
        lines += ["# `polyforge vendor pack` leaves these folders out (the build never reads them); `tree` is",
                  "# the baseline without them.",
                  "pack:", f"  prune: [{', '.join(pack_prune)}]"] + ([f"  tree: {pack_tree}"] if pack_tree else []) + [""]
    lines += ["# Tried in order; the first that yields the pinned tree wins.", _yaml({"sources": sources}), ""]
    return "\n".join(lines)


def _yaml(data: dict) -> str:
    # block style, keys in the order given; indented lists as in the hand-written pins
    return yaml.dump(data, Dumper=_IndentedDumper, sort_keys=False, default_flow_style=False, width=100).rstrip("\n")


class _IndentedDumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False):
        return super().increase_indent(flow, False)
