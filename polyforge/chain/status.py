"""`polyforge status`: the vendored tree against the pin and the chain, read under the shared
project lock (a reader never sees a tree half moved), as one typed answer."""

from __future__ import annotations

from dataclasses import dataclass, field

from polyforge.chain import rebase as rebase_lib, transaction
from polyforge.upstream import vendor as vendor_lib
from polyforge.chain.engine import Chain
from polyforge.errors import BadInput


@dataclass
class GitLocks:
    """Git lock files in the vendored repository (see VendoredTree.leftover_locks)."""
    removable: list[str]  # a dead polyforge run's: the next command removes them
    blocking: list[str]  # anyone else's: the next command stops on them

    def as_dict(self) -> dict:
        return {"removable": self.removable, "blocking": self.blocking}


@dataclass
class ChainStatus:
    vendor: dict  # vendor.status(chain): pin, vendored, baseline_tree, baseline_ok, pruned, source, detail, ok
    patches: list[str]  # the chain in patches/, in order
    lock_drift: list[str]  # how patches/ differs from chain.lock
    interrupted: str | None  # the op of a journalled move the next command rolls back
    journal_problem: str | None  # why that rollback would be refused
    rebasing: bool = False  # a rebase is in progress (vendor/rebase/): only rebase runs until it ends
    rebase: dict | None = None  # rebase.describe: its stage and what it needs next
    # the rest only with a vendored tree:
    applied: list[str] = field(default_factory=list)
    unapplied: list[str] = field(default_factory=list)
    live_edits: list[dict] = field(default_factory=list)  # {"status": "M", "path": ...} beyond the chain
    applied_changed: list[str] = field(default_factory=list)  # applied, and the file changed since
    applied_missing: list[str] = field(default_factory=list)  # applied, and no longer in patches/
    chain_mismatch: list[str] = field(default_factory=list)  # applied commits that are not the chain's prefix
    git_locks: GitLocks = field(default_factory=lambda: GitLocks([], []))

    @property
    def vendored(self) -> bool:
        return bool(self.vendor.get("vendored"))

    @property
    def ok(self) -> bool:
        return (bool(self.vendor.get("baseline_ok")) and not self.lock_drift and not self.chain_mismatch
                and not self.journal_problem and not self.git_locks.blocking  # the next command stops on those
                and not self.rebasing)

    def as_dict(self) -> dict:
        """--json: vendor status's keys, then the chain's; the tree's keys only when vendored."""
        out = dict(self.vendor)
        out.update(patches=self.patches, lock_drift=self.lock_drift, interrupted=self.interrupted,
                   journal_problem=self.journal_problem, rebasing=self.rebasing, rebase=self.rebase)
        if self.vendored:
            out.update(applied=self.applied, unapplied=self.unapplied, live_edits=self.live_edits,
                       applied_changed=self.applied_changed, applied_missing=self.applied_missing,
                       chain_mismatch=self.chain_mismatch)
        out["ok"] = self.ok
        if self.vendored:
            out["git_locks"] = self.git_locks.as_dict()
        return out


def read(chain: Chain) -> ChainStatus:
    """The status, read holding the project lock shared."""
    with chain.shared() as lock:
        vendor = vendor_lib.status(chain, rebase_lib.describe(chain.project))
        patches = chain.patches()
        drift = chain.lock_drift(patches)
        tree = chain.tree
        journal = tree.pending_journal() if tree.exists() else None
        journal_problem = None
        if journal is not None:
            try:
                tree.check_journal(journal)  # what the next command's recovery would refuse
            except BadInput as exc:
                journal_problem = exc.message
        interrupted = journal.op if journal else transaction.pending(chain.project)
        status = ChainStatus(vendor, [p.name for p in patches], drift, interrupted, journal_problem,
                             rebasing=chain.project.rebase_dir.exists(), rebase=vendor["rebase"])
        if tree.exists():
            applied = tree.applied()
            names = {p.name: p for p in patches}
            status.applied = [a.name for a in applied]
            status.unapplied = [p.name for p in patches if p.name not in status.applied]
            status.live_edits = [{"status": s, "path": p} for s, p in chain.live_changes()]
            status.applied_changed = [a.name for a in applied if a.name in names and names[a.name].sha256 != a.sha256]
            status.applied_missing = [a.name for a in applied if a.name not in names]
            status.chain_mismatch = chain.applied_mismatch(applied, patches)
            status.git_locks = GitLocks(*tree.leftover_locks(lock.dead_holder))
    return status
