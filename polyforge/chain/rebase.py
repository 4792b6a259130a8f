"""`polyforge rebase`: carry the chain onto another upstream tree, each patch classified and
reviewed; and `polyforge upstream check`, the dry run over several trees (a CI canary).

The new tree's files are imported once into the baseline cache (vendor.py's, keyed by tree id;
a source whose spelling always gives the same files is also remembered by spelling, so a second
dry run downloads and hashes nothing). Replaying happens in a work repository that reads the
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

A rebase in progress lives in vendor/rebase/: journal.json (a write-ahead journal of its steps,
listed below), the replayed patches so far, and previous/ (pin.yaml, pin-history.yaml, patches/
and the old vendored repository, moved aside whole), so --abort puts every byte back, and a run
killed at any moment is finished by --continue or undone by --abort. Other chain commands refuse
to run meanwhile. On success: pin.yaml names the new tree, patches/ and chain.lock follow, and
vendor/pin-history.yaml records the old pin with each patch's classification.
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
from polyforge.chain.engine import Chain, apply_in_index, prune_tree, run_chain
from polyforge.chain.patchfile import Patch
from polyforge.errors import BadInput, EnvironmentProblem, PolyforgeError, VerificationFailed
from polyforge.filelock import FileLock, owner_alive, owner_tag
from polyforge.git import Git, GitFailed, scratch_index
from polyforge.journal import StepJournal
from polyforge.project import Project, cache_dir
from polyforge import tree_identity
from polyforge.textfile import write_text_atomic
from polyforge.chain import review as review_lib
from polyforge.upstream.pin import Pin, render_pin, tree_label
from polyforge.upstream.source import Git as GitSource, SourceKind, source_from_argument
from polyforge.upstream.vendor import baseline_objects, store_baseline_objects
from polyforge.upstream.vendored_tree import BASELINE_TAG, BRANCH, VendoredTree, baseline_message

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
    knock_on: list[str] = field(default_factory=list)  # dry run: earlier conflicting patches this conflict may follow from

    def as_dict(self) -> dict:
        out = {"name": self.name, "status": self.status, "detail": self.detail}
        if self.conflicts:
            out["conflicts"] = self.conflicts
        if self.knock_on:
            out["knock_on"] = self.knock_on
        out["review"] = [f.as_dict() for f in self.findings]
        if self.tree:
            out["tree"] = self.tree
        return out

    @staticmethod
    def from_dict(raw: dict) -> "Outcome":
        return Outcome(raw["name"], raw["status"], raw.get("detail", ""), list(raw.get("conflicts", [])),
                       [review_lib.Finding(**f) for f in raw.get("review", [])], raw.get("tree"),
                       list(raw.get("knock_on", [])))


@dataclass
class Report:
    onto: str
    old_tree: str
    new_tree: str
    outcomes: list[Outcome]
    dry_run: bool
    seconds: float = 0.0
    done: bool = False  # the rebase finished: pin, patches and lock moved
    note: str = ""  # e.g. that the source is older than the pin
    failure: PolyforgeError | None = None  # upstream check: this source could not be checked

    @property
    def first_conflict(self) -> Outcome | None:
        return next((o for o in self.outcomes if o.status == "conflict"), None)

    @property
    def clean(self) -> bool:
        return self.failure is None and self.first_conflict is None and all(o.status != "pending" for o in self.outcomes)

    @property
    def knock_on_conflicts(self) -> int:
        return sum(1 for o in self.outcomes if o.status == "conflict" and o.knock_on)

    def as_dict(self) -> dict:
        conflict = self.first_conflict
        out = {"onto": self.onto, "old_tree": self.old_tree, "new_tree": self.new_tree, "dry_run": self.dry_run,
               "clean": self.clean, "done": self.done, "first_conflict": conflict.name if conflict else None,
               "conflicts": sum(1 for o in self.outcomes if o.status == "conflict"),
               "knock_on_conflicts": self.knock_on_conflicts, "note": self.note,
               "seconds": round(self.seconds, 2), "patches": [o.as_dict() for o in self.outcomes]}
        if self.failure is not None:
            out["error"] = self.failure.message
        return out


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
    incoming = Path(tempfile.mkdtemp(prefix=_work_prefix("source"), dir=_work_root()))
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
    """The cache's rebase-work/: each run's folders are named after it, and a dead run's are
    removed by the next (a killed run cannot clean up after itself)."""
    root = cache_dir() / "rebase-work"
    root.mkdir(parents=True, exist_ok=True)
    for entry in root.iterdir():
        parts = entry.name.split("-")
        if parts[0] == "polyforge" and not (len(parts) > 2 and owner_alive(parts[2])):
            shutil.rmtree(entry, ignore_errors=True)
    return root


def _work_prefix(kind: str) -> str:
    return f"polyforge-{kind}-{owner_tag()}-"


def _read_objects_of(repo_git_dir: Path, *object_dirs: Path, relative: tuple[Path, ...] = ()) -> None:
    """Let a repository read other repositories' objects (git alternates). `relative` ones are
    written relative to its own objects, so a project moved or copied mid-rebase still reads them."""
    objects = repo_git_dir / "objects"
    info = objects / "info"
    info.mkdir(parents=True, exist_ok=True)
    lines = [str(d.resolve()) for d in object_dirs] + [os.path.relpath(d.resolve(), objects.resolve()) for d in relative]
    (info / "alternates").write_text("".join(f"{line}\n" for line in lines))


@contextmanager
def _work_repo(*object_dirs: Path) -> Iterator[Git]:
    """A throw-away bare repository that reads the given object stores."""
    path = Path(tempfile.mkdtemp(prefix=_work_prefix("replay"), dir=_work_root()))
    try:
        git = Git(path)
        git.run("init", "-q", "--bare")
        _read_objects_of(path, *object_dirs)
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


def dry_run(chain: Chain, onto: str, *, release: str | None = None, force: bool = False,
            log: Log = _quiet) -> Report:
    """Replay the chain onto another tree without moving anything."""
    started = time.monotonic()
    chain.require_no_rebase()
    chain.tree.require()
    source = _parse_onto(onto, chain)
    patches = chain.patches()
    old = _old_trees(chain, patches)
    new_base = source_tree(source, log)
    objects = _new_tree_objects(new_base)
    outcomes: list[Outcome] = []
    skipped: list[Patch] = []  # conflicting patches the forecast goes on without
    with _work_repo(chain.tree.path / ".git" / "objects", objects) as git:
        _require_llama_tree(git, source, new_base, force)
        tree = new_base
        for i, patch in enumerate(patches):
            # the old chain's trees, less the change of every conflicting patch so far: later
            # patches then merge against what the new tree will have if those are skipped
            trees = Trees(old[0], new_base, old[i], old[i + 1], tree)
            outcome, _ = replay_patch(git, patch, trees, _upstream_label(release))
            _review(git, outcome, trees)
            if skipped:
                outcome.detail = (outcome.detail + " " if outcome.detail else "") + \
                    f"(forecast: with {', '.join(p.name for p in skipped)} left out)"
            if outcome.status == "conflict":
                # a conflict in a file a left-out patch changes may be only that patch's absence:
                # resolving the earlier conflict (keeping its change) may clear it
                outcome.knock_on = [p.name for p in skipped if set(p.paths()) & set(outcome.conflicts)]
                if outcome.knock_on:
                    outcome.detail += f" (maybe a knock-on of {', '.join(outcome.knock_on)})"
                skipped.append(patch)
            elif outcome.tree:
                tree = outcome.tree
            outcomes.append(outcome)
            log(f"{patch.name}: {outcome.status}")
    return Report(source.spelling, old[0], new_base, outcomes, True, time.monotonic() - started,
                  note=_age_note(chain, source.spelling, new_base, release))


LLAMA_MARKS = {"ggml": "tree", "src/llama.cpp": "blob", "CMakeLists.txt": "blob"}


def _require_llama_tree(git: Git, source: SourceKind, tree: str, force: bool) -> None:
    """Refuse a tree that does not look like llama.cpp (an empty or unrelated folder, a wrong
    subdir) unless forced: every patch would conflict, or a rebase would start onto it."""
    if force:
        return
    missing = [path for path, kind in LLAMA_MARKS.items()
               if git.run_full("cat-file", "-t", f"{tree}:{path}", check=False)[1].strip() != kind]
    if missing:
        raise BadInput(f"--onto {source.spelling} does not look like a llama.cpp tree (no {', '.join(missing)})",
                       hint="name the llama.cpp folder itself (#subdir for an archive or sdist), or pass --force")


def _b_number(text: str) -> int | None:
    match = re.search(r"(?<![A-Za-z0-9])b(\d{3,6})(?![0-9])", text)
    return int(match.group(1)) if match else None


def _age_note(chain: Chain, spelling: str, tree: str, release: str | None) -> str:
    """Says so when a source is older than the pin: the tree of a pin this project left, or a
    bNNNN release (named by --release or in the spelling) below the pin's."""
    try:
        history = yaml.safe_load(chain.project.pin_history_file.read_text())
        entries = [e for e in history.get("pins", []) if isinstance(e, dict)]
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        entries = []
    for entry in reversed(entries):
        if entry.get("tree") == tree:
            return f"older than the pin: the tree of {entry.get('release')}, a pin this project left for {entry.get('for')}"
    pinned, theirs = _b_number(chain.pin.release), _b_number(release or "") or _b_number(spelling)
    if pinned and theirs and theirs < pinned:
        return f"older than the pin: b{theirs} < {chain.pin.release}"
    return ""


