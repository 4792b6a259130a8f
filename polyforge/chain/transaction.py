"""A write-ahead journal for the commands that rewrite several of the project's files at once
(fold, move, rename): patch files, chain.lock and the vendored repository's branch.

Before the first write, the old bytes of every file the command will write or delete, and the
old branch commit, are saved under vendor/transaction/, and journal.json is written last (whole,
by rename): its presence means "roll back". Then the writes happen, and journal.json is removed
first when they are all done. A run killed at any moment therefore leaves either no journal
(nothing written yet, or everything written) or a complete one, which the next command that
takes the project lock rolls back, byte for byte; rolling back twice is harmless, so a kill
during the roll-back is recovered the same way.

Each write is a step boundary of journal.py's kill hook (POLYFORGE_KILL_AT_STEP=N: SIGKILL at the
N-th boundary), with which the tests kill a real run at every one.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from polyforge.errors import BadInput
from polyforge.git import Git
from polyforge.journal import boundary as step
from polyforge.project import Project


@dataclass
class Transaction:
    """The files one command writes (relative to the project root; None content deletes) and the
    branch it moves in the vendored repository."""

    project: Project
    what: str
    writes: dict[str, bytes | None] = field(default_factory=dict)
    branch: tuple[Git, str, str] | None = None  # (repository, ref, new commit)

    @property
    def folder(self) -> Path:
        return self.project.transaction_dir

    def commit(self) -> None:
        """Journal, write everything, then drop the journal."""
        self._save_old()
        step()
        for rel, data in sorted(self.writes.items(), key=lambda kv: kv[1] is not None):  # deletions first
            path = self.project.root / rel
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(path.name + ".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, path)
            step()
        if self.branch is not None:
            git, ref, new = self.branch
            git.run("update-ref", ref, new)
            step()
        (self.folder / "journal.json").unlink()
        step()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _save_old(self) -> None:
        if (self.folder / "journal.json").exists():  # pragma: no cover - recover() runs first under the lock
            raise BadInput(f"{self.folder} holds an unfinished {self.what}")
        shutil.rmtree(self.folder, ignore_errors=True)
        (self.folder / "old").mkdir(parents=True)
        files = []
        for i, rel in enumerate(sorted(self.writes)):
            source = self.project.root / rel
            copy = None
            if source.is_file():
                copy = f"{i:04d}"
                shutil.copyfile(source, self.folder / "old" / copy)
            files.append({"path": rel, "old": copy})
        journal = {"what": self.what, "files": files}
        if self.branch is not None:
            git, ref, _ = self.branch
            journal["branch"] = {"repository": str(git.cwd), "ref": ref, "old": git.rev_parse(ref)}
        tmp = self.folder / "journal.json.tmp"
        tmp.write_text(json.dumps(journal, indent=1))
        os.replace(tmp, self.folder / "journal.json")


def pending(project: Project) -> str | None:
    """What an interrupted transaction was (the next command rolls it back), or None."""
    try:
        return str(json.loads((project.transaction_dir / "journal.json").read_text()).get("what", "command"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return "command (its journal is unreadable)"


def recover(project: Project) -> str | None:
    """Roll back an interrupted transaction; returns what it was, or None when there was none."""
    folder = project.transaction_dir
    journal_path = folder / "journal.json"
    if not journal_path.exists():
        if folder.exists():  # killed before its journal was complete, or after it was dropped
            shutil.rmtree(folder, ignore_errors=True)
        return None
    try:
        journal = json.loads(journal_path.read_text())
        files = [(entry["path"], entry["old"]) for entry in journal["files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{journal_path} is corrupt ({exc}): the interrupted command it records cannot be "
                       "rolled back", hint=f"check patches/ against git, then delete {folder}") from None
    for rel, copy in files:
        path = project.root / rel
        if copy is None:
            path.unlink(missing_ok=True)
        else:
            tmp = path.with_name(path.name + ".tmp")
            shutil.copyfile(folder / "old" / copy, tmp)
            os.replace(tmp, path)
        path.with_name(path.name + ".tmp").unlink(missing_ok=True)
    branch = journal.get("branch")
    if branch:
        Git(Path(branch["repository"])).run("update-ref", branch["ref"], branch["old"])
    journal_path.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    return str(journal.get("what", "command"))
