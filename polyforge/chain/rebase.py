"""`polyforge rebase`: carry the chain onto another upstream tree, each patch classified and
reviewed; and `polyforge upstream check`, the dry run over several trees (a CI canary).

The new tree's files are imported once into the baseline cache (vendor.py's, keyed by tree id;
a source whose spelling always gives the same files is also remembered by spelling, so a second
dry run downloads and hashes nothing). Replaying happens in a work repository that borrows the
objects of the vendored repository and of the cache (git alternates): every tree of the old
chain is there for three-way merges, and a dry run writes nothing into the project.

Each patch, in lexical order, onto the new tree so far:

  exact            `git apply` places every hunk where the patch says
  offsets          `git apply` places some hunks elsewhere (the patch is re-rendered)
  three-way        `git apply` fails; a three-way merge of the patch's own before and after trees
                   into the new tree (`git merge-tree`, rename-aware) is clean
  partly-upstream  clean, and upstream already has some of the lines the patch adds
  upstream         the merge adds nothing: upstream has the whole change; the patch is dropped
  conflict         the merge conflicts: the rebase stops with the markers in the live tree
  resolved         a conflict resolved by hand (`--continue`)
  skipped          dropped by `--skip`
  pending          not replayed yet: the rebase stopped at an earlier conflict

A dry run goes past a conflict: the later patches are replayed as if the conflicting one were
skipped, and say so (a forecast: a patch that builds on the conflicting one conflicts too).

Every replayed patch is re-rendered canonically between its new trees (header, author, date and
trailers kept) and reviewed (review.py: hunks far from their old place or in look-alike
context, functions upstream also changed, names the new tree no longer has, the interdiff).

A rebase in progress lives in vendor/rebase/: journal.json, the replayed patches so far, and
previous/ (pin.yaml, patches/ and the old vendored repository, moved aside whole), so --abort
puts every byte back. Other chain commands refuse to run meanwhile. On success: pin.yaml names
the new tree, patches/ and chain.lock follow, and vendor/pin-history.yaml records the old pin
with each patch's classification.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import yaml

from polyforge.chain import patchfile
from polyforge.chain.engine import Chain, apply_in_index, prune_tree
from polyforge.chain.patchfile import Patch
from polyforge.errors import BadInput, VerificationFailed
from polyforge.filelock import FileLock
from polyforge.git import Git, GitFailed, scratch_index
from polyforge.project import Project, cache_dir
from polyforge import tree_identity
from polyforge.textfile import write_text_atomic
from polyforge.chain import review as review_lib
from polyforge.upstream.pin import Pin, render_pin
from polyforge.upstream.source import Git as GitSource, SourceKind, source_from_argument
from polyforge.upstream.vendor import baseline_objects, store_baseline_objects
from polyforge.upstream.vendored_tree import BASELINE_TAG, BRANCH, VendoredTree

STATUSES = ("exact", "offsets", "three-way", "partly-upstream", "upstream", "conflict", "resolved",
            "skipped", "pending")
DROPPED = ("upstream", "skipped")
_MARKER = re.compile(rb"^(<{7} |>{7} |={7}$)", re.M)
Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass
class Outcome:
    """What happened to one patch."""

    name: str
    status: str
    detail: str = ""
    conflicts: list[str] = field(default_factory=list)
    findings: list[review_lib.Finding] = field(default_factory=list)
    tree: str | None = None  # the tree after it on the new upstream

    def as_dict(self) -> dict:
        out = {"name": self.name, "status": self.status, "detail": self.detail}
        if self.conflicts:
            out["conflicts"] = self.conflicts
        out["review"] = [f.as_dict() for f in self.findings]
        if self.tree:
            out["tree"] = self.tree
        return out

    @staticmethod
    def from_dict(raw: dict) -> "Outcome":
        return Outcome(raw["name"], raw["status"], raw.get("detail", ""), list(raw.get("conflicts", [])),
                       [review_lib.Finding(**f) for f in raw.get("review", [])], raw.get("tree"))


@dataclass
class Report:
    onto: str
    old_tree: str
    new_tree: str
    outcomes: list[Outcome]
    dry_run: bool
    seconds: float = 0.0
    done: bool = False  # the rebase finished: pin, patches and lock moved

    @property
    def first_conflict(self) -> Outcome | None:
        return next((o for o in self.outcomes if o.status == "conflict"), None)

    @property
    def clean(self) -> bool:
        return self.first_conflict is None and all(o.status != "pending" for o in self.outcomes)

    def as_dict(self) -> dict:
        conflict = self.first_conflict
        return {"onto": self.onto, "old_tree": self.old_tree, "new_tree": self.new_tree, "dry_run": self.dry_run,
                "clean": self.clean, "done": self.done, "first_conflict": conflict.name if conflict else None,
                "seconds": round(self.seconds, 2), "patches": [o.as_dict() for o in self.outcomes]}


# -- the new tree --------------------------------------------------------------------------------
def _remembered_path() -> Path:
    return cache_dir() / "rebase-sources.json"


def _remembered() -> dict[str, str]:
    """Source spelling -> tree id, for sources whose spelling always yields the same files."""
    try:
        return json.loads(_remembered_path().read_text())
    except (OSError, ValueError):
        return {}


def source_tree(source: SourceKind, log: Log = _quiet) -> str:
    """The tree id of a source's files, with its objects in the baseline cache."""
    key = source.spelling if source.immutable else None
    with FileLock(cache_dir() / "baselines.lock", "baseline cache", blocking=True):
        tree = _remembered().get(key) if key else None
    if tree and baseline_objects(tree) is not None:
        return tree
    log(f"fetching {source.spelling}")
    incoming = Path(tempfile.mkdtemp(prefix="polyforge-rebase-source-", dir=_work_root()))
    try:
        source.materialize(cache_dir(), incoming)
        fresh = VendoredTree.initialise(incoming)
        tree = fresh.snapshot()
        store_baseline_objects(fresh, tree)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)
    if key:
        with FileLock(cache_dir() / "baselines.lock", "baseline cache", blocking=True):
            write_text_atomic(_remembered_path(), json.dumps({**_remembered(), key: tree}, indent=2, sort_keys=True) + "\n")
    return tree


