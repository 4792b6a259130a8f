"""The patch chain: discovery in lexical order, index-only application, and the commands
that move the live tree (apply, unapply, capture, refresh, lock).

All computation happens in throw-away git indexes over the vendored repository's objects,
so nothing touches the live tree until every step has been proven; the one live-tree move
is journalled and recovered if it is cut short.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Iterator

from . import patchfile
from .errors import BadInput, VerificationFailed
from .filelock import FileLock
from .git import Git, scratch_index
from .lockfile import ChainLock, LockEntry
from .patchfile import Patch
from .project import Project
from .settings import Pin
from .vendored import AppliedPatch, VendoredTree

_OFFSET = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")


class DirtyTree(BadInput):
    """The live tree has edits the command would overwrite."""


@dataclass
class StepResult:
    name: str
    ok: bool
    tree: str | None = None
    offsets: list[str] = field(default_factory=list)
    error: str | None = None


# -- discovery ------------------------------------------------------------------------------
def discover(project: Project) -> list[Patch]:
    """Every patches/*.patch in pure lexical (byte) order of file names."""
    folder = project.patches_dir
    if not folder.is_dir():
        return []
    files = sorted((p for p in folder.iterdir() if p.suffix == ".patch"), key=lambda p: p.name.encode())
    patches = []
    for path in files:
        patchfile.check_name(path.name)
        patches.append(patchfile.read(path))
    return patches


def select(patches: list[Patch], to: str | None) -> int:
    """How many patches of the chain `--to NNNN[-slug]` keeps (0 for 'base')."""
    if to is None:
        return len(patches)
    if to in ("base", "baseline", "0000"):
        return 0
    matches = [i for i, p in enumerate(patches) if p.name == to or p.name == f"{to}.patch"
               or p.number == to or p.name.removesuffix(".patch") == to]
    if len(matches) != 1:
        names = ", ".join(p.name for p in patches) or "none"
        raise BadInput(f"--to {to}: no single patch matches (patches: {names})")
    return matches[0] + 1


# -- index-only application ----------------------------------------------------------------
def _symlinks(index: Git) -> set[str]:
    out = index.run("ls-files", "-s", "-z", strip=False)
    links = set()
    for entry in filter(None, out.split("\0")):
        meta, path = entry.split("\t", 1)
        if meta.startswith("120000"):
            links.add(path)
    return links


def _check_symlinks(index: Git, patch: Patch) -> None:
    links = _symlinks(index)
    if not links:
        return
    for path in patch.paths():
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if prefix in links:
                raise BadInput(f"{patch.name}: {path} goes through the symlink {prefix}; patches may not")


def apply_in_index(index: Git, patch: Patch, *, reverse: bool = False, allow_offset: bool = False) -> StepResult:
    """Apply (or reverse) one patch to a scratch index; exact unless allow_offset."""
    _check_symlinks(index, patch)
    args = ["apply", "--cached", "-v", "--whitespace=nowarn"]
    if reverse:
        args.append("--reverse")
    status, _, err = index.run_full(*args, str(patch.path), check=False)
    if status != 0:
        lines = [ln.strip() for ln in err.splitlines() if ln.startswith(("error:", "fatal:"))]
        return StepResult(patch.name, False, error="; ".join(lines) or err.strip().splitlines()[-1])
    offsets = [f"hunk {m.group(1)} at line {m.group(2)} (offset {m.group(3)})" for m in _OFFSET.finditer(err)]
    result = StepResult(patch.name, True, tree=index.write_tree(), offsets=offsets)
    if offsets and not allow_offset:
        result.ok = False
        result.error = f"applies only with offsets: {', '.join(offsets)} (pass --allow-offset, or refresh the patch)"
    return result


def run_chain(repo: Git, start_tree: str, patches: list[Patch], *, reverse: bool = False,
              allow_offset: bool = False) -> list[StepResult]:
    """Apply patches in the given order from start_tree; stops at the first failure."""
    results = []
    with scratch_index(repo, start_tree) as index:
        for patch in patches:
            step = apply_in_index(index, patch, reverse=reverse, allow_offset=allow_offset)
            results.append(step)
            if not step.ok:
                break
    return results


def find_misnumbered(repo: Git, start_tree: str, patches: list[Patch], failed_at: int) -> str | None:
    """When lexical order fails at `failed_at`, look for a later patch that must come first."""
    tree = start_tree
    if failed_at:
        prefix = run_chain(repo, start_tree, patches[:failed_at])
        if len(prefix) != failed_at or not prefix[-1].ok or prefix[-1].tree is None:
            return None
        tree = prefix[-1].tree
    failing = patches[failed_at]
    for later in patches[failed_at + 1:]:
        steps = run_chain(repo, tree, [later, failing])
        if len(steps) == 2 and all(s.ok for s in steps):
            return (f"{failing.name} applies only after {later.name}: renumber {failing.name} "
                    f"to sort after {later.name} (or {later.name} before it)")
    return None


def prune_tree(repo: Git, tree: str, prune: tuple[str, ...]) -> str:
    with scratch_index(repo, tree) as index:
        if prune:
            index.run("rm", "-r", "-q", "-f", "--cached", "--ignore-unmatch", "--", *prune)
        return index.write_tree()


# -- the project-level chain -----------------------------------------------------------------
class Chain:
    """A project's patches, pin, lock and vendored tree together."""

    def __init__(self, project: Project):
        self.project = project
        self.pin = Pin.load(project.pin_file)
        self.tree = VendoredTree(project.tree_dir)

    @contextmanager
    def locked(self) -> Iterator[list[str]]:
        """Hold the project lock; recover a run cut short first. Yields notices."""
        notices: list[str] = []
        with FileLock(self.project.lock_path, "vendored tree"):
            if self.tree.exists():
                journal = self.tree.recover()
                if journal is not None:
                    notices.append(f"recovered from an interrupted {journal.op}: the live tree is back at "
                                   f"{journal.from_commit[:12]}")
            yield notices

    def patches(self) -> list[Patch]:
        return discover(self.project)

    def lock(self) -> ChainLock | None:
        return ChainLock.read(self.project.chain_lock_file)

    @property
    def pruned(self) -> bool:
        return bool(self.tree.state().get("pruned"))

    def expected_base(self) -> str:
        if self.pruned:
            if not self.pin.pack_tree:
                raise BadInput("the vendored tree is pruned but the pin has no pack.tree")
            return self.pin.pack_tree
        return self.pin.tree

    def locked_tree(self, entry: LockEntry | None) -> str | None:
        if entry is None:
            return None
        return entry.pack_tree if self.pruned else entry.tree

    def live_changes(self) -> list[tuple[str, str]]:
        """(status, path) of live edits beyond the applied chain."""
        return self.tree.git.diff_names(self.tree.head_tree(), self.tree.snapshot())

    def require_clean(self, what: str) -> None:
        changes = self.live_changes()
        if changes:
            files = ", ".join(p for _, p in changes[:5]) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
            raise DirtyTree(f"the vendored tree has live edits that {what} would overwrite: {files}",
                            hint="capture them (polyforge capture NNNN-slug), refresh the top patch, or move them away")

    def lock_drift(self, patches: list[Patch]) -> list[str]:
        lock = self.lock()
        if lock is None:
            return ["patches/chain.lock is missing"] if patches else []
        drift = []
        names = [p.name for p in patches]
        for patch in patches:
            entry = lock.entry(patch.name)
            if entry is None:
                drift.append(f"{patch.name} is not in chain.lock")
            elif entry.sha256 != patch.sha256:
                drift.append(f"{patch.name}: sha256 {patch.sha256[:12]} differs from chain.lock's {entry.sha256[:12]}")
        for entry in lock.patches:
            if entry.name not in names:
                drift.append(f"chain.lock lists {entry.name}, which is not in patches/")
        if [e.name for e in lock.patches if e.name in names] != [n for n in names if lock.entry(n)]:
            drift.append("chain.lock lists the patches in another order")
        if lock.base_tree != self.pin.tree:
            drift.append(f"chain.lock base tree {lock.base_tree[:12]} is not the pin's {self.pin.tree[:12]}")
        return drift

    def require_no_drift(self, patches: list[Patch]) -> None:
        drift = self.lock_drift(patches)
        if drift:
            raise VerificationFailed(f"chain.lock drift: {drift[0]}" + (f" (+{len(drift) - 1} more)" if len(drift) > 1 else ""),
                                     hint="if the change is intended, run: polyforge lock")

    def applied_prefix(self, patches: list[Patch]) -> list[AppliedPatch]:
        """The applied commits, checked to be a prefix of the chain by name."""
        applied = self.tree.applied()
        for i, done in enumerate(applied):
            if i >= len(patches) or patches[i].name != done.name:
                expected = patches[i].name if i < len(patches) else "nothing"
                raise VerificationFailed(
                    f"applied patch {done.name} is not patch {i + 1} of the chain ({expected})",
                    hint="unapply first (polyforge unapply), then apply")
        return applied

    # -- commands ---------------------------------------------------------------------------
    def apply(self, to: str | None = None, allow_offset: bool = False) -> list[dict]:
        self.tree.require()
        patches = self.patches()
        target = select(patches, to)
        self.require_no_drift(patches)
        applied = self.applied_prefix(patches)
        report = [{"name": a.name, "status": "already applied"} for a in applied[:target]]
        if target < len(applied):
            raise BadInput(f"--to {to}: {len(applied)} patches are applied already; use polyforge unapply --to")
        for done, patch in zip(applied, patches):
            if done.sha256 != patch.sha256:
                raise VerificationFailed(f"{patch.name} changed since it was applied",
                                         hint=f"polyforge unapply --to {patches[applied.index(done) - 1].number if applied.index(done) else 'base'}, then apply")
        pending = patches[len(applied):target]
        if not pending:
            return report
        self.require_clean("apply")
        lock = self.lock()
        head = self.tree.head()
        steps = run_chain(self.tree.git, self.tree.head_tree(), pending, allow_offset=allow_offset)
        failed = next((s for s in steps if not s.ok), None)
        if failed is not None:
            position = len(applied) + steps.index(failed)
            hint = find_misnumbered(self.tree.git, self.tree.baseline_tree(), patches, position)
            raise VerificationFailed(f"{failed.name} does not apply: {failed.error}",
                                     hint=hint or "nothing was changed; refresh the patch against its predecessor")
        commit = head
        for patch, step in zip(pending, steps):
            expected = self.locked_tree(lock.entry(patch.name)) if lock else None
            if expected and expected != step.tree:
                raise VerificationFailed(f"{patch.name} gives tree {step.tree[:12]}, chain.lock says {expected[:12]}",
                                         hint="nothing was changed; run polyforge lock if the chain changed on purpose")
            commit = self.tree.patch_commit(commit, step.tree, patch.name, patch.sha256)
            report.append({"name": patch.name, "status": "applied", "tree": step.tree, "offsets": step.offsets})
        self.tree.move_live(head, commit, "apply")
        return report

    def unapply(self, to: str | None = None) -> list[dict]:
        self.tree.require()
        patches = self.patches()
        keep = 0 if to is None else select(patches, to)
        applied = self.applied_prefix(patches)
        if keep > len(applied):
            raise BadInput(f"--to {to}: only {len(applied)} patches are applied")
        removing = applied[keep:]
        if not removing:
            return []
        self.require_clean("unapply")
        target_commit = applied[keep - 1].commit if keep else self.tree.baseline_commit()
        target_tree = self.tree.git.tree_of(target_commit)
        # prove the files reverse-apply to the recorded trees; fall back to the commit only
        # for a patch file that changed since it was applied, and say so
        report = []
        by_name = {p.name: p for p in patches}
        tree = self.tree.head_tree()
        with scratch_index(self.tree.git, tree) as index:
            for done in reversed(removing):
                patch = by_name[done.name]
                parent_tree = self.tree.git.tree_of(f"{done.commit}^")
                if patch.sha256 != done.sha256:
                    index.read_tree(parent_tree)
                    report.append({"name": done.name, "status": "unapplied (patch file changed; restored recorded tree)"})
                    continue
                step = apply_in_index(index, patch, reverse=True)
                if not step.ok or step.tree != parent_tree:
                    raise VerificationFailed(f"{done.name} does not reverse-apply to its recorded parent tree: "
                                             f"{step.error or step.tree}", hint="nothing was changed")
                report.append({"name": done.name, "status": "unapplied", "tree": step.tree})
            if index.write_tree() != target_tree:  # pragma: no cover - guarded per step above
                raise VerificationFailed("unapply did not reach the recorded tree")
        self.tree.move_live(self.tree.head(), target_commit, "unapply")
        return report

    def capture(self, name: str, message: str | None = None, upstream_status: str = "Pending",
                author: str = "polyforge <polyforge@localhost>") -> dict:
        self.tree.require()
        file_name = patchfile.check_name(name)
        if upstream_status.split()[0] not in patchfile.UPSTREAM_STATUSES:
            raise BadInput(f"--upstream-status {upstream_status}: one of {', '.join(patchfile.UPSTREAM_STATUSES)}")
        patches = self.patches()
        if any(p.name == file_name for p in patches):
            raise BadInput(f"{file_name} exists already; use polyforge refresh to update the top patch")
        self.require_no_drift(patches)
        applied = self.applied_prefix(patches)
        later = patches[len(applied):]
        if applied and file_name.encode() <= applied[-1].name.encode():
            raise BadInput(f"{file_name} would sort before the applied {applied[-1].name}; "
                           f"a new patch goes on top: pick a later number")
        if later and file_name.encode() >= later[0].name.encode():
            raise BadInput(f"{file_name} would sort after the unapplied {later[0].name}; "
                           f"pick a number between the applied and unapplied patches")
        head_tree = self.tree.head_tree()
        live_tree = self.tree.snapshot()
        if live_tree == head_tree:
            raise BadInput("no live edits to capture: the vendored tree equals the applied chain")
        diff = patchfile.generate_diff(self.tree.git, head_tree, live_tree)
        slug = file_name[5:-len(".patch")]
        subject, body = _split_message(message, slug)
        body = "\n\n".join(part for part in (body, f"Upstream-Status: {upstream_status}") if part)
        header = patchfile.Header(author=author, date=patchfile.today_date(), subject=subject, body=body)
        data = patchfile.render(header, diff)
        path = self.project.patches_dir / file_name
        patch = patchfile.parse(data, file_name, path)
        rebased = self._rebase_unapplied(f"capturing {file_name}", later, live_tree)
        self.project.patches_dir.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        for later_patch, later_data in rebased:
            later_patch.path.write_bytes(later_data)
        commit = self.tree.patch_commit(self.tree.head(), live_tree, file_name, patch.sha256)
        self.tree.git.run("update-ref", "refs/heads/main", commit)
        self.tree.sync_index()
        self.relock()
        return {"name": file_name, "sha256": patch.sha256, "tree": live_tree,
                "files": [{"path": c.path, "change": c.kind} for c in patch.changes],
                "rebased": [later_patch.name for later_patch, _ in rebased]}

    def refresh(self, check: bool = False, message: str | None = None) -> dict:
        """Rewrite the top applied patch from the live tree; a message replaces its subject and
        description (its trailers, Upstream-Status first, are kept)."""
        self.tree.require()
        patches = self.patches()
        applied = self.applied_prefix(patches)
        if not applied:
            raise BadInput("no patch is applied: nothing to refresh")
        if check and message is not None:
            raise BadInput("--check compares with the patch as it is: it takes no message")
        top = applied[-1]
        patch = next(p for p in patches if p.name == top.name)
        parent_tree = self.tree.git.tree_of(f"{top.commit}^")
        live_tree = self.tree.snapshot()
        if live_tree == parent_tree:
            raise BadInput(f"refreshing {top.name} would leave it empty; delete it with unapply + rm instead")
        header = None
        if message is not None:
            subject, body = _split_message(message, top.name[5:-len(".patch")])
            status = patch.header.trailer("Upstream-Status") or "Pending"
            body = "\n\n".join(part for part in (body, f"Upstream-Status: {status}") if part)
            header = replace(patch.header, subject=subject, body=body)
        data = patchfile.canonical(patch, self.tree.git, parent_tree, live_tree, header)
        changed = data != patch.data
        if check:
            if changed:
                raise VerificationFailed(f"{top.name} is not what refresh would write "
                                         f"({'live edits beyond it' if live_tree != top.tree else 'non-canonical bytes'})",
                                         hint="run: polyforge refresh")
            return {"name": top.name, "changed": False}
        rebased = self._rebase_unapplied(f"refreshing {top.name}", patches[len(applied):], live_tree)
        if changed:
            patchfile.parse(data, top.name, patch.path)
            patch.path.write_bytes(data)
        for later, later_data in rebased:
            later.path.write_bytes(later_data)
        sha = patchfile.sha256_bytes(data)
        commit = self.tree.patch_commit(f"{top.commit}^", live_tree, top.name, sha)
        self.tree.git.run("update-ref", "refs/heads/main", commit)
        self.tree.sync_index()
        self.relock()
        return {"name": top.name, "changed": changed, "sha256": sha, "tree": live_tree,
                "rebased": [later.name for later, _ in rebased]}

    def _rebase_unapplied(self, doing: str, later: list[Patch], tree: str) -> list[tuple[Patch, bytes]]:
        """The unapplied patches above a captured or refreshed one, re-rendered where their hunks only moved
        (offsets, blob ids), so the chain stays exact; a patch that no longer applies stops the command."""
        steps = run_chain(self.tree.git, tree, later, allow_offset=True)
        failed = next((s for s in steps if not s.ok), None)
        if failed is not None:
            raise VerificationFailed(f"{doing} would break the unapplied {failed.name}: {failed.error}",
                                     hint="nothing was written")
        rebased = []
        for patch, step in zip(later, steps):
            assert step.tree
            data = patchfile.canonical(patch, self.tree.git, tree, step.tree)
            if data != patch.data:
                rebased.append((patch, data))
            tree = step.tree
        return rebased

    def relock(self) -> ChainLock:
        """Recompute chain.lock from a fresh baseline; every chain-changing command ends here."""
        self.tree.require()
        patches = self.patches()
        git = self.tree.git
        steps = run_chain(git, self.tree.baseline_tree(), patches)
        failed = next((s for s in steps if not s.ok), None)
        if failed is not None:
            raise VerificationFailed(f"cannot lock: {failed.name} does not apply in lexical order: {failed.error}")
        entries = []
        for patch, step in zip(patches, steps):
            assert step.tree
            if self.pruned:
                old = (self.lock() or ChainLock(self.pin.tree)).entry(patch.name)
                if old is None:
                    raise BadInput("cannot lock new patches on a pruned vendored tree; fetch the full tree")
                entries.append(LockEntry(patch.name, patch.sha256, old.tree, step.tree))
            else:
                entries.append(LockEntry(patch.name, patch.sha256, step.tree,
                                         prune_tree(git, step.tree, self.pin.pack_prune) if self.pin.pack_prune else None))
        lock = ChainLock(base_tree=self.pin.tree, pack_base_tree=self.pin.pack_tree, patches=tuple(entries))
        lock.write(self.project.chain_lock_file)
        return lock


def _split_message(message: str | None, slug: str) -> tuple[str, str]:
    if not message:
        return slug.replace("-", " "), ""
    lines = message.strip().splitlines()
    return lines[0].strip(), "\n".join(lines[1:]).strip("\n")