def _parse_onto(onto: str, chain: Chain) -> SourceKind:
    try:
        return source_from_argument(onto, chain.pin.sources)
    except BadInput as exc:
        raise BadInput(f"--onto {exc.message}") from None


# -- a rebase that moves the project ---------------------------------------------------------------
#
# Each step is recorded in vendor/rebase/journal.json before its action runs (polyforge/journal.py),
# and each action can be run again: a kill anywhere leaves a state --continue finishes as an
# uninterrupted run would, or --abort undoes byte for byte.
#
#   save         pin.yaml, pin-history.yaml and patches/ copied to vendor/rebase/previous/
#   incoming     the new repository built beside the old one (vendor/.rebase-incoming, no files)
#   swap         the old repository moved to vendor/rebase/previous/llama.cpp, the new one in its place
#   replay       one patch replayed: its bytes in vendor/rebase/patches/, its commit; the branch follows
#   conflict     a patch conflicts: its merged tree is being checked out into the live tree
#   stopped      that checkout is complete (checked by tree id): the user resolves
#   resolve      --continue took the resolution;  skip: --skip dropped the patch
#   prepare      pin.yaml, pin-history.yaml and patches/ as they will be, in vendor/rebase/next/
#   install      those copied into place
#   own          the new repository takes in the objects it borrowed and forgets the old repository
#   checkout     the live tree becomes the rebased chain's tree (checked by tree id)
#   relock       chain.lock
#   end          vendor/rebase/ moved away: the rebase is over
#   abort, abort-files, abort-end: --abort puts back the repository, then the files, then ends.
#
# The branch head after each patch comes from the journal, never from the repository: a run
# killed after a step is recorded and before the branch moved must not replay that patch again.