def _new_tree_objects(tree: str) -> Path:
    """The object store source_tree left the new tree in."""
    objects = baseline_objects(tree)
    if objects is None:
        raise VerificationFailed(f"the baseline cache lost tree {tree[:12]}", hint="run the rebase again")
    return objects


def _work_root() -> Path:
    root = cache_dir() / "rebase-work"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _borrow(repo_git_dir: Path, *object_dirs: Path) -> None:
    """Let a repository read other repositories' objects (git alternates)."""
    info = repo_git_dir / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "alternates").write_text("".join(f"{d.resolve()}\n" for d in object_dirs))


@contextmanager
def _work_repo(*object_dirs: Path) -> Iterator[Git]:
    """A throw-away bare repository that reads the given object stores."""
    path = Path(tempfile.mkdtemp(prefix="polyforge-rebase-", dir=_work_root()))
    try:
        git = Git(path)
        git.run("init", "-q", "--bare")
        _borrow(path, *object_dirs)
        yield git
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- one patch ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trees:
    """The trees one patch goes between: on the old upstream (old_pre -> old_post) and the new
    tree so far (new_pre); old_base and new_base are the two upstream trees."""

    old_base: str
    new_base: str
    old_pre: str
    old_post: str
    new_pre: str


def _merge(git: Git, trees: Trees, patch_label: str, upstream_label: str) -> tuple[str, list[str]]:
    """Three-way merge of the patch's own change into the new tree: (tree, conflicted paths).
    The tree holds conflict markers where there are conflicts, labelled with the two names."""
    base = git.commit_tree(trees.old_pre, "patch base")
    ours = git.commit_tree(trees.new_pre, upstream_label, base)
    theirs = git.commit_tree(trees.old_post, patch_label, base)
    # merge-tree labels the markers with the names it is given: give it branch names
    refs = {f"refs/heads/{upstream_label}": ours, f"refs/heads/{patch_label}": theirs}
    for ref, commit in refs.items():
        git.run("update-ref", ref, commit)
    try:
        status, out, err = git.run_full("merge-tree", "--write-tree", "-z", "--name-only", "--no-messages",
                                        upstream_label, patch_label, check=False)
    finally:
        for ref in refs:
            git.run("update-ref", "-d", ref, check=False)
    if status not in (0, 1):
        raise GitFailed(("merge-tree",), status, err)
    fields = out.split("\0")
    return fields[0], sorted({f for f in fields[1:] if f})


