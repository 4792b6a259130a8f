"""`polyforge verify-patches`: the proof of the chain, computed on fresh copies (scratch git
indexes over the vendored repository's objects), never touching the live tree.

  a. every prefix of the chain applies exactly onto a fresh baseline, in lexical order;
  b. forward: the whole chain on a fresh baseline reproduces the live tree byte for byte;
  c. reverse: every patch reverse-applies clean from live, in reverse order, reaching the
     baseline byte for byte;
  d. each step's tree id equals chain.lock's; on a full tree, so do the pruned baseline and
     the trees the chain reaches on it (what a pruned pack's proof relies on);
  e. every patch is in canonical form (as `refresh --check`);
  f. when lexical order fails but another order applies, the patch to renumber is named.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

from polyforge.chain import patchfile
from polyforge.chain.engine import Chain, apply_in_index, chain_paths, find_misnumbered, run_chain
from polyforge.git import Git, prune_tree, scratch_index
from polyforge.chain.patchfile import Patch
from polyforge.tree_identity import EXCLUDED_PATHS


@dataclass
class TreeComparison:
    identical: bool
    differing: list[str] = field(default_factory=list)
    only_live: list[str] = field(default_factory=list)
    only_fresh: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"identical": self.identical, "differing": len(self.differing), "only_live": len(self.only_live),
                "only_fresh": len(self.only_fresh),
                "files": {"differing": self.differing[:50], "only_live": self.only_live[:50],
                          "only_fresh": self.only_fresh[:50]}}


@dataclass
class PatchProof:
    name: str
    sha256: str
    tree: str | None = None
    forward: bool = False  # applies exactly in lexical order onto its prefix
    reverse: bool = False  # reverse-applies clean in the reverse walk from live
    lock: bool = False  # tree id equals chain.lock
    canonical: bool = False
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Proof:
    base_tree: str
    live_tree: str
    patches: list[PatchProof]
    forward: TreeComparison
    reverse: TreeComparison
    problems: list[str]
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (not self.problems and self.forward.identical and self.reverse.identical
                and all(p.forward and p.reverse and p.lock and p.canonical for p in self.patches))

    def as_dict(self) -> dict:
        return {"ok": self.ok, "base_tree": self.base_tree, "live_tree": self.live_tree,
                "excluded_paths": list(EXCLUDED_PATHS),
                "patches": [p.as_dict() for p in self.patches], "forward": self.forward.as_dict(),
                "reverse": self.reverse.as_dict(), "problems": self.problems, "seconds": round(self.seconds, 3)}


def compare_trees(git: Git, live: str, fresh: str) -> TreeComparison:
    if live == fresh:
        return TreeComparison(True)
    result = TreeComparison(False)
    for status, path in git.diff_names(fresh, live):
        {"A": result.only_live, "D": result.only_fresh}.get(status, result.differing).append(path)
    return result


def verify(chain: Chain) -> Proof:
    started = time.monotonic()
    tree = chain.tree
    tree.require()
    git = tree.git
    patches: list[Patch] = chain.patches()
    lock = chain.chain_lock()
    problems: list[str] = [f"lock: {d}" for d in chain.lock_drift(patches)]
    base = tree.baseline_tree()
    if base != chain.expected_base():
        problems.append(f"baseline {base} is not the pinned tree {chain.expected_base()}")
    live = tree.snapshot()
    proofs = [PatchProof(p.name, p.sha256) for p in patches]

    # a, d, e: forward in lexical order from a fresh baseline, one prefix at a time
    trees = [base]
    with scratch_index(git, base) as index:
        for i, (patch, proof) in enumerate(zip(patches, proofs)):
            step = apply_in_index(index, patch)
            if not step.ok:
                proof.problems.append(f"does not apply onto the prefix before it: {step.error}")
                problems.append(f"{patch.name}: prefix {i + 1} does not apply")
                hint = find_misnumbered(git, base, patches, i)
                if hint:
                    problems.append(hint if hint.startswith("no order") else f"misnumbered: {hint}")
                break
            proof.forward, proof.tree = True, step.tree
            trees.append(step.tree)
            expected = chain.locked_tree(lock.entry(patch.name)) if lock else None
            proof.lock = expected == step.tree
            if not proof.lock:
                proof.problems.append(f"tree {step.tree} differs from chain.lock's {expected}")
            proof.canonical = patchfile.canonical(patch, git, trees[-2], step.tree) == patch.data
            if not proof.canonical:
                proof.problems.append("not canonical: polyforge refresh would rewrite it")
    if all(p.forward for p in proofs) and lock is not None and not chain.pruned and chain.pin.pack_prune:
        problems.extend(_check_pack_trees(chain, git, base, patches, proofs))
    first_divergent = next((p.name for p in proofs if p.forward and not p.lock), None)
    if first_divergent:
        problems.append(f"chain.lock: first divergent patch is {first_divergent}")
    all_forward = len(trees) == len(patches) + 1
    forward = compare_trees(git, live, trees[-1]) if all_forward else TreeComparison(False)

    # c: reverse, from a copy of live, last patch first
    with scratch_index(git, live) as index:
        reached = True
        for patch, proof in zip(reversed(patches), reversed(proofs)):
            step = apply_in_index(index, patch, reverse=True)
            proof.reverse = step.ok
            if not step.ok:
                proof.problems.append(f"does not reverse-apply against live: {step.error}")
                reached = False
                break
        reverse = compare_trees(git, index.write_tree(), base) if reached else TreeComparison(False)
    if not reverse.identical and reached:
        problems.append("reversing the chain from live does not reach the baseline")
    if not forward.identical and all_forward:
        problems.append("the chain on a fresh baseline does not reproduce the live tree")
    return Proof(base, live, proofs, forward, reverse, problems, time.monotonic() - started)


def _check_pack_trees(chain: Chain, git: Git, base: str, patches: list[Patch], proofs: list[PatchProof]) -> list[str]:
    """chain.lock's pruned ids against the trees applying on the pruned baseline really reaches."""
    lock = chain.chain_lock()
    assert lock is not None
    problems = []
    pack_base = prune_tree(git, base, chain.pin.pack_prune, chain_paths(patches))
    if lock.pack_base_tree != pack_base:
        problems.append(f"lock: pack_base_tree {lock.pack_base_tree} is not the pruned baseline this chain needs ({pack_base})")
    steps = run_chain(git, pack_base, patches)
    for patch, proof, step in zip(patches, proofs, steps):
        entry = lock.entry(patch.name)
        claimed = entry.pack_tree if entry else None
        if step.ok and claimed != step.tree:
            proof.lock = False
            proof.problems.append(f"pack_tree {claimed} differs from the pruned tree {step.tree}")
            problems.append(f"{patch.name}: chain.lock's pack_tree {claimed} is not the tree applying on the pruned baseline reaches ({step.tree})")
    return problems


