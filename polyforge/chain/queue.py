"""The verbs that reshape the chain without changing what it builds: fold, move, rename.

Each one computes the whole new chain first, in scratch indexes, and proves it before writing
a byte: every patch applies exactly from the baseline, and the chain's final tree is the old
one (fold: the folded patch ends on the tree of the last patch it replaces; move: the
patches it passes over still apply, re-rendered where their hunks moved). Then patches/,
chain.lock and the vendored repository's applied commits change together, through a
journalled transaction (transaction.py) that a kill leaves undoable. The live files of the
vendored tree never change: the applied patches keep their trees, only their commits are
re-recorded under the new names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polyforge.chain import patchfile, transaction
from polyforge.chain.engine import Chain, _message_body, apply_in_index, run_chain, select, three_way
from polyforge.chain.patchfile import Patch
from polyforge.errors import BadInput, VerificationFailed
from polyforge.git import scratch_index
from polyforge.upstream.vendored_tree import BRANCH


@dataclass
class Rewritten:
    """A new chain and how it came from the old one."""

    patches: list[Patch]
    statuses: dict[str, str]  # new name -> how it was carried (folded, exact, offsets, three-way, renamed)
    applied: int  # how many of the new patches the live tree has applied

    def as_dict(self) -> dict:
        return {"patches": [{"name": p.name, "sha256": p.sha256, "status": self.statuses.get(p.name, "unchanged")}
                            for p in self.patches], "applied": self.applied}


def _index(patches: list[Patch], name: str, what: str) -> int:
    count = select(patches, name)
    if count == 0:
        raise BadInput(f"{what} {name}: names the baseline, not a patch")
    return count - 1


def _check_new_name(patches: list[Patch], name: str, before: int, after: int, what: str) -> str:
    """`name` as a patch file name that sorts after patches[before] and before patches[after]."""
    file_name = patchfile.check_name(name if name.endswith(".patch") else f"{name}.patch")
    low = patches[before].name if before >= 0 else None
    high = patches[after].name if after < len(patches) else None
    if (low and file_name.encode() <= low.encode()) or (high and file_name.encode() >= high.encode()):
        bounds = f"after {low}" if low else ""
        bounds += (" and " if low and high else "") + (f"before {high}" if high else "")
        raise BadInput(f"{what} {file_name} would not stay in place: it must sort {bounds}")
    return file_name


def _reparse(name: str, data: bytes, chain: Chain) -> Patch:
    return patchfile.parse(data, name, chain.project.patches_dir / name)


def _author_header(header: patchfile.Header, author: str | None) -> patchfile.Header:
    if author is None:
        return header
    patchfile.check_author(author, "--author")
    return replace(header, author=author)


def fold(chain: Chain, first: str, last: str, into: str, message: str | None = None,
         author: str | None = None) -> Rewritten:
    """Fold the contiguous run first..last into one patch named `into`."""
    patches = chain.patches()
    i, j = _index(patches, first, "fold"), _index(patches, last, "fold")
    if j <= i:
        raise BadInput(f"fold {first}..{last}: give the run's first patch, then a later one")
    name = _check_new_name(patches, into, i - 1, j + 1, "--into")
    chain.require_no_drift(patches)
    steps = chain.steps_from_baseline(patches, "cannot fold")
    before = steps[i - 1].tree if i else chain.tree.baseline_tree()
    after = steps[j].tree
    run = patches[i:j + 1]
    head = run[0].header
    if message is None:
        subject = head.subject
        description = "\n\n".join(p.header.description() for p in run if p.header.description())
        extra: list[str] = []
    else:
        subject, description, extra = patchfile.parse_message(message)
    body = _message_body(description, *(p.header.trailers() for p in run), extra)
    header = _author_header(replace(head, subject=subject, body=body), author)
    data = patchfile.render(header.canonical(), patchfile.generate_diff(chain.tree.git, before, after))
    folded = _reparse(name, data, chain)
    with scratch_index(chain.tree.git, before) as index:
        step = apply_in_index(index, folded)
    if not step.ok or step.tree != after:  # pragma: no cover - a diff between two trees reapplies to the second
        raise VerificationFailed(f"the folded {name} does not reach {run[-1].name}'s tree {after[:12]}")
    new = [*patches[:i], folded, *patches[j + 1:]]
    applied = len(chain.applied_prefix(patches))
    if i < applied <= j:
        raise BadInput(f"the live tree has {patches[applied - 1].name} applied, inside the run to fold",
                       hint=f"apply through {run[-1].name} or unapply below {run[0].name} first")
    new_applied = applied if applied <= i else applied - (j - i)
    statuses = {name: f"folded {len(run)} patches ({run[0].name} .. {run[-1].name})"}
    return _commit(chain, patches, new, new_applied, statuses, f"fold into {name}")


def move(chain: Chain, name: str, after: str) -> Rewritten:
    """Move one patch to just after another ('base': to the front). The positions it passes keep
    their numbers: the patches in between are renumbered, the moved one takes the free slot."""
    patches = chain.patches()
    x = _index(patches, name, "move")
    y = select(patches, after) - 1  # -1: the front
    if y == x or y == x - 1:
        raise BadInput(f"{patches[x].name} is already right after {patches[y].name if y >= 0 else 'the baseline'}")
    chain.require_no_drift(patches)
    steps = chain.steps_from_baseline(patches, "cannot move")
    trees = [chain.tree.baseline_tree(), *[s.tree for s in steps]]
    order = [k for k in range(len(patches)) if k != x]
    order.insert(order.index(y) + 1 if y >= 0 else 0, x)
    lo = next(k for k in range(len(order)) if order[k] != k)
    hi = max(k for k in range(len(order)) if order[k] != k)
    applied = len(chain.applied_prefix(patches))
    if lo < applied <= hi:
        raise BadInput(f"the live tree has {patches[applied - 1].name} applied, among the patches the move reorders",
                       hint=f"apply through {patches[hi].name} or unapply below {patches[lo].name} first")
    git = chain.tree.git
    tree = trees[lo]
    new = list(patches)
    statuses: dict[str, str] = {}
    for slot in range(lo, hi + 1):
        k = order[slot]
        patch = patches[k]
        with scratch_index(git, tree) as index:
            step = apply_in_index(index, patch, allow_offset=True)
        if step.ok:
            status, after_tree = ("offsets" if step.offsets else "exact"), step.tree
        else:
            after_tree, conflicts = three_way(git, trees[k], trees[k + 1], tree)
            if conflicts:
                raise VerificationFailed(f"cannot move {patches[x].name}: {patch.name} conflicts in "
                                         f"{', '.join(conflicts)} in the new order; nothing was written")
            status = "three-way"
        assert after_tree
        slot_name = f"{patches[slot].number}-{patch.slug}.patch"
        data = patchfile.canonical(patch, git, tree, after_tree)
        new[slot] = _reparse(slot_name, data, chain)
        statuses[slot_name] = status + (f" (was {patch.name})" if slot_name != patch.name else "")
        tree = after_tree
    if tree != trees[hi + 1]:
        raise VerificationFailed(f"cannot move {patches[x].name}: in the new order the chain reaches tree {tree[:12]} "
                                 f"after {hi - lo + 1} patches where it reached {trees[hi + 1][:12]}; nothing was written",
                                 hint="the patches it passes over change the same lines: fold them instead")
    names = [p.name for p in new]
    if len(set(names)) != len(names):
        raise BadInput("the move would give two patches the same name; rename one first")
    return _commit(chain, patches, new, applied, statuses, f"move {patches[x].name}")


def rename(chain: Chain, old: str, new_name: str) -> Rewritten:
    """Give a patch another NNNN-slug name that keeps its place in the lexical order."""
    patches = chain.patches()
    i = _index(patches, old, "rename")
    name = _check_new_name(patches, new_name, i - 1, i + 1, "rename to")
    if name == patches[i].name:
        raise BadInput(f"{name} is its name already")
    chain.require_no_drift(patches)
    new = list(patches)
    new[i] = _reparse(name, patches[i].data, chain)
    applied = len(chain.applied_prefix(patches))
    return _commit(chain, patches, new, applied, {name: f"renamed from {patches[i].name}"}, f"rename {patches[i].name}")


def _bytes_of(patches: list[Patch], name: str) -> bytes | None:
    return next((p.data for p in patches if p.name == name), None)


def _commit(chain: Chain, old: list[Patch], new: list[Patch], applied: int, statuses: dict[str, str],
            what: str) -> Rewritten:
    """Prove the new chain (it applies exactly and ends on the old final tree), then write it,
    its lock and the re-recorded applied commits as one transaction."""
    steps = run_chain(chain.tree.git, chain.tree.baseline_tree(), new)
    failed = next((s for s in steps if not s.ok), None)
    if failed is not None:
        raise VerificationFailed(f"{what}: {failed.name} does not apply exactly in the new chain: {failed.error}; "
                                 "nothing was written")
    before = chain.chain_lock()  # free of drift: every verb checked it first
    final = before.patches[-1].tree if before and before.patches and not chain.pruned else None
    if final is not None and steps[-1].tree != final:  # pragma: no cover - each verb proves its own part
        raise VerificationFailed(f"{what}: the new chain ends on {steps[-1].tree[:12]}, not {final[:12]}")
    lock = chain.lock_for(new)
    tree = chain.tree
    commit = tree.baseline_commit()
    for patch, step in zip(new[:applied], steps[:applied]):
        commit = tree.patch_commit(commit, step.tree, patch.name, patch.sha256)
    if applied and tree.git.tree_of(commit) != tree.head_tree():  # pragma: no cover - guarded by the verbs
        raise VerificationFailed(f"{what}: the re-recorded commits do not end on the live tree's")
    patches_rel = chain.project.patches_dir.relative_to(chain.project.root).as_posix()
    # old files the new chain lacks are deleted; new or changed ones written; the same bytes left alone
    writes: dict[str, bytes | None] = {f"{patches_rel}/{p.name}": None for p in old}
    unchanged = {p.name for p in old} & {p.name for p in new if p.data == _bytes_of(old, p.name)}
    writes.update({f"{patches_rel}/{p.name}": p.data for p in new if p.name not in unchanged})
    for name in unchanged:
        del writes[f"{patches_rel}/{name}"]
    writes[chain.project.chain_lock_file.relative_to(chain.project.root).as_posix()] = lock.render().encode()
    branch = (tree.git, BRANCH, commit) if commit != tree.head() else None
    transaction.Transaction(chain.project, what, writes, branch).commit()
    tree.sync_index()
    return Rewritten(new, statuses, applied)