def _already_upstream(git: Git, trees: Trees, new_post: str) -> int:
    """How many lines the patch adds on the old upstream that its replay no longer adds because
    the new tree has them already (a change partly made upstream)."""
    old = review_lib.added_lines(git, trees.old_pre, trees.old_post)
    new = review_lib.added_lines(git, trees.new_pre, new_post)
    count = 0
    for path, lines in old.items():
        missing = list(lines)
        for line in new.get(path, []):
            if line in missing:
                missing.remove(line)
        missing = [ln for ln in missing if ln.strip()]
        if not missing:
            continue
        status, text, _ = git.run_full("cat-file", "-p", f"{trees.new_pre}:{path}", check=False, strip=False)
        have = set(text.splitlines()) if status == 0 else set()
        count += sum(1 for ln in missing if ln in have)
    return count


def replay_patch(git: Git, patch: Patch, trees: Trees, upstream_label: str) -> tuple[Outcome, str | None]:
    """Replay one patch onto trees.new_pre: (outcome, the merged tree when it conflicts)."""
    with scratch_index(git, trees.new_pre) as index:
        step = apply_in_index(index, patch, allow_offset=True)
    if step.ok:
        assert step.tree
        status = "offsets" if step.offsets else "exact"
        return Outcome(patch.name, status, "; ".join(step.offsets), tree=step.tree), None
    merged, conflicts = _merge(git, trees, patch.name[:-len(".patch")], upstream_label)
    if conflicts:
        return Outcome(patch.name, "conflict", f"conflicts in {len(conflicts)} file(s): {', '.join(conflicts)}",
                       conflicts=conflicts), merged
    if merged == trees.new_pre:
        return Outcome(patch.name, "upstream", "the new tree has its whole change: dropped", tree=merged), None
    have = _already_upstream(git, trees, merged)
    if have:
        return Outcome(patch.name, "partly-upstream", f"{have} line(s) it adds are upstream already", tree=merged), None
    return Outcome(patch.name, "three-way", f"git apply: {step.error}", tree=merged), None


def _review(git: Git, outcome: Outcome, trees: Trees) -> None:
    if outcome.tree is None or outcome.status in DROPPED:
        return
    outcome.findings = review_lib.review_patch(
        git, old_base=trees.old_base, new_base=trees.new_base, old_pre=trees.old_pre, old_post=trees.old_post,
        new_pre=trees.new_pre, new_post=outcome.tree)


# -- the old chain ---------------------------------------------------------------------------------
def _old_trees(chain: Chain, patches: list[Patch]) -> list[str]:
    """The baseline and the tree after each patch on the old upstream."""
    steps = chain.steps_from_baseline(patches, "cannot rebase: the chain is broken on its own pin")
    return [chain.tree.baseline_tree(), *[s.tree for s in steps if s.tree]]


def _upstream_label(release: str | None) -> str:
    return "upstream-" + re.sub(r"[^A-Za-z0-9._-]", "-", release) if release else "upstream"