OP = "rebase"
REPLAYED = ("replay", "resolve", "skip")  # the steps that give a patch its outcome
FINISHING = ("prepare", "install", "own", "checkout", "relock", "end")
ABORTING = ("abort", "abort-files", "abort-end")


class RebaseArea:
    """vendor/rebase/: the journal and what a rebase keeps while it is in progress."""

    def __init__(self, project: Project):
        self.project = project
        self.dir = project.rebase_dir
        self.journal = StepJournal(self.dir / "journal.json", OP)
        self.previous = self.dir / "previous"
        self.old_tree_dir = self.previous / "llama.cpp"
        self.patches_dir = self.dir / "patches"
        self.next_dir = self.dir / "next"
        self.incoming = project.vendor_dir / ".rebase-incoming"

    def outcomes(self) -> list[Outcome]:
        return [Outcome.from_dict(s["outcome"]) for s in self.journal.steps if s["step"] in REPLAYED]

    def head(self, tree: VendoredTree) -> tuple[str, str]:
        """(commit, tree) the branch is at after the patches replayed so far."""
        done = [s for s in self.journal.steps if s["step"] in REPLAYED]
        if done:
            return done[-1]["head"], done[-1]["tree"]
        return tree.baseline_commit(), self.journal.state["new_base"]

    def conflict(self) -> dict | None:
        """The step of the conflict the rebase stopped at (or was stopping at when killed)."""
        steps = self.journal.steps
        if steps and steps[-1]["step"] in ("conflict", "stopped"):
            return next(s for s in reversed(steps) if s["step"] == "conflict")
        return None

    def aborting(self) -> bool:
        return any(s["step"] in ABORTING for s in self.journal.steps)


def in_progress(project: Project) -> bool:
    return project.rebase_dir.exists()


def start(chain: Chain, onto: str, *, release: str, commit: str | None = None, force: bool = False,
          log: Log = _quiet) -> Report:
    """Move the chain onto another tree; stops at a conflict (then --continue/--skip/--abort)."""
    project = chain.project
    chain.require_no_rebase()
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
    with _work_repo(_new_tree_objects(new_base)) as git:
        _require_llama_tree(git, source, new_base, force)
    pin_entry = source.pin_entry()
    if isinstance(source, GitSource) and commit is None and source.immutable:
        commit = source.rev  # a full commit id
    state = {"onto": source.spelling, "release": release, "commit": commit, "pin_entry": pin_entry,
             "old_trees": old, "new_base": new_base, "patches": [p.name for p in patches],
             "started": time.strftime("%Y-%m-%d")}
    # vendor/rebase/ appears whole, journal in it: a rebase is in progress exactly when it has one
    begin = project.rebase_begin_dir
    _rmtree(begin)
    begin.mkdir(parents=True)
    StepJournal(begin / "journal.json", OP).begin(state)
    begin.rename(project.rebase_dir)
    return _forward(RebaseArea(project), log)


