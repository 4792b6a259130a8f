"""The vendored git repository (vendor/llama.cpp): reading and committing in it; vendor.py fills it.

Its first commit is the pinned baseline and its later commits are the applied patches, one
commit each, in chain order.

Its working tree is the "live tree". Its content id is a git tree id computed over every
file and mode, except the build outputs tree_identity.py leaves out, so two ids compare trees
byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from polyforge.errors import BadInput, EnvironmentProblem
from polyforge.filelock import open_by_a_process
from polyforge.git import Git, scratch_index
from polyforge.textfile import write_text_atomic
from polyforge.tree_identity import git_exclude_pathspecs

BASELINE_TAG = "polyforge-baseline"
BRANCH = "refs/heads/main"

_SCRATCH_PREFIX = "polyforge-index-"

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


JOURNAL_OPS = ("apply", "unapply")  # the ops that call move_live
_OBJECT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class BadJournal(BadInput):
    """journal.json records no real interrupted move, or rolling it back would lose a live edit."""


def baseline_message(label: str) -> str:
    """The baseline commit's message: the pinned tree's name (Pin.label), not where it came from.
    A build reads the repository (ggml and llama.cpp embed `git rev-parse --short HEAD` and the
    commit count), so the same pin and chain must make the same commits however they arrived."""
    return f"llama.cpp {label}"


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
        path = self.state_dir / "state.json"
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise BadInput(f"{path} is corrupt ({exc})", hint="re-vendor: polyforge vendor fetch --force") from None
        if not isinstance(state, dict):
            raise BadInput(f"{path} is corrupt (not a JSON object)", hint="re-vendor: polyforge vendor fetch --force")
        return state

    def write_state(self, **values) -> None:
        merged = {**self.state(), **values}
        self._write_whole(self.state_dir / "state.json", json.dumps(merged, indent=2, sort_keys=True) + "\n")

    def _write_whole(self, path: Path, text: str) -> None:
        """Write via a temporary file and a rename: a run killed meanwhile leaves the old file or the new."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)

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

    def commit_baseline(self, label: str) -> str:
        tree = self.snapshot()
        commit = self.git.commit_tree(tree, baseline_message(label))
        self.git.run("update-ref", BRANCH, commit)
        self.git.run("symbolic-ref", "HEAD", BRANCH)
        self.git.run("tag", "-f", BASELINE_TAG, commit)
        self.sync_index()
        return tree

    # -- trees -----------------------------------------------------------------------
    def snapshot(self) -> str:
        """Tree id of the live tree: every file and mode that counts (tree_identity.py).

        Works in a private copy of the live index (its stat cache spares re-hashing) and puts
        the copy back by an atomic rename, so it takes no lock that another run needs: read-only
        commands snapshot side by side, and none can break a writer.
        """
        live_index = self.state_dir / "live.index"
        real_index = self.path / ".git" / "index"
        with scratch_index(self.git) as scratch:
            for source in (live_index, real_index):
                if source.exists():
                    # copy2 keeps the mtime: git trusts stat info only from entries older than it
                    shutil.copy2(source, scratch.index)
                    break
            scratch.run("add", "-A", "-f", "--", ".", *git_exclude_pathspecs(self.path))
            tree = scratch.write_tree()
            self.state_dir.mkdir(parents=True, exist_ok=True)
            os.replace(scratch.index, live_index)
        return tree

    def sync_index(self) -> None:
        """Make the repository's own index match HEAD (stat info from the live index)."""
        live_index = self.state_dir / "live.index"
        head_tree = self.git.tree_of("HEAD")
        with scratch_index(self.git) as scratch:
            if live_index.exists():
                shutil.copy2(live_index, scratch.index)  # keeps the mtime, as in snapshot
                if scratch.write_tree() == head_tree:
                    os.replace(scratch.index, self.path / ".git" / "index")  # whole: a kill leaves old or new
                    return
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
        self._write_whole(self._journal_path, json.dumps(journal.__dict__))

    def clear_journal(self) -> None:
        self._journal_path.unlink(missing_ok=True)

    def pending_journal(self) -> Journal | None:
        try:
            return Journal(**json.loads(self._journal_path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise BadInput(f"{self._journal_path} is corrupt ({exc}): the run it records cannot be rolled back",
                           hint=f"check the tree by hand (git -C {self.path} status), then delete that file") from None

    def _object_type(self, name: object) -> str | None:
        if not isinstance(name, str) or not _OBJECT_ID.fullmatch(name):
            return None
        status, out, _ = self.git.run_full("cat-file", "-t", name, check=False)
        return out.strip() if status == 0 else None

    def check_journal(self, journal: Journal) -> None:
        """Refuse (BadJournal, changing nothing) unless rolling the journal back can lose nothing.

        The journal must describe a real interrupted move_live: a known op, a from_commit that is
        a commit, a to_tree that is a tree, and refs where the move left them: HEAD still at
        from_commit (cut short before update-ref) or at a commit of to_tree related to it by
        ancestry (cut short after). And since the live tree was clean at from_commit when the
        move began, every live file must hold its from_commit or its to_tree content: anything
        else is an edit made since, which the rollback (read-tree --reset) would overwrite.
        """
        where = f"{self._journal_path} ({str(journal.op)[:20]!r} from {str(journal.from_commit)[:12]})"
        hint = (f"inspect it; delete {self._journal_path} if no polyforge run was interrupted "
                f"(git -C {self.path} status shows the tree)")
        if journal.op not in JOURNAL_OPS:
            raise BadJournal(f"{where}: unknown operation; it records no polyforge run", hint=hint)
        if self._object_type(journal.from_commit) != "commit":
            raise BadJournal(f"{where}: from_commit {str(journal.from_commit)[:40]} is not a commit in "
                             f"{self.path}; it records no interrupted run", hint=hint)
        if self._object_type(journal.to_tree) != "tree":
            raise BadJournal(f"{where}: to_tree {str(journal.to_tree)[:40]} is not a tree in {self.path}; "
                             "it records no interrupted run", hint=hint)
        head = self.git.try_rev_parse("HEAD^{commit}")
        if head != journal.from_commit:
            related = head is not None and self.git.tree_of(head) == journal.to_tree and any(
                self.git.run_full("merge-base", "--is-ancestor", a, b, check=False)[0] == 0
                for a, b in ((journal.from_commit, head), (head, journal.from_commit)))
            if not related:
                raise BadJournal(f"{where}: HEAD {(head or 'unknown')[:12]} is neither its from_commit nor a "
                                 "commit of its to_tree; it records no interrupted run", hint=hint)
        from_tree = self.git.tree_of(journal.from_commit)
        live = self.snapshot()
        changed_from = {path for _, path in self.git.diff_names(from_tree, live)}
        for status, path in self.git.diff_names(journal.to_tree, live):
            # a path the live tree lacks holds no content to lose (a move cut short between
            # git's unlink and its write leaves one); one that differs from both versions does
            if path in changed_from and status != "D" and not self._half_written(path, (from_tree, journal.to_tree)):
                shown = path if path.isprintable() else repr(path)  # one line, whatever the name
                raise BadJournal(
                    f"{shown} in {self.path} is neither its {journal.from_commit[:12]} version nor the one the "
                    f"interrupted {journal.op} wrote: rolling back would lose that edit; nothing was changed",
                    hint=f"save {shown} elsewhere and restore it (git -C {self.path} checkout HEAD -- {shown}, "
                         f"or remove it if HEAD has none), then rerun; or {hint}")

    def _half_written(self, path: str, trees: tuple[str, ...]) -> bool:
        """A file git was writing when the run died: its bytes are a prefix of one version's."""
        try:
            live = (self.path / path).read_bytes()
        except OSError:
            return False
        for tree in trees:
            status, blob, _ = self.git.run_full("rev-parse", "--verify", "--quiet", f"{tree}:{path}", check=False)
            if status == 0 and self.git.run_bytes("cat-file", "blob", blob.strip()).startswith(live):
                return True
        return False

    def recover(self) -> Journal | None:
        """Undo a move cut short: back to from_commit, exactly. Returns the journal handled.

        check_journal first: a journal that records no real interrupted move, or a live tree
        holding an edit the rollback would overwrite, stops here with nothing changed."""
        journal = self.pending_journal()
        if journal is None:
            return None
        self.check_journal(journal)
        # First make index and files consistently the target (whatever got half-written),
        # then step back from it; files only the target had are removed by the second step.
        self.git.run("read-tree", "--reset", "-u", journal.to_tree)
        self.git.run("read-tree", "-m", "-u", journal.to_tree, journal.from_commit)
        self.git.run("update-ref", BRANCH, journal.from_commit)
        (self.state_dir / "live.index").unlink(missing_ok=True)
        self.sync_index()
        self.clear_journal()
        return journal

    # -- what a dead run leaves behind -------------------------------------------------------
    def leftover_locks(self, dead_holder: int | None) -> tuple[list[str], list[str]]:
        """Git lock files in the repository (paths relative to the tree): (removable, blocking).

        Removable: a polyforge run died holding the project lock (`dead_holder`, from the lock's
        record) and no process has the file open, so the dead run or its git left it. Anything
        else may be a git of the user's at work in the tree, and would stop the next command.
        Scratch indexes are not counted: they are private to one run (see clear_leftovers).
        """
        git_dir = self.path / ".git"
        found = []
        for folder, subfolders, files in os.walk(git_dir):
            if Path(folder) == git_dir:
                subfolders[:] = [d for d in subfolders if d != "objects"]  # git takes no lock in there
            found += [Path(folder, name) for name in files
                      if name.endswith(".lock") and not name.startswith(_SCRATCH_PREFIX)]
        removable, blocking = [], []
        for path in sorted(found):
            is_ours = dead_holder is not None and open_by_a_process(path) is not True
            (removable if is_ours else blocking).append(path.relative_to(self.path).as_posix())
        return removable, blocking

    def clear_leftovers(self, dead_holder: int | None) -> list[str]:
        """For a writer holding the project lock: remove what a dead polyforge run left (stale git
        lock files, scratch indexes) and return notices; fail if a lock file is not ours to remove."""
        removable, blocking = self.leftover_locks(dead_holder)
        notices = []
        for rel in removable:
            (self.path / rel).unlink(missing_ok=True)
            notices.append(f"removed a stale {rel} left by a polyforge run that died (pid {dead_holder})")
        # no other polyforge run is inside the repository while we hold the lock exclusively
        # (readers hold it shared), so every scratch index is a dead run's
        for scratch in (self.path / ".git").glob(f"{_SCRATCH_PREFIX}*"):
            scratch.unlink(missing_ok=True)
        if blocking:
            raise EnvironmentProblem(
                f"{blocking[0]} exists in {self.path}: a git process is at work there, or one died",
                hint=f"if no git process runs in {self.path}, delete {self.path / blocking[0]}")
        return notices