def dry_run(chain: Chain, onto: str, *, release: str | None = None, log: Log = _quiet) -> Report:
    """Replay the chain onto another tree without moving anything."""
    started = time.monotonic()
    chain.tree.require()
    source = _parse_onto(onto, chain)
    patches = chain.patches()
    old = _old_trees(chain, patches)
    new_base = source_tree(source, log)
    objects = _new_tree_objects(new_base)
    outcomes: list[Outcome] = []
    skipped: list[str] = []  # conflicting patches the forecast goes on without
    with _work_repo(chain.tree.path / ".git" / "objects", objects) as git:
        tree = new_base
        for i, patch in enumerate(patches):
            # the old chain's trees, less the change of every conflicting patch so far: later
            # patches then merge against what the new tree will have if those are skipped
            trees = Trees(old[0], new_base, old[i], old[i + 1], tree)
            outcome, _ = replay_patch(git, patch, trees, _upstream_label(release))
            _review(git, outcome, trees)
            if skipped:
                outcome.detail = (outcome.detail + " " if outcome.detail else "") + \
                    f"(forecast: with {', '.join(skipped)} left out)"
            outcomes.append(outcome)
            log(f"{patch.name}: {outcome.status}")
            if outcome.status == "conflict":
                skipped.append(patch.name)
            elif outcome.tree:
                tree = outcome.tree
    return Report(source.spelling, old[0], new_base, outcomes, True, time.monotonic() - started)


def _parse_onto(onto: str, chain: Chain) -> SourceKind:
    try:
        return source_from_argument(onto, chain.pin.sources)
    except BadInput as exc:
        raise BadInput(f"--onto {exc.message}") from None


