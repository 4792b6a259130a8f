"""The patch chain: discovery in lexical order, index-only application, and the commands
that move the live tree (apply, unapply, capture, refresh, lock).

All computation happens in throw-away git indexes over the vendored repository's objects,
so nothing touches the live tree until every step has been proven; the one live-tree move
is journalled and recovered if it is cut short.
"""

from __future__ import annotations

import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Iterator

from polyforge.chain import patchfile, transaction
from polyforge.errors import BadInput, VerificationFailed
from polyforge.filelock import FileLock
from polyforge.git import Git, prune_tree, scratch_index, user_identity
from polyforge.chain.lockfile import ChainLock, LockEntry
from polyforge.chain.patchfile import Patch
from polyforge.project import Project
from polyforge.upstream.vendored_tree import BASELINE_TAG, BRANCH, AppliedPatch, VendoredTree, baseline_message
from polyforge.upstream.workspace import Workspace

_OFFSET = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")


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
    if not folder.exists() and not folder.is_symlink():
        return []
    if not folder.is_dir():
        raise BadInput(f"{folder}: is not a folder (patches/ must be a folder of NNNN-slug.patch files)")
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


_TREE_SYMLINKS: dict[str, frozenset[str]] = {}  # tree id -> its symlinks; a tree id names its content


def tree_symlinks(repo: Git, tree: str) -> frozenset[str]:
    """Every symlink (mode 120000) in `tree`, recursively; one ls-tree per tree id per process."""
    if tree not in _TREE_SYMLINKS:
        out = repo.run("ls-tree", "-r", "-z", tree, strip=False)
        _TREE_SYMLINKS[tree] = frozenset(entry.split("\t", 1)[1] for entry in out.split("\0")
                                         if entry.startswith("120000 "))
    return _TREE_SYMLINKS[tree]


def check_through_symlinks(links: set[str] | frozenset[str], patch: Patch) -> None:
    """Refuse a patch with a path that is, or goes through, one of `links`."""
    if not links:
        return
    for path in patch.paths():
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if prefix in links:
                raise BadInput(f"{patch.name}: {path} goes through the symlink {prefix}; patches may not")


def _check_symlinks(index: Git, patch: Patch) -> None:
    check_through_symlinks(_symlinks(index), patch)


def apply_in_index(index: Git, patch: Patch, *, reverse: bool = False, allow_offset: bool = False) -> StepResult:
    """Apply (or reverse) one patch to a scratch index; exact unless allow_offset."""
    _check_symlinks(index, patch)
    args = ["apply", "--cached", "-v", "--whitespace=nowarn"]
    if reverse:
        args.append("--reverse")
    # only the diff section, on stdin: git would also apply a hunk sitting in the description
    status, _, err = index.run_full(*args, input=patch.diff.encode("utf-8"), check=False)
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


def three_way(repo: Git, old_pre: str, old_post: str, new_pre: str,
              labels: tuple[str, str] = ("ours", "theirs")) -> tuple[str, list[str]]:
    """A patch's own change (old_pre -> old_post) merged into new_pre (`git merge-tree`):
    (tree, conflicted paths); the tree holds conflict markers, labelled `labels`, where there
    are conflicts. Writes objects only: no ref moves."""
    base = repo.commit_tree(old_pre, "patch base")
    ours = repo.commit_tree(new_pre, labels[0], base)
    theirs = repo.commit_tree(old_post, labels[1], base)
    status, out, err = repo.run_full("merge-tree", "--write-tree", "-z", "--name-only", "--no-messages",
                                     ours, theirs, check=False)
    if status not in (0, 1):
        raise VerificationFailed(f"git merge-tree failed: {err.strip().splitlines()[-1] if err.strip() else status}")
    fields = out.split("\0")
    return fields[0], sorted({f for f in fields[1:] if f})


_ORDER_SEARCH_BUDGET = 300  # trial applications: a 20-patch chain needs at most 210 when nothing backtracks


def find_misnumbered(repo: Git, start_tree: str, patches: list[Patch], failed_at: int) -> str | None:
    """When lexical order fails, the smallest renumbering that makes the chain apply, as a hint.

    Searches for an order that applies (at each step the lexically-first patch that applies
    next, backtracking within a budget); the patches to move are those outside a longest run
    of that order kept in lexical order. None when the search ran out of budget.
    """
    order = _order_that_applies(repo, start_tree, patches)
    if order is None:
        return None
    if not order:
        return (f"no order of the chain applies: {patches[failed_at].name} fails in lexical order "
                f"and no other order gets every patch on")
    kept = set(_longest_increasing(order))
    moves = []
    for position, index in enumerate(order):
        if index in kept:
            continue
        where = f"sort after {patches[order[position - 1]].name}" if position else f"sort before {patches[order[1]].name}"
        moves.append(f"{patches[index].name} to {where}")
    return "renumber " + ", ".join(moves)