def _forward(ws: RebaseArea, log: Log) -> Report:
    """Go on from the last step recorded to the next conflict or to the end."""
    journal = ws.journal
    journal.step("save", lambda: _save(ws))
    journal.step("incoming", lambda: _build_incoming(ws))
    journal.step("swap", lambda: _swap(ws))
    tree = VendoredTree(ws.project.tree_dir)
    if journal.last() == "conflict":  # its checkout was cut short: write it again and stop there
        log("the checkout of the conflict was cut short: writing it again")
        return _stop_at_conflict(ws, tree, journal.steps[-1])
    if not journal.has("prepare"):
        stopped = _replay(ws, tree, log)
        if stopped is not None:
            return stopped
    journal.step("prepare", lambda: _prepare(ws, tree))
    journal.step("install", lambda: _install(ws))
    journal.step("own", lambda: _own_objects(tree))
    journal.step("checkout", lambda: _checkout_final(ws, tree))
    journal.step("relock", lambda: Chain(ws.project).relock())
    report = _report(ws, done=True)
    journal.step("end", lambda: _remove_workspace(ws))
    log(f"rebased onto {journal.state['release']}: {len(report.outcomes)} patch(es)")
    return report


def _rmtree(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _copy_whole(src: Path, dest: Path) -> None:
    """dest becomes a copy of src through a rename: a kill leaves the old file or the new."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dest)


def _replace_folder(src: Path | None, dest: Path, scratch: Path) -> None:
    """dest becomes a copy of src (none: dest goes). Run again after a kill, it ends the same."""
    staged, replaced = scratch.with_name(scratch.name + ".new"), scratch.with_name(scratch.name + ".old")
    _rmtree(staged)
    if src is not None:
        shutil.copytree(src, staged, symlinks=True)
    if dest.exists() or dest.is_symlink():
        _rmtree(replaced)
        dest.rename(replaced)
    if src is not None:
        staged.rename(dest)
    _rmtree(replaced)


def _save(ws: RebaseArea) -> None:
    """Everything --abort puts back, copied before anything moves."""
    if ws.previous.exists():
        return  # the rename below happened before a kill
    project = ws.project
    tmp = ws.dir / "previous.tmp"
    _rmtree(tmp)
    tmp.mkdir()
    shutil.copy2(project.pin_file, tmp / "pin.yaml")
    if project.pin_history_file.exists():
        shutil.copy2(project.pin_history_file, tmp / "pin-history.yaml")
    if project.patches_dir.exists():
        shutil.copytree(project.patches_dir, tmp / "patches", symlinks=True)
    tmp.rename(ws.previous)  # whole or absent: abort restores files only from a complete copy


def _build_incoming(ws: RebaseArea) -> None:
    """The new repository, beside the old one: the new tree as its baseline, no files yet."""
    state = ws.journal.state
    _rmtree(ws.incoming)
    ws.incoming.mkdir()
    fresh = VendoredTree.initialise(ws.incoming)
    _read_objects_of(ws.incoming / ".git", _new_tree_objects(state["new_base"]))
    base_commit = fresh.git.commit_tree(state["new_base"], baseline_message(tree_label(state["release"], state["commit"])))
    fresh.git.run("update-ref", BRANCH, base_commit)
    fresh.git.run("symbolic-ref", "HEAD", BRANCH)
    fresh.git.run("tag", "-f", BASELINE_TAG, base_commit)


def _swap(ws: RebaseArea) -> None:
    """The old repository aside (kept whole for --abort), the new one in its place; each rename
    is done only if it is not done yet."""
    tree_dir = ws.project.tree_dir
    if not ws.old_tree_dir.exists():
        tree_dir.rename(ws.old_tree_dir)
    if ws.incoming.exists():
        ws.incoming.rename(tree_dir)
    # the old chain's trees, for three-way merges and the review
    _read_objects_of(tree_dir / ".git", _new_tree_objects(ws.journal.state["new_base"]),
            relative=(ws.old_tree_dir / ".git" / "objects",))


def _load_patches(ws: RebaseArea, names: list[str]) -> list[Patch]:
    return [patchfile.read(ws.previous / "patches" / name) for name in names]


def _replay(ws: RebaseArea, tree: VendoredTree, log: Log) -> Report | None:
    """Replay from the first patch without an outcome; a conflict stops (its report returned)."""
    state = ws.journal.state
    git = tree.git
    patches = _load_patches(ws, state["patches"])
    old = state["old_trees"]
    head, new_tree = ws.head(tree)
    git.run("update-ref", BRANCH, head)  # where the journal says: a kill may have come before the branch moved
    for i in range(len(ws.outcomes()), len(patches)):
        patch = patches[i]
        trees = Trees(old[0], state["new_base"], old[i], old[i + 1], new_tree)
        outcome, merged = replay_patch(git, patch, trees, _upstream_label(state["release"]))
        log(f"{patch.name}: {outcome.status}")
        if outcome.status == "conflict":
            entry = ws.journal.record("conflict", index=i, outcome=outcome.as_dict(), merged=merged, head=head)
            return _stop_at_conflict(ws, tree, entry)
        _review(git, outcome, trees)
        head, new_tree = _commit_patch(ws, tree, patch, i, head, trees, outcome, "replay")
    return None


def _commit_patch(ws: RebaseArea, tree: VendoredTree, patch: Patch, index: int, head: str, trees: Trees,
                  outcome: Outcome, step: str) -> tuple[str, str]:
    """Record a patch's outcome: its canonical bytes (written before the record names them), its
    commit, then the branch."""
    if outcome.status in DROPPED:
        commit, new_tree = head, trees.new_pre
    else:
        assert outcome.tree
        data = patchfile.canonical(patch, tree.git, trees.new_pre, outcome.tree)
        ws.patches_dir.mkdir(parents=True, exist_ok=True)
        staged = ws.patches_dir / (patch.name + ".tmp")
        staged.write_bytes(data)
        os.replace(staged, ws.patches_dir / patch.name)
        commit = tree.patch_commit(head, outcome.tree, patch.name, patchfile.sha256_bytes(data))
        new_tree = outcome.tree
    ws.journal.record(step, index=index, outcome=outcome.as_dict(), head=commit, tree=new_tree)
    tree.git.run("update-ref", BRANCH, commit)
    return commit, new_tree


def _stop_at_conflict(ws: RebaseArea, tree: VendoredTree, entry: dict) -> Report:
    """Write the conflict's merged tree into the live tree; only a complete checkout is recorded
    as the place the user resolves."""
    _checkout(tree, entry["head"], entry["merged"])
    ws.journal.record("stopped", index=entry["index"])
    return _report(ws, Outcome.from_dict(entry["outcome"]))


def _checkout(tree: VendoredTree, head: str, worktree_tree: str) -> None:
    """Put worktree_tree's files in the live tree, with HEAD (and the index) at `head`; checked by
    tree id, so nothing reads a checkout cut short as complete."""
    git = tree.git
    git.run("update-ref", BRANCH, head)
    with scratch_index(git, worktree_tree) as index:
        index.run("checkout-index", "-a", "-f")
    _remove_extra_files(tree, worktree_tree)
    git.run("read-tree", head)
    git.run("update-index", "-q", "--refresh", check=False)
    if tree.snapshot() != worktree_tree:
        raise VerificationFailed(f"the live tree is not {worktree_tree[:12]} after its checkout",
                                 hint="polyforge rebase --continue writes it again")


def _remove_extra_files(tree: VendoredTree, wanted: str) -> None:
    """Delete live files that `wanted` does not have (a file an earlier checkout wrote)."""
    listed = set(tree.git.run("ls-tree", "-r", "-z", "--name-only", wanted, strip=False).split("\0"))
    for rel in tree_identity.counted_files(tree.path):  # build outputs and .git are never content
        if rel not in listed:
            os.unlink(os.path.join(tree.path, rel))


def _report(ws: RebaseArea, stopped: Outcome | None = None, *, done: bool = False) -> Report:
    state = ws.journal.state
    outcomes = ws.outcomes() + ([stopped] if stopped else [])
    names = {o.name for o in outcomes}
    pending = [Outcome(n, "pending", "after a conflict") for n in state["patches"] if n not in names]
    return Report(state["onto"], state["old_trees"][0], state["new_base"], outcomes + pending, False, done=done)


def resume(chain: Chain, action: str, log: Log = _quiet) -> Report:
    """--continue (take the resolved conflict, or go on after a kill), --skip (drop the
    conflicting patch) or --abort."""
    project = chain.project
    ws = RebaseArea(project)
    if not in_progress(project):
        raise BadInput("no rebase is in progress")
    if action == "abort":
        return abort(chain, log)
    if not ws.journal.exists():
        raise BadInput(f"{ws.dir} has no journal: no rebase can be continued from it",
                       hint="polyforge rebase --abort removes it if it is empty; otherwise inspect it")
    if ws.aborting():
        raise BadInput("an --abort of the rebase was cut short", hint="run polyforge rebase --abort again to finish it")
    entry = ws.conflict()
    if entry is None:
        if action == "skip":
            raise BadInput("the rebase is not stopped at a conflict: nothing to skip",
                           hint="polyforge rebase --continue carries on where it was cut short")
        return _forward(ws, log)
    tree = VendoredTree(project.tree_dir)
    state = ws.journal.state
    i = entry["index"]
    patch = _load_patches(ws, state["patches"])[i]
    conflict = Outcome.from_dict(entry["outcome"])
    old = state["old_trees"]
    head = entry["head"]
    trees = Trees(old[0], state["new_base"], old[i], old[i + 1], tree.git.tree_of(head))
    if action == "skip":
        outcome = Outcome(patch.name, "skipped", "dropped by --skip after: " + conflict.detail)
    elif ws.journal.last() == "conflict":  # the checkout was cut short: nothing in the live tree is a resolution
        log("the checkout of the conflict was cut short: writing it again")
        return _stop_at_conflict(ws, tree, entry)
    else:
        outcome = _resolution(tree, patch, entry, conflict, trees)
    _commit_patch(ws, tree, patch, i, head, trees, outcome, "skip" if action == "skip" else "resolve")
    if action != "skip":
        tree.sync_index()
    return _forward(ws, log)


def _resolution(tree: VendoredTree, patch: Patch, entry: dict, conflict: Outcome, trees: Trees) -> Outcome:
    """The live tree as the resolved patch, refused unless only the conflicted files changed."""
    marked = [p for p in conflict.conflicts if _has_markers(tree.path / p)]
    if marked:
        raise BadInput(f"conflict markers remain in {', '.join(marked)}",
                       hint="resolve them, then polyforge rebase --continue (or --skip, --abort)")
    resolved = tree.snapshot()
    outside = [path for _, path in tree.git.diff_names(entry["merged"], resolved) if path not in conflict.conflicts]
    if outside:
        shown = ", ".join(outside[:5]) + (f" and {len(outside) - 5} more" if len(outside) > 5 else "")
        raise BadInput(f"the live tree differs from {patch.name}'s conflict outside its conflicted files "
                       f"({', '.join(conflict.conflicts)}): {shown}",
                       hint=f"put those back as the conflict left them (git -C {tree.path} checkout "
                            f"{entry['merged'][:12]} -- FILE), then --continue; or --skip, --abort")
    if resolved == trees.new_pre:
        raise BadInput(f"the resolution leaves {patch.name} empty", hint="polyforge rebase --skip drops it")
    outcome = Outcome(patch.name, "resolved", conflict.detail, tree=resolved)
    _review(tree.git, outcome, trees)
    return outcome


def _has_markers(path: Path) -> bool:
    try:
        return _MARKER.search(path.read_bytes()) is not None
    except OSError:
        return False


def abort(chain: Chain, log: Log = _quiet) -> Report:
    """Put back the previous pin, its history, patches/ and the vendored repository, byte for
    byte. Each part is put back only if it moved, so an abort cut short is finished by another."""
    ws = RebaseArea(chain.project)
    journal = ws.journal
    if not journal.exists():
        # polyforge makes vendor/rebase/ whole, journal in it: this one is not a rebase's
        if any(ws.dir.iterdir()):
            raise BadInput(f"{ws.dir} has no journal: polyforge cannot tell what to put back from it",
                           hint="inspect it (previous/ would hold a saved pin, patches and repository); "
                                "remove it by hand when nothing in it is needed")
        _remove_workspace(ws)
        return Report("?", "?", "?", [], False)
    state = journal.state
    journal.step("abort", lambda: _restore_tree(ws))
    journal.step("abort-files", lambda: _restore_files(ws))
    journal.step("abort-end", lambda: _remove_workspace(ws))
    log("rebase aborted")
    return Report(state["onto"], state["old_trees"][0], state["new_base"],
                  [Outcome(n, "pending", "aborted") for n in state["patches"]], False)


def _restore_tree(ws: RebaseArea) -> None:
    """The old repository back in place; the new one (wherever the kill left it) gone."""
    tree_dir = ws.project.tree_dir
    discard = ws.dir / "discard"
    if ws.old_tree_dir.exists():
        if tree_dir.exists() or tree_dir.is_symlink():
            _rmtree(discard)
            tree_dir.rename(discard)
        ws.old_tree_dir.rename(tree_dir)
    _rmtree(ws.incoming)
    _rmtree(discard)


def _restore_files(ws: RebaseArea) -> None:
    previous, project = ws.previous, ws.project
    if not previous.is_dir():
        return  # the copy never completed, and nothing is changed before it is
    _copy_whole(previous / "pin.yaml", project.pin_file)
    if (previous / "pin-history.yaml").exists():
        _copy_whole(previous / "pin-history.yaml", project.pin_history_file)
    else:
        project.pin_history_file.unlink(missing_ok=True)
    saved = previous / "patches"
    _replace_folder(saved if saved.exists() else None, project.patches_dir, ws.dir / "patches-swap")


def _remove_workspace(ws: RebaseArea) -> None:
    """The end of a rebase or of an abort: vendor/rebase/ renamed away in one step, then deleted."""
    # the rename is the moment the rebase (or its abort) is over; Chain.exclusive deletes a
    # renamed workspace that a kill left
    done = ws.project.rebase_done_dir
    _rmtree(done)
    ws.dir.rename(done)
    _rmtree(done)


# -- the finish --------------------------------------------------------------------------------
def _prepare(ws: RebaseArea, tree: VendoredTree) -> None:
    """Every file the finish writes, made and checked in vendor/rebase/next/ first: patches/
    (replayed patches rewritten, dropped ones removed), pin.yaml and pin-history.yaml."""
    state = ws.journal.state
    outcomes = ws.outcomes()
    tmp = ws.dir / "next.tmp"
    _rmtree(tmp)
    _rmtree(ws.next_dir)
    tmp.mkdir()
    saved = ws.previous / "patches"
    if saved.exists():
        shutil.copytree(saved, tmp / "patches", symlinks=True)
    else:
        (tmp / "patches").mkdir()
    kept: list[tuple[Patch, str]] = []
    for outcome in outcomes:
        target = tmp / "patches" / outcome.name
        if outcome.status in DROPPED:
            target.unlink(missing_ok=True)
            continue
        data = (ws.patches_dir / outcome.name).read_bytes()
        target.write_bytes(data)
        assert outcome.tree
        kept.append((patchfile.parse(data, outcome.name, target), outcome.tree))
    _check_rebased_chain(tree.git, state["new_base"], kept)
    old_pin = Pin.load(ws.previous / "pin.yaml")
    prune = old_pin.pack_prune
    pack_tree = prune_tree(tree.git, state["new_base"], prune) if prune else None
    text = render_pin(project=old_pin.project, release=state["release"], commit=state["commit"],
                      tree=state["new_base"], pack_prune=prune, pack_tree=pack_tree, sources=[state["pin_entry"]])
    (tmp / "pin.yaml").write_text(text)
    Pin.load(tmp / "pin.yaml")  # what was written reads back
    (tmp / "pin-history.yaml").write_text(_history_text(ws, old_pin, outcomes))
    tmp.rename(ws.next_dir)


def _check_rebased_chain(git: Git, new_base: str, kept: list[tuple[Patch, str]]) -> None:
    """The rebased patches apply exactly, in lexical order, on the new baseline, each giving the
    tree its replay gave: what relock will demand, proven before anything is written."""
    steps = run_chain(git, new_base, [patch for patch, _ in kept])
    for (patch, tree), step in zip(kept, steps):
        if not step.ok or step.tree != tree:
            raise VerificationFailed(f"the rebased {patch.name} does not apply on the new baseline in lexical order: "
                                     f"{step.error or 'it gives tree ' + str(step.tree)[:12] + ', not ' + tree[:12]}",
                                     hint="nothing was written yet: polyforge rebase --abort puts everything back")


def _history_text(ws: RebaseArea, old_pin: Pin, outcomes: list[Outcome]) -> str:
    """vendor/pin-history.yaml with the old pin appended: enough to rebase back onto it."""
    state = ws.journal.state
    # the project's own file, not the saved copy: it is unchanged until install, and a user who
    # repairs it after this step failed must have the repair read
    path = ws.project.pin_history_file
    try:
        history = yaml.safe_load(path.read_text()) if path.exists() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise BadInput(f"{path} is unreadable ({str(exc).splitlines()[0]})",
                       hint="repair it, then polyforge rebase --continue; or --abort") from None
    if history is not None and not (isinstance(history, dict) and isinstance(history.get("pins", []), list)):
        raise BadInput(f"{path} is not a mapping with a 'pins' list",
                       hint="repair it, then polyforge rebase --continue; or --abort")
    entries = list((history or {}).get("pins", []))
    previous_raw = yaml.safe_load((ws.previous / "pin.yaml").read_text())
    entry = {"release": old_pin.release, **({"commit": old_pin.commit} if old_pin.commit else {}),
             "tree": old_pin.tree, "left": state["started"], "for": state["release"],
             "rebase_back": "polyforge rebase --onto " + (old_pin.sources[0].spelling if old_pin.sources else "?")
                            + f" --release {old_pin.release}" + (f" --commit {old_pin.commit}" if old_pin.commit else ""),
             "sources": previous_raw.get("sources", []),
             "patches": {o.name: o.status for o in outcomes}}
    entries = [e for e in entries if not (isinstance(e, dict) and e.get("tree") == old_pin.tree)] + [entry]
    return ("# Pins this project moved away from (polyforge rebase), oldest first; `rebase_back` returns to one.\n"
            + yaml.safe_dump({"pins": entries}, sort_keys=False, width=100))


def _install(ws: RebaseArea) -> None:
    project = ws.project
    _copy_whole(ws.next_dir / "pin.yaml", project.pin_file)
    _copy_whole(ws.next_dir / "pin-history.yaml", project.pin_history_file)
    _replace_folder(ws.next_dir / "patches", project.patches_dir, ws.dir / "patches-swap")


def _own_objects(tree: VendoredTree) -> None:
    """The new repository owns its objects before the old one can go."""
    tree.git.run("repack", "-a", "-d", "-q")
    (tree.path / ".git" / "objects" / "info" / "alternates").unlink(missing_ok=True)
    tree.git.run("fsck", "--connectivity-only", "--no-dangling")  # every object is its own now


def _checkout_final(ws: RebaseArea, tree: VendoredTree) -> None:
    head, final = ws.head(tree)
    _checkout(tree, head, final)
    tree.sync_index()


# -- what status says ----------------------------------------------------------------------------
def describe(project: Project) -> dict | None:
    """A rebase in progress, for status: where it stands and what it needs next."""
    if not in_progress(project):
        return None
    ws = RebaseArea(project)
    if not ws.journal.exists():
        return {"stage": "no journal", "onto": None, "release": None, "patch": None,
                "needs": "polyforge rebase --abort if vendor/rebase/ is empty; otherwise inspect it"}
    try:
        state = ws.journal.state
    except BadInput as exc:
        return {"stage": "unreadable", "onto": None, "release": None, "patch": None, "needs": exc.message}
    out = {"onto": state["onto"], "release": state["release"], "patch": None,
           "replayed": len(ws.outcomes()), "patches": len(state["patches"])}
    entry = ws.conflict()
    last = ws.journal.last()
    if ws.aborting():
        out.update(stage="aborting", needs="polyforge rebase --abort (an abort was cut short)")
    elif entry is not None and last == "stopped":
        conflict = Outcome.from_dict(entry["outcome"])
        out.update(stage="conflict", patch=conflict.name, conflicts=conflict.conflicts,
                   needs=f"resolve the conflicts in vendor/llama.cpp ({', '.join(conflict.conflicts)}), then "
                         "polyforge rebase --continue (or --skip, --abort)")
    elif entry is not None:
        out.update(stage="conflict-checkout", patch=entry["outcome"]["name"],
                   needs="polyforge rebase --continue (the conflict's checkout was cut short: it writes it again), "
                         "or --abort")
    elif any(ws.journal.has(s) for s in FINISHING):
        out.update(stage="finishing", needs="polyforge rebase --continue finishes it (or --abort)")
    else:
        out.update(stage="interrupted", needs="polyforge rebase --continue carries on (or --abort)")
    return out


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

    def failure(self) -> PolyforgeError | None:
        """One error for the sources that could not be checked (the others' results stand)."""
        failed = [r for r in self.reports if r.failure is not None]
        if not failed:
            return None
        first = failed[0].failure
        assert first is not None
        kind = {2: BadInput, 3: EnvironmentProblem}.get(first.exit_code, VerificationFailed)
        more = f" (and {len(failed) - 1} more source(s) failed)" if len(failed) > 1 else ""
        return kind(f"upstream check: {failed[0].onto}: {first.message}{more}", hint=first.hint)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "newest_clean": self.newest_clean,
                "sources": [{"onto": r.onto, "clean": r.clean,
                             "first_conflict": r.first_conflict.name if r.first_conflict else None,
                             "conflicts": sum(1 for o in r.outcomes if o.status == "conflict"),
                             "knock_on_conflicts": r.knock_on_conflicts, "note": r.note,
                             "error": r.failure.message if r.failure else None,
                             "new_tree": r.new_tree, "seconds": round(r.seconds, 2),
                             "statuses": {o.name: o.status for o in r.outcomes}} for r in self.reports]}


def upstream_check(chain: Chain, sources: list[str], log: Log = _quiet, *, force: bool = False,
                   on_report: Callable[[Report], None] | None = None) -> CheckResult:
    """Dry-run the rebase onto each source, in the order given (newest first). A source that
    fails is recorded as failed and the others are still checked; on_report sees each result
    as soon as it is known."""
    if not sources:
        raise BadInput("name at least one source to check")
    chain.require_no_rebase()
    reports = []
    for spelling in sources:
        log(f"checking {spelling}")
        started = time.monotonic()
        try:
            report = dry_run(chain, spelling, force=force, log=log)
        except PolyforgeError as exc:
            report = Report(spelling, "", "", [], True, time.monotonic() - started, failure=exc)
        reports.append(report)
        if on_report is not None:
            on_report(report)
    return CheckResult(reports)