# -- a rebase that moves the project ---------------------------------------------------------------
class Journal:
    """vendor/rebase/journal.json: what the rebase has done, enough to continue or abort."""

    def __init__(self, project: Project):
        self.dir = project.rebase_dir
        self.path = self.dir / "journal.json"
        self.previous = self.dir / "previous"
        self.patches_dir = self.dir / "patches"

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise BadInput(f"{self.path} is unreadable ({exc})",
                           hint=f"restore by hand from {self.previous}, then delete {self.dir}") from None

    def write(self, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        # insertion order kept: the pin entry is written back in its kind's key order
        write_text_atomic(self.path, json.dumps(state, indent=1) + "\n")


def in_progress(project: Project) -> bool:
    return Journal(project).exists() or (project.rebase_dir / "previous").exists()


def require_none_in_progress(project: Project) -> None:
    if in_progress(project):
        raise BadInput("a rebase is in progress",
                       hint="finish it: polyforge rebase --continue, --skip or --abort")


def start(chain: Chain, onto: str, *, release: str, commit: str | None = None, log: Log = _quiet) -> Report:
    """Move the chain onto another tree; stops at a conflict (then --continue/--skip/--abort)."""
    project = chain.project
    journal = Journal(project)
    require_none_in_progress(project)
    if commit is not None and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise BadInput(f"--commit {commit!r} is not a full 40-digit commit id")
    if not release or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", release):
        raise BadInput(f"--release {release!r}: give the new tree's release name, e.g. b11549")
    chain.tree.require()
    if chain.pruned:
        raise BadInput("the vendored tree is pruned (a pack): a rebase needs the full tree",
                       hint="polyforge vendor fetch --force, then rebase")
    patches = chain.patches()
    chain.require_no_drift(patches)
    chain.require_clean("rebase")
    source = _parse_onto(onto, chain)
    old = _old_trees(chain, patches)
    new_base = source_tree(source, log)
    if new_base == old[0]:
        raise BadInput(f"{source.spelling} is the pinned tree already ({new_base[:12]})")
    pin_entry = source.pin_entry()
    if isinstance(source, GitSource) and commit is None and source.immutable:
        commit = source.rev  # a full commit id
    state = {"onto": source.spelling, "release": release, "commit": commit, "pin_entry": pin_entry,
             "old_trees": old, "new_base": new_base, "patches": [p.name for p in patches],
             "outcomes": [], "started": time.strftime("%Y-%m-%d"), "merged": None}
    # everything the abort restores, before anything moves
    previous = journal.previous
    previous.mkdir(parents=True)
    shutil.copy2(project.pin_file, previous / "pin.yaml")
    shutil.copytree(project.patches_dir, previous / "patches", symlinks=True)
    journal.write(state)
    project.tree_dir.rename(previous / "llama.cpp")
    incoming = project.vendor_dir / f".rebase-incoming-{int(time.time() * 1000)}"
    incoming.mkdir()
    fresh = VendoredTree.initialise(incoming)
    _borrow(incoming / ".git", _new_tree_objects(new_base),
            previous / "llama.cpp" / ".git" / "objects")
    base_commit = fresh.git.commit_tree(new_base, f"llama.cpp {release} from {source.spelling}")
    fresh.git.run("update-ref", BRANCH, base_commit)
    fresh.git.run("symbolic-ref", "HEAD", BRANCH)
    fresh.git.run("tag", "-f", BASELINE_TAG, base_commit)
    incoming.rename(project.tree_dir)
    return _replay(chain, state, log)


def _load_patches(journal: Journal, names: list[str]) -> list[Patch]:
    return [patchfile.read(journal.previous / "patches" / name) for name in names]


def _replay(chain: Chain, state: dict, log: Log) -> Report:
    """Replay from the first patch without an outcome; a conflict stops with the live tree holding
    the markers; the end finishes the rebase."""
    project = chain.project
    journal = Journal(project)
    tree = VendoredTree(project.tree_dir)
    git = tree.git
    patches = _load_patches(journal, state["patches"])
    old = state["old_trees"]
    outcomes = [Outcome.from_dict(o) for o in state["outcomes"]]
    head = tree.head()
    new_tree = tree.head_tree()
    for i in range(len(outcomes), len(patches)):
        patch = patches[i]
        trees = Trees(old[0], state["new_base"], old[i], old[i + 1], new_tree)
        outcome, merged = replay_patch(git, patch, trees, _upstream_label(state["release"]))
        log(f"{patch.name}: {outcome.status}")
        if outcome.status == "conflict":
            assert merged is not None
            state["merged"] = merged
            state["conflict"] = outcome.as_dict()
            journal.write(state)
            _checkout(tree, head, merged)
            return _report(state, outcomes + [outcome], dry_run=False)
        _review(git, outcome, trees)
        head, new_tree = _commit_patch(tree, journal, patch, head, trees, outcome)
        outcomes.append(outcome)
        state["outcomes"] = [o.as_dict() for o in outcomes]
        journal.write(state)
    return _finish(chain, state, outcomes, log)


def _commit_patch(tree: VendoredTree, journal: Journal, patch: Patch, head: str, trees: Trees,
                  outcome: Outcome) -> tuple[str, str]:
    """Record a replayed patch: its canonical bytes between its new trees, and its commit."""
    if outcome.status in DROPPED:
        return head, trees.new_pre
    assert outcome.tree
    data = patchfile.canonical(patch, tree.git, trees.new_pre, outcome.tree)
    journal.patches_dir.mkdir(parents=True, exist_ok=True)
    (journal.patches_dir / patch.name).write_bytes(data)
    commit = tree.patch_commit(head, outcome.tree, patch.name, patchfile.sha256_bytes(data))
    tree.git.run("update-ref", BRANCH, commit)
    return commit, outcome.tree


def _checkout(tree: VendoredTree, head: str, worktree_tree: str) -> None:
    """Put worktree_tree's files in the live tree, with HEAD (and the index) at `head`."""
    git = tree.git
    git.run("update-ref", BRANCH, head)
    with scratch_index(git, worktree_tree) as index:
        index.run("checkout-index", "-a", "-f")
    _remove_extra_files(tree, worktree_tree)
    git.run("read-tree", head)
    git.run("update-index", "-q", "--refresh", check=False)


def _remove_extra_files(tree: VendoredTree, wanted: str) -> None:
    """Delete live files that `wanted` does not have (a file an earlier checkout wrote)."""
    listed = set(tree.git.run("ls-tree", "-r", "-z", "--name-only", wanted, strip=False).split("\0"))
    for rel in tree_identity.counted_files(tree.path):  # build outputs and .git are never content
        if rel not in listed:
            os.unlink(os.path.join(tree.path, rel))


def _report(state: dict, outcomes: list[Outcome], *, dry_run: bool, done: bool = False) -> Report:
    names = [o.name for o in outcomes]
    pending = [Outcome(n, "pending", "after a conflict") for n in state["patches"] if n not in names]
    return Report(state["onto"], state["old_trees"][0], state["new_base"], outcomes + pending, dry_run, done=done)


def resume(chain: Chain, action: str, log: Log = _quiet) -> Report:
    """--continue (capture the resolved conflict), --skip (drop it) or --abort."""
    project = chain.project
    journal = Journal(project)
    if not in_progress(project):
        raise BadInput("no rebase is in progress")
    if action == "abort":
        return abort(chain)
    state = journal.read()
    conflict = state.get("conflict")
    tree = VendoredTree(project.tree_dir)
    outcomes = [Outcome.from_dict(o) for o in state["outcomes"]]
    if conflict is None:  # cut short between patches, or while finishing: carry on
        return _replay(chain, state, log)
    i = len(outcomes)
    patch = _load_patches(journal, state["patches"])[i]
    old = state["old_trees"]
    head = tree.head()
    trees = Trees(old[0], state["new_base"], old[i], old[i + 1], tree.head_tree())
    if action == "skip":
        outcome = Outcome(patch.name, "skipped", "dropped by --skip after: " + conflict["detail"])
        _checkout(tree, head, trees.new_pre)
    else:
        resolved = tree.snapshot()
        marked = [p for p in conflict.get("conflicts", []) if _has_markers(tree.path / p)]
        if marked:
            raise BadInput(f"conflict markers remain in {', '.join(marked)}",
                           hint="resolve them, then polyforge rebase --continue (or --skip, --abort)")
        if resolved == trees.new_pre:
            raise BadInput(f"the resolution leaves {patch.name} empty", hint="polyforge rebase --skip drops it")
        outcome = Outcome(patch.name, "resolved", conflict["detail"], tree=resolved)
        _review(tree.git, outcome, trees)
        _commit_patch(tree, journal, patch, head, trees, outcome)
        tree.sync_index()
    outcomes.append(outcome)
    state["outcomes"] = [o.as_dict() for o in outcomes]
    state["conflict"] = None
    state["merged"] = None
    journal.write(state)
    return _replay(chain, state, log)


def _has_markers(path: Path) -> bool:
    try:
        return _MARKER.search(path.read_bytes()) is not None
    except OSError:
        return False


def abort(chain: Chain) -> Report:
    """Put back the previous pin, patches and vendored repository, byte for byte."""
    project = chain.project
    journal = Journal(project)
    previous = journal.previous
    state = journal.read() if journal.exists() else {"onto": "?", "old_trees": ["?"], "new_base": "?",
                                                     "patches": []}
    if not (previous / "pin.yaml").exists() or not (previous / "patches").is_dir():
        raise BadInput(f"{previous} is incomplete: nothing to restore from",
                       hint=f"the rebase never moved anything; delete {project.rebase_dir}")
    if (previous / "llama.cpp").exists():
        if project.tree_dir.exists():
            shutil.rmtree(project.tree_dir)
        (previous / "llama.cpp").rename(project.tree_dir)
    shutil.copy2(previous / "pin.yaml", project.pin_file)
    _replace_folder(previous / "patches", project.patches_dir)
    for leftover in project.vendor_dir.glob(".rebase-incoming-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    shutil.rmtree(project.rebase_dir)
    return Report(state["onto"], state["old_trees"][0], state["new_base"],
                  [Outcome(n, "pending", "aborted") for n in state["patches"]], False)


def _replace_folder(src: Path, dest: Path) -> None:
    """dest becomes a copy of src (files dest has that src lacks are removed)."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)


def _finish(chain: Chain, state: dict, outcomes: list[Outcome], log: Log) -> Report:
    """Every patch replayed: write patches/, the pin and its history, relock, check out."""
    project = chain.project
    journal = Journal(project)
    tree = VendoredTree(project.tree_dir)
    old_pin = Pin.load(journal.previous / "pin.yaml")
    # patches/: replayed ones rewritten (bytes unchanged where nothing moved), dropped ones removed
    for outcome in outcomes:
        target = project.patches_dir / outcome.name
        if outcome.status in DROPPED:
            target.unlink(missing_ok=True)
            continue
        data = (journal.patches_dir / outcome.name).read_bytes()
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
    new_base = state["new_base"]
    prune = old_pin.pack_prune
    pack_tree = prune_tree(tree.git, new_base, prune) if prune else None
    text = render_pin(project=old_pin.project, release=state["release"], commit=state["commit"], tree=new_base,
                      pack_prune=prune, pack_tree=pack_tree, sources=[state["pin_entry"]])
    write_text_atomic(project.pin_file, text)
    Pin.load(project.pin_file)  # what was written reads back
    _record_history(project, old_pin, state, outcomes, journal)
    # the new repository owns its objects before the old one goes
    tree.git.run("repack", "-a", "-d", "-q")
    (project.tree_dir / ".git" / "objects" / "info" / "alternates").unlink(missing_ok=True)
    tree.git.run("fsck", "--connectivity-only", "--no-dangling")  # every object is its own now
    final = tree.head_tree()
    _checkout(tree, tree.head(), final)
    tree.sync_index()
    Chain(project).relock()
    if tree.snapshot() != final:
        raise VerificationFailed("the live tree is not the rebased chain's tree after checkout")
    # only now is the old repository not needed for an abort
    shutil.rmtree(project.rebase_dir)
    log(f"rebased onto {state['release']}: {len(outcomes)} patch(es)")
    return _report(state, outcomes, dry_run=False, done=True)


def _record_history(project: Project, old_pin: Pin, state: dict, outcomes: list[Outcome], journal: Journal) -> None:
    """Append the old pin to vendor/pin-history.yaml: enough to rebase back onto it."""
    path = project.pin_history_file
    try:
        history = yaml.safe_load(path.read_text()) if path.exists() else None
    except (OSError, yaml.YAMLError) as exc:
        raise BadInput(f"{path} is unreadable ({exc})") from None
    entries = list((history or {}).get("pins", []))
    previous_raw = yaml.safe_load((journal.previous / "pin.yaml").read_text())
    entry = {"release": old_pin.release, **({"commit": old_pin.commit} if old_pin.commit else {}),
             "tree": old_pin.tree, "left": time.strftime("%Y-%m-%d"), "for": state["release"],
             "rebase_back": "polyforge rebase --onto " + (old_pin.sources[0].spelling if old_pin.sources else "?")
                            + f" --release {old_pin.release}" + (f" --commit {old_pin.commit}" if old_pin.commit else ""),
             "sources": previous_raw.get("sources", []),
             "patches": {o.name: o.status for o in outcomes}}
    entries = [e for e in entries if e.get("tree") != old_pin.tree] + [entry]
    text = ("# Pins this project moved away from (polyforge rebase), oldest first; `rebase_back` returns to one.\n"
            + yaml.safe_dump({"pins": entries}, sort_keys=False, width=100))
    write_text_atomic(path, text)


# -- upstream check ----------------------------------------------------------------------------------
@dataclass
class CheckResult:
    reports: list[Report]

    @property
    def newest_clean(self) -> str | None:
        return next((r.onto for r in self.reports if r.clean), None)

    @property
    def ok(self) -> bool:
        return all(r.clean for r in self.reports)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "newest_clean": self.newest_clean,
                "sources": [{"onto": r.onto, "clean": r.clean,
                             "first_conflict": r.first_conflict.name if r.first_conflict else None,
                             "new_tree": r.new_tree, "seconds": round(r.seconds, 2),
                             "statuses": {o.name: o.status for o in r.outcomes}} for r in self.reports]}


def upstream_check(chain: Chain, sources: list[str], log: Log = _quiet) -> CheckResult:
    """Dry-run the rebase onto each source, in the order given (newest first)."""
    if not sources:
        raise BadInput("name at least one source to check")
    return CheckResult([dry_run(chain, s, log=log) for s in sources])