def _order_that_applies(repo: Git, start_tree: str, patches: list[Patch]) -> list[int] | None:
    """Indices of `patches` in an order that applies exactly; [] if none does, None if unknown."""
    budget = [_ORDER_SEARCH_BUDGET]
    applied: dict[tuple[str, int], str | None] = {}
    dead_ends: set[tuple[str, frozenset[int]]] = set()

    with scratch_index(repo) as index:
        def step(tree: str, i: int) -> str | None:
            if (tree, i) not in applied:
                budget[0] -= 1
                index.read_tree(tree)
                result = apply_in_index(index, patches[i])
                applied[(tree, i)] = result.tree if result.ok else None
            return applied[(tree, i)]

        def search(tree: str, remaining: tuple[int, ...]) -> list[int] | None:
            if not remaining:
                return []
            if (tree, frozenset(remaining)) in dead_ends:
                return None
            for i in remaining:  # lexical order first: keeps as much of it as applies
                if budget[0] <= 0:
                    raise _OutOfBudget
                after = step(tree, i)
                if after is not None:
                    rest = search(after, tuple(j for j in remaining if j != i))
                    if rest is not None:
                        return [i, *rest]
            dead_ends.add((tree, frozenset(remaining)))
            return None

        try:
            found = search(start_tree, tuple(range(len(patches))))
        except _OutOfBudget:
            return None
    return [] if found is None else found


class _OutOfBudget(Exception):
    pass


def _longest_increasing(sequence: list[int]) -> list[int]:
    """A longest increasing subsequence; among equals, the one that keeps earlier positions."""
    longest_from = [1] * len(sequence)
    for i in range(len(sequence) - 1, -1, -1):
        for j in range(i + 1, len(sequence)):
            if sequence[j] > sequence[i]:
                longest_from[i] = max(longest_from[i], longest_from[j] + 1)
    result: list[int] = []
    need = max(longest_from, default=0)
    for i, value in enumerate(sequence):
        if longest_from[i] == need and (not result or value > result[-1]):
            result.append(value)
            need -= 1
    return result


def chain_paths(patches: list[Patch]) -> frozenset[str]:
    """Every path any patch of the chain touches: a pruned baseline keeps these."""
    return frozenset(path for patch in patches for path in patch.paths())


