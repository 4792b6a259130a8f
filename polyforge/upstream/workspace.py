"""A project's pin and vendored tree, and the project lock over them: what vendoring works on.

The patch chain builds on this (polyforge.chain.engine.Chain is a Workspace with the chain's
verbs). Vendoring needs a few answers only the chain has: which pruned baseline it needs, how
to recognise a tree packed with part of the chain applied, and what a pruned pack of it must
keep. They are the methods below marked as such; here they answer for a project with no
chain, and Chain overrides them. upstream/ stays below chain/ that way: it names the
questions and never imports the answers.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from polyforge.errors import BadInput
from polyforge.filelock import FileLock
from polyforge.project import Project
from polyforge.upstream.pin import Pin
from polyforge.upstream.vendored_tree import VendoredTree


class DirtyTree(BadInput):
    """The live tree has edits the command would overwrite."""


class Workspace:
    """A project, its pin and its vendored tree."""

    def __init__(self, project: Project):
        self.project = project
        self.pin = Pin.load(project.pin_file)
        self.tree = VendoredTree(project.tree_dir)

    def require_no_rebase(self) -> None:
        """While a rebase is in progress (vendor/rebase/) only the rebase itself runs: the pin,
        patches/ and the vendored tree are half moved."""
        if self.project.rebase_dir.exists():
            raise BadInput("a rebase is in progress (vendor/rebase/)",
                           hint="finish it first: polyforge rebase --continue, --skip or --abort "
                                "(polyforge status says what it needs)")

    @contextmanager
    def shared(self) -> Iterator[FileLock]:
        """Hold the project lock shared, for a command that only reads (status): no writer moves
        the tree meanwhile, and a writer waits for readers rather than failing. A shared lock
        rather than none, because a reader must not answer from a half-moved tree; readers
        still run side by side, as snapshot takes no git lock. Yields the lock (its dead_holder)."""
        with FileLock(self.project.lock_path, "vendored tree", shared=True) as lock:
            yield lock

    @property
    def pruned(self) -> bool:
        return bool(self.tree.state().get("pruned"))

    def expected_base(self) -> str:
        if self.pruned:
            pack_base = self.pack_base()
            if not pack_base:
                raise BadInput("the vendored tree is pruned but neither chain.lock nor the pin records a pruned baseline")
            return pack_base
        return self.pin.tree

    def live_changes(self) -> list[tuple[str, str]]:
        """(status, path) of live edits beyond the applied chain."""
        return self.tree.git.diff_names(self.tree.head_tree(), self.tree.snapshot())

    def require_clean(self, what: str) -> None:
        changes = self.live_changes()
        if changes:
            files = ", ".join(p for _, p in changes[:5]) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
            raise DirtyTree(f"the vendored tree has live edits that {what} would overwrite: {files}",
                            hint="capture them (polyforge capture NNNN-slug), refresh the top patch, or move them away")

    # -- what vendoring asks of the chain (Chain overrides these) -----------------------------
    def pack_base(self) -> str | None:
        """The pruned baseline a pruned vendored tree must be: with no chain, the pin's pack.tree."""
        return self.pin.pack_tree

    def adopt_patched(self, fresh: VendoredTree, got: str, label: str) -> bool | None:
        """Make `fresh`, whose tree `got` is the baseline with part of the chain applied, a vendored
        repository with that part as commits; returns whether it is pruned, or None if `got` is
        no such tree. With no chain, no tree is."""
        return None

    def pack_expectation(self, patched: bool) -> tuple[frozenset[str], str | None]:
        """For a pruned pack: the files inside the pruned folders to keep, and the tree the pack
        must be (None: unknown). With no chain: nothing kept, and the pin's pack.tree."""
        return frozenset(), self.pack_base()
