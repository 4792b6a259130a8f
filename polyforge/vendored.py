"""The vendored llama.cpp tree: a git repository whose first commit is the pinned baseline
and whose later commits are the applied patches, one commit each, in chain order.

Its working tree is the "live tree". Its content id is a git tree id computed over every
file and mode, except the build outputs in EXCLUDED_PATHS, so two ids compare trees byte
for byte.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput
from .git import Git

BASELINE_TAG = "polyforge-baseline"
BRANCH = "refs/heads/main"

# Build outputs that live inside the tree but are never content (documented in the README).
EXCLUDED_PATHS = ("build/", "build-*/", "**/__pycache__/")
_EXCLUDE_SPECS = tuple(f":(exclude,glob){p}**" for p in EXCLUDED_PATHS)

_PATCH_TRAILER = "Polyforge-Patch: "
_SHA_TRAILER = "Polyforge-Patch-Sha256: "


@dataclass(frozen=True)
class AppliedPatch:
    name: str
    sha256: str
    commit: str
    tree: str


@dataclass(frozen=True)
class Journal:
    """Written before the live tree moves; its presence at start means a run was cut short."""

    op: str
    from_commit: str
    to_tree: str


class VendoredTree:
    def __init__(self, path: Path):
        self.path = path
        self.git = Git(path)

    # -- existence and layout --------------------------------------------------------
    def exists(self) -> bool:
        return (self.path / ".git").is_dir()

    @property
    def state_dir(self) -> Path:
        return self.path / ".git" / "polyforge"

    def require(self) -> None:
        if not self.exists():
            raise BadInput(f"no vendored tree at {self.path}", hint="run: polyforge vendor fetch")

    def state(self) -> dict:
        try:
            return json.loads((self.state_dir / "state.json").read_text())
        except FileNotFoundError:
            return {}

    def write_state(self, **values) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        merged = {**self.state(), **values}
        (self.state_dir / "state.json").write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")

    # -- creation --------------------------------------------------------------------
    @staticmethod
    def initialise(path: Path) -> "VendoredTree":
        """Turn a plain folder into the vendored repository; returns it (no commit yet)."""
        tree = VendoredTree(path)
        tree.git.run("init", "-q")
        for key, value in (("core.autocrlf", "false"), ("core.filemode", "true"), ("gc.auto", "0"),
                           ("core.compression", "1"), ("user.name", "polyforge"),
                           ("user.email", "polyforge@localhost")):
            tree.git.run("config", key, value)
        return tree

    def commit_baseline(self, message: str) -> str:
        tree = self.snapshot()
        commit = self.git.commit_tree(tree, message)
        self.git.run("update-ref", BRANCH, commit)
        self.git.run("symbolic-ref", "HEAD", BRANCH)
        self.git.run("tag", "-f", BASELINE_TAG, commit)
        self.sync_index()
        return tree

    # -- trees -----------------------------------------------------------------------
    def snapshot(self) -> str:
        """Tree id of the live tree: every file and mode, less EXCLUDED_PATHS."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        live_index = self.state_dir / "live.index"
        real_index = self.path / ".git" / "index"
        if not live_index.exists() and real_index.exists():
            shutil.copyfile(real_index, live_index)  # inherit the stat cache: no re-hashing
        scratch = self.git.with_index(live_index)
        scratch.run("add", "-A", "-f", "--", ".", *_EXCLUDE_SPECS)
        return scratch.write_tree()

    def sync_index(self) -> None:
        """Make the repository's own index match HEAD (stat info from the live index)."""
        live_index = self.state_dir / "live.index"
        head_tree = self.git.tree_of("HEAD")
        if live_index.exists() and self.git.with_index(live_index).write_tree() == head_tree:
            shutil.copyfile(live_index, self.path / ".git" / "index")
        else:
            self.git.run("read-tree", "-m", "HEAD")  # single-tree merge keeps matching stat info

    def baseline_commit(self) -> str:
        return self.git.rev_parse(f"refs/tags/{BASELINE_TAG}^{{commit}}")

    def baseline_tree(self) -> str:
        return self.git.tree_of(f"refs/tags/{BASELINE_TAG}")

    def head(self) -> str:
        return self.git.rev_parse("HEAD")

    def head_tree(self) -> str:
        return self.git.tree_of("HEAD")

    # -- the applied chain -------------------------------------------------------------
    def applied(self) -> list[AppliedPatch]:
        base = self.baseline_commit()
        out = self.git.run("log", "--reverse", "--format=%H %T%n%B%x00", f"{base}..HEAD")
        result = []
        for record in filter(None, (r.strip("\n") for r in out.split("\0"))):
            first, _, body = record.partition("\n")
            commit, tree = first.split()
            name = sha = ""
            for line in body.splitlines():
                if line.startswith(_PATCH_TRAILER):
                    name = line[len(_PATCH_TRAILER):].strip()
                elif line.startswith(_SHA_TRAILER):
                    sha = line[len(_SHA_TRAILER):].strip()
            if not name:
                raise BadInput(f"commit {commit[:12]} in {self.path} is not a polyforge patch commit",
                               hint="the vendored repository was changed by hand; re-fetch it")
            result.append(AppliedPatch(name, sha, commit, tree))
        return result

    def patch_commit(self, parent: str, tree: str, name: str, sha256: str) -> str:
        message = f"{name}\n\n{_PATCH_TRAILER}{name}\n{_SHA_TRAILER}{sha256}\n"
        return self.git.commit_tree(tree, message, parent)

    def move_live(self, from_commit: str, to_commit: str, op: str) -> None:
        """Move the live tree (clean at from_commit) to to_commit, recoverably."""
        to_tree = self.git.tree_of(to_commit)
        # re-check stat info first: entries written in the same second as their file are
        # "racily clean" in git's eyes and read-tree would refuse them as not up to date
        self.git.run("update-index", "-q", "--refresh", check=False)
        self.write_journal(Journal(op, from_commit, to_tree))
        self.git.run("read-tree", "-m", "-u", from_commit, to_commit)
        self.git.run("update-ref", BRANCH, to_commit)
        self.sync_index()
        self.clear_journal()

    # -- interruption ------------------------------------------------------------------
    @property
    def _journal_path(self) -> Path:
        return self.state_dir / "journal.json"

    def write_journal(self, journal: Journal) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self._journal_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(journal.__dict__))
        tmp.replace(self._journal_path)

    def clear_journal(self) -> None:
        self._journal_path.unlink(missing_ok=True)

    def pending_journal(self) -> Journal | None:
        try:
            return Journal(**json.loads(self._journal_path.read_text()))
        except FileNotFoundError:
            return None

    def recover(self) -> Journal | None:
        """Undo a move cut short: back to from_commit, exactly. Returns the journal handled."""
        journal = self.pending_journal()
        if journal is None:
            return None
        # First make index and files consistently the target (whatever got half-written),
        # then step back from it; files only the target had are removed by the second step.
        self.git.run("read-tree", "--reset", "-u", journal.to_tree)
        self.git.run("read-tree", "-m", "-u", journal.to_tree, journal.from_commit)
        self.git.run("update-ref", BRANCH, journal.from_commit)
        (self.state_dir / "live.index").unlink(missing_ok=True)
        self.sync_index()
        self.clear_journal()
        return journal