# -- the project-level chain -----------------------------------------------------------------
class Chain(Workspace):
    """A project's patches and chain.lock on its pin and vendored tree (the Workspace)."""

    @contextmanager
    def exclusive(self, rebasing: bool = False) -> Iterator[list[str]]:
        """Hold the project lock; clear what a dead run left and recover a run cut short first.
        Yields notices. While a rebase is in progress only the rebase itself (rebasing) runs."""
        notices: list[str] = []
        with FileLock(self.project.lock_path, "vendored tree") as lock:
            if not rebasing:
                self.require_no_rebase()
            # a rebase killed while making its workspace, or while deleting it after its end
            for leftover in (self.project.rebase_begin_dir, self.project.rebase_done_dir):
                shutil.rmtree(leftover, ignore_errors=True)
            if self.tree.exists():
                # holding the lock, we know no other polyforge run is inside the repository
                notices += self.tree.clear_leftovers(lock.dead_holder)
                interrupted = transaction.recover(self.project)
                if interrupted is not None:
                    notices.append(f"rolled back an interrupted {interrupted}: patches/, chain.lock and the "
                                   "applied commits are as they were before it")
                journal = self.tree.recover()
                if journal is not None:
                    notices.append(f"recovered from an interrupted {journal.op}: the live tree is back at "
                                   f"{journal.from_commit[:12]}")
            yield notices

    def patches(self) -> list[Patch]:
        """The chain, each patch checked against the baseline's symlinks: a path through one is
        refused as unsafe (exit 2) before anything compares the chain with chain.lock. Patches
        may neither create nor delete symlinks (patchfile refuses mode 120000), so the baseline's
        symlinks are those of every tree the chain produces; apply_in_index checks again."""
        patches = discover(self.project)
        if patches and self.tree.exists():
            base = self.tree.git.try_rev_parse(f"refs/tags/{BASELINE_TAG}^{{tree}}")
            links = tree_symlinks(self.tree.git, base) if base else frozenset()
            for patch in patches:
                check_through_symlinks(links, patch)
        return patches

    def chain_lock(self) -> ChainLock | None:
        return ChainLock.read(self.project.chain_lock_file)

    def pack_base(self) -> str | None:
        """The pruned baseline this chain needs: chain.lock's, which keeps the files the chain
        touches inside the pruned folders; with no lock (no chain), the pin's pack.tree."""
        lock = self.chain_lock()
        if lock is not None and lock.pack_base_tree:
            return lock.pack_base_tree
        return super().pack_base()

    def locked_tree(self, entry: LockEntry | None) -> str | None:
        if entry is None:
            return None
        return entry.pack_tree if self.pruned else entry.tree

    def adopt_patched(self, fresh: VendoredTree, got: str, label: str) -> bool | None:
        """A tree that is the pinned baseline plus a prefix of the chain (a `pack --patched`).

        Recognised by its tree id in chain.lock; the baseline is rebuilt by reverse-applying the
        prefix and must be the pinned tree. Returns whether it is pruned, or None if unknown.
        """
        lock = self.chain_lock()
        if lock is None:
            return None
        for pruned, base in ((False, self.pin.tree), (True, lock.pack_base_tree)):
            trees = [e.pack_tree if pruned else e.tree for e in lock.patches]
            if got not in trees:
                continue
            count = trees.index(got) + 1
            patches = {p.name: p for p in self.patches()}
            prefix = [patches.get(e.name) for e in lock.patches[:count]]
            if None in prefix or [p.sha256 for p in prefix] != [e.sha256 for e in lock.patches[:count]]:
                raise VerificationFailed("the archive is a patched tree, but patches/ no longer holds its chain")
            steps = run_chain(fresh.git, got, list(reversed(prefix)), reverse=True)
            if not all(s.ok for s in steps) or steps[-1].tree != base:
                raise VerificationFailed(f"the patched archive does not reverse to the pinned baseline {base}")
            commit = fresh.git.commit_tree(base, baseline_message(label))
            fresh.git.run("tag", "-f", BASELINE_TAG, commit)
            for patch, tree in zip(prefix, trees[:count]):
                commit = fresh.patch_commit(commit, tree, patch.name, patch.sha256)
            fresh.git.run("update-ref", BRANCH, commit)
            fresh.git.run("symbolic-ref", "HEAD", BRANCH)
            fresh.sync_index()
            return pruned
        return None

    def pack_expectation(self, patched: bool) -> tuple[frozenset[str], str | None]:
        """Every file the chain touches, so that the chain applies on the unpacked tree; and the
        pruned tree chain.lock records for the baseline, or for the applied prefix (patched)."""
        patches = self.patches()
        keep = chain_paths(patches)
        if not patched:
            return keep, self.pack_base()
        self.require_no_drift(patches)
        applied = self.applied_prefix(patches)
        lock = self.chain_lock()
        if lock is None or not applied:
            return keep, self.pack_base()
        return keep, lock.patches[len(applied) - 1].pack_tree

    def lock_drift(self, patches: list[Patch]) -> list[str]:
        lock = self.chain_lock()
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

    @staticmethod
    def applied_mismatch(applied: list[AppliedPatch], patches: list[Patch]) -> list[str]:
        """How the applied commits differ from the chain in patches/, one sentence per applied
        patch that is gone, changed or elsewhere in the chain; empty when they are its prefix."""
        position = {p.name: i for i, p in enumerate(patches)}
        renamed = {p.sha256: p.name for p in patches}
        problems = []
        for i, done in enumerate(applied):
            if done.name not in position:
                problems.append(f"{done.name} is applied but not in patches/"
                                + (f" (renamed to {renamed[done.sha256]})" if done.sha256 in renamed else ""))
            elif patches[position[done.name]].sha256 != done.sha256:
                problems.append(f"{done.name} changed since it was applied")
            elif position[done.name] != i:
                problems.append(f"{done.name} is applied as patch {i + 1} but is patch {position[done.name] + 1} of the chain")
        return problems

    def applied_prefix(self, patches: list[Patch]) -> list[AppliedPatch]:
        """The applied commits, checked to be a prefix of the chain by name."""
        applied = self.tree.applied()
        for i, done in enumerate(applied):
            if i >= len(patches) or patches[i].name != done.name:
                why = next((m for m in self.applied_mismatch(applied, patches) if m.startswith(f"{done.name} ")),
                           f"{done.name} is applied as patch {i + 1}, past the end of the chain")
                raise VerificationFailed(f"the applied patches are not a prefix of the chain: {why}",
                                         hint="polyforge unapply (it restores the recorded trees), then apply")
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
        lock = self.chain_lock()
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
        """Step back from the top, each step checked against the recorded parent tree.

        A patch whose file is in patches/ (under its name, or renamed with the same bytes) is
        reverse-applied; one whose file is gone or changed is undone by restoring the parent
        tree its commit recorded, and the report says so. Works whatever the chain is now.
        """
        self.tree.require()
        patches = self.patches()
        self.chain_lock()  # unapply needs no lock entry, but a malformed chain.lock is refused all the same
        applied = self.tree.applied()
        keep = self._applied_kept(applied, patches, to)
        removing = applied[keep:]
        if not removing:
            return []
        self.require_clean("unapply")
        target_commit = applied[keep - 1].commit if keep else self.tree.baseline_commit()
        target_tree = self.tree.git.tree_of(target_commit)
        report = []
        by_name = {p.name: p for p in patches}
        by_sha = {p.sha256: p for p in patches}
        with scratch_index(self.tree.git, self.tree.head_tree()) as index:
            for done in reversed(removing):
                parent_tree = self.tree.git.tree_of(f"{done.commit}^")
                patch = by_name.get(done.name)
                if patch is None or patch.sha256 != done.sha256:
                    patch = by_sha.get(done.sha256)
                if patch is None:
                    why = "not in patches/" if done.name not in by_name else "patch file changed since it was applied"
                    index.read_tree(parent_tree)
                    report.append({"name": done.name, "status": f"unapplied ({why}: restored the recorded parent tree)",
                                   "tree": parent_tree})
                    continue
                step = apply_in_index(index, patch, reverse=True)
                if not step.ok or step.tree != parent_tree:
                    raise VerificationFailed(f"{done.name} does not reverse-apply to its recorded parent tree: "
                                             f"{step.error or step.tree}", hint="nothing was changed")
                report.append({"name": done.name, "tree": step.tree,
                               "status": "unapplied" + (f" (as {patch.name}, the same bytes renamed)" if patch.name != done.name else "")})
            if index.write_tree() != target_tree:  # pragma: no cover - guarded per step above
                raise VerificationFailed("unapply did not reach the recorded tree")
        self.tree.move_live(self.tree.head(), target_commit, "unapply")
        return report

    @staticmethod
    def _applied_kept(applied: list[AppliedPatch], patches: list[Patch], to: str | None) -> int:
        """How many applied commits `unapply --to` keeps: up to the one applied as that patch."""
        if to is None:
            return 0
        count = select(patches, to)
        if count == 0:
            return 0
        name = patches[count - 1].name
        for i, done in enumerate(applied):
            if done.name == name:
                return i + 1
        raise BadInput(f"--to {to}: {name} is not applied ({len(applied)} patches are applied)")

    def capture(self, name: str, message: str | None = None, upstream_status: str | None = None,
                author: str | None = None) -> dict:
        """A new top patch from the live edits. An explicit upstream_status overrides the message's
        Upstream-Status trailer; with neither, it is Pending."""
        file_name = patchfile.check_name(name)
        subject, description, trailers = _split_message(message, file_name[5:-len(".patch")])
        if upstream_status is not None:
            patchfile.check_upstream_status(upstream_status, "--upstream-status")
            trailers = patchfile.merge_trailers(trailers, [f"Upstream-Status: {upstream_status}"])
        author = author or user_identity(self.project.root)  # as git would record it
        patchfile.check_author(author, "--author")
        self.tree.require()
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
        header = patchfile.Header(author=author, date=patchfile.today_date(), subject=subject,
                                  body=_message_body(description, trailers))
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

    def refresh(self, check: bool = False, message: str | None = None, author: str | None = None) -> dict:
        """Rewrite the top applied patch from the live tree; a message replaces its subject and
        description; its trailers are kept, merged with the message's (whose Upstream-Status wins).
        An author replaces the patch's From: line."""
        if check and (message is not None or author is not None):
            raise BadInput("--check compares with the patch as it is: it takes no message or author")
        if author is not None:
            patchfile.check_author(author, "--author")
        new_message = None if message is None else patchfile.parse_message(message)
        self.tree.require()
        patches = self.patches()
        applied = self.applied_prefix(patches)
        if not applied:
            raise BadInput("no patch is applied: nothing to refresh")
        if not check:
            self.require_no_drift(patches)  # refresh ends by rewriting chain.lock: it must be sound first
        top = applied[-1]
        patch = next(p for p in patches if p.name == top.name)
        parent_tree = self.tree.git.tree_of(f"{top.commit}^")
        live_tree = self.tree.snapshot()
        if live_tree == parent_tree:
            raise BadInput(f"refreshing {top.name} would leave it empty; delete it with unapply + rm instead")
        header = None
        if new_message is not None:
            subject, description, trailers = new_message
            header = replace(patch.header, subject=subject,
                             body=_message_body(description, patch.header.trailers(), trailers))
        if author is not None:
            header = replace(header or patch.header, author=author)
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

    def steps_from_baseline(self, patches: list[Patch], doing: str) -> list[StepResult]:
        """The chain applied exactly on the vendored baseline, each step ok, or an error that names
        the first patch that does not apply (and a misnumbering, when reordering would fix it)."""
        self.tree.require()
        base = self.tree.baseline_tree()
        steps = run_chain(self.tree.git, base, patches)
        failed = next((s for s in steps if not s.ok), None)
        if failed is not None:
            raise VerificationFailed(f"{doing}: {failed.name} does not apply in lexical order: {failed.error}",
                                     hint=find_misnumbered(self.tree.git, base, patches, steps.index(failed)))
        return steps

    def relock(self) -> ChainLock:
        """Recompute chain.lock from a fresh baseline and write it; every chain-changing command ends here."""
        lock = self.lock_for(self.patches())
        lock.write(self.project.chain_lock_file)
        return lock

    def lock_for(self, patches: list[Patch]) -> ChainLock:
        """chain.lock for `patches`, computed from a fresh baseline; nothing is written.

        pack_tree ids are computed by applying the chain on the pruned baseline it needs (the
        pin's pack.prune folders less the files the chain touches), so they are the trees a
        pruned vendored tree really reaches.
        """
        git = self.tree.git
        steps = self.steps_from_baseline(patches, "cannot lock")
        base = self.tree.baseline_tree()
        if self.pruned:
            return self._lock_pruned(patches, steps)
        pack_base, pack_trees = None, [None] * len(patches)
        prune = self.pin.pack_prune
        if prune:
            whole = prune_tree(git, base, prune)
            if self.pin.pack_tree and whole != self.pin.pack_tree:
                raise VerificationFailed(f"the pin's pack.tree {self.pin.pack_tree} is not the baseline less "
                                         f"{', '.join(prune)} ({whole})", hint="correct pack.tree in vendor/pin.yaml")
            pack_base = prune_tree(git, base, prune, chain_paths(patches))
            pack_steps = run_chain(git, pack_base, patches)
            broken = next((s for s in pack_steps if not s.ok), None)
            if broken is not None:  # pragma: no cover - the pruned baseline holds every file a patch touches
                raise VerificationFailed(f"cannot lock: {broken.name} does not apply on the pruned baseline: {broken.error}")
            pack_trees = [s.tree for s in pack_steps]
        entries = tuple(LockEntry(patch.name, patch.sha256, step.tree, pack_tree)
                        for patch, step, pack_tree in zip(patches, steps, pack_trees))
        return ChainLock(base_tree=self.pin.tree, pack_base_tree=pack_base, patches=entries)

    def _lock_pruned(self, patches: list[Patch], steps: list[StepResult]) -> ChainLock:
        """On a pruned tree full tree ids cannot be computed: only the locked chain, unchanged, relocks."""
        old = self.chain_lock()
        if old is None or [(e.name, e.sha256) for e in old.patches] != [(p.name, p.sha256) for p in patches]:
            raise BadInput("cannot lock a changed chain on a pruned vendored tree: its full tree ids are unknown",
                           hint="fetch the full tree (polyforge vendor fetch --force), then lock")
        entries = tuple(LockEntry(e.name, e.sha256, e.tree, step.tree) for e, step in zip(old.patches, steps))
        return ChainLock(base_tree=self.pin.tree, pack_base_tree=self.tree.baseline_tree(), patches=entries)


def _split_message(message: str | None, slug: str) -> tuple[str, str, list[str]]:
    """(subject, description, trailers) of a -m/-F message; without one, the slug is the subject."""
    if message is None:
        return slug.replace("-", " "), "", []
    return patchfile.parse_message(message)


def _message_body(description: str, *trailer_groups: list[str]) -> str:
    """The description and the trailers merged, oldest group first; Upstream-Status defaults to Pending."""
    trailers = patchfile.merge_trailers(*trailer_groups)
    if not any(line.startswith("Upstream-Status: ") for line in trailers):
        trailers.append("Upstream-Status: Pending")
    return patchfile.compose_body(description, trailers)