def junit(proof: Proof) -> str:
    """One test case per patch and check, plus the two whole-tree comparisons."""
    cases = []
    for p in proof.patches:
        for check in ("forward", "reverse", "lock", "canonical"):
            ok = getattr(p, check)
            body = "" if ok else f"<failure message={quoteattr('; '.join(p.problems) or check)}/>"
            cases.append(f'  <testcase classname="verify-patches.{escape(p.name)}" name="{check}">{body}</testcase>')
    for name, comparison in (("forward-identical", proof.forward), ("reverse-identical", proof.reverse)):
        d = comparison.as_dict()
        msg = f"differing {d['differing']}, only_live {d['only_live']}, only_fresh {d['only_fresh']}"
        body = "" if comparison.identical else f"<failure message={quoteattr(msg)}/>"
        cases.append(f'  <testcase classname="verify-patches" name="{name}">{body}</testcase>')
    for problem in proof.problems:
        if problem.startswith(("lock:", "baseline")):
            cases.append(f'  <testcase classname="verify-patches" name="pin-and-lock"><failure message={quoteattr(problem)}/></testcase>')
    failures = sum("<failure" in c for c in cases)
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuite name="polyforge verify-patches" '
            f'tests="{len(cases)}" failures="{failures}" time="{proof.seconds:.3f}">\n' + "\n".join(cases) + "\n</testsuite>\n")
