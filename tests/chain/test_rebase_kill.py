"""A killed rebase never corrupts the chain.

`polyforge rebase` runs as a subprocess of `python -m polyforge` and is killed (SIGKILL) at every
step boundary of its journal (POLYFORGE_KILL_AT_STEP=N, for every N the run crosses), and in a
slow test at random moments. Each killed state is then taken both ways, on two copies:

  - --continue (resolving the conflict where the rebase stops at one) must end exactly where an
    uninterrupted run ends: the same pin.yaml, pin-history.yaml, patches/ and chain.lock, the same
    vendored commits and files, or the same error where the uninterrupted run fails;
  - --abort must put back every byte of vendor/ and patches/ as they were before the rebase.

Three small targets stand for the kinds of rebase: `easy` replays cleanly (exact and offsets),
`conflict` stops at 0002-b and needs --continue, `failing` cannot finish (pin-history.yaml is
unreadable). The trees are a few files, so a run takes about a second.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import UPSTREAM_FILES, capture, fetched_project, make_upstream
from polyforge.chain.engine import Chain
from polyforge.errors import PolyforgeError
from polyforge.journal import KILL_ENV
from polyforge.project import Project
from polyforge.chain import rebase as rebase_lib
from polyforge.upstream.pin import Pin

LLAMA_CPP = UPSTREAM_FILES["src/llama.cpp"]
RESOLVED = LLAMA_CPP.replace("return 7;", "return 7000;")
HISTORY = "pins:\n- release: b0000\n  tree: " + "0" * 40 + "\n"
RANDOM_KILLS = 200


@dataclass(frozen=True)
class Target:
    name: str
    edits: dict  # the new upstream: UPSTREAM_FILES with these edits
    history: str | None  # vendor/pin-history.yaml before the rebase


TARGETS = [
    Target("easy", {"src/llama.cpp": "// moved down\n" * 3 + LLAMA_CPP, "README.md": "# moved on\n"}, None),
    Target("conflict", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 700;")}, HISTORY),
    Target("failing", {"src/llama.cpp": "// moved down\n" + LLAMA_CPP}, "pins: [unclosed\n"),
]


class Kit:
    """One project per target, built once: chain 0001-a, 0002-b, 0003-c applied on b0001."""

    def __init__(self, base: Path):
        self.base = base
        self.cache = base / "cache"
        self.templates: dict[str, Path] = {}
        self.onto: dict[str, str] = {}
        self.references: dict[str, tuple] = {}
        upstream = make_upstream(base)
        for target in TARGETS:
            files = {**UPSTREAM_FILES, **target.edits}
            self.onto[target.name] = f"dir:{make_upstream(base, files, name=f'onto-{target.name}').path}"
            root = base / f"template-{target.name}"
            proj = fetched_project(root, upstream)
            capture(proj, "0001-a", {"src/llama.h": "#pragma once\nint f0(void);\nint f1(void);\n"})
            capture(proj, "0002-b", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 70;")})
            capture(proj, "0003-c", {"ggml/src/ggml.c": UPSTREAM_FILES["ggml/src/ggml.c"].replace(
                "// line 10\n", "// line 10, patched\n")})
            if target.history is not None:
                (root / "vendor" / "pin-history.yaml").write_text(target.history)
            self.templates[target.name] = root
        self.old_tree = upstream.tree

    def copy(self, target: Target, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-a", str(self.templates[target.name]), str(dest)], check=True)
        return dest

    def reference(self, target: Target) -> tuple:
        """Where an uninterrupted run ends (run once per target)."""
        if target.name not in self.references:
            root = self.copy(target, self.base / f"reference-{target.name}")
            self.references[target.name] = go_on(self, target, root)
        return self.references[target.name]


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        base = tmp_path_factory.mktemp("rebase-kill")
        mp.setenv("POLYFORGE_CACHE", str(base / "cache"))
        mp.delenv("POLYFORGE_ROOT", raising=False)
        mp.delenv(KILL_ENV, raising=False)
        yield Kit(base)


# -- what is compared --------------------------------------------------------------------------
def every_byte(root: Path) -> dict[str, str]:
    """vendor/ and patches/, every file and symlink (less the lock file and the stat cache every
    read rewrites), and every folder: what --abort must put back."""
    out = {}
    for base in (root / "vendor", root / "patches"):
        for path in sorted(base.rglob("*")):
            rel = str(path.relative_to(root))
            if path.name in (".lock", "live.index"):
                continue
            if path.is_symlink():
                out[rel] = "link " + os.readlink(path)
            elif path.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = f"{oct(path.stat().st_mode)} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return out


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root / "vendor" / "llama.cpp"), *args], capture_output=True,
                          text=True).stdout.strip()


def result(root: Path) -> dict:
    """What a finished (or failed) rebase leaves that matters: the project's files, the vendored
    commits (their ids are reproducible) and files, and what status says of a rebase."""
    files = every_byte(root)
    kept = {k: v for k, v in files.items()
            if not k.startswith(("vendor/llama.cpp/.git", "vendor/rebase/"))}
    return {"files": kept, "head": _git(root, "rev-parse", "HEAD"),
            "refs": _git(root, "for-each-ref", "--format=%(refname) %(objectname)"),
            "rebase": rebase_lib.describe(Project(root))}


# -- the two ways out of a killed run -------------------------------------------------------------
def go_on(kit: Kit, target: Target, root: Path) -> tuple:
    """--continue until the rebase ends (resolving the conflict where it stops), starting it again
    if the kill came before it began; (result, the error it ended on)."""
    project = Project(root)
    error = None
    for _ in range(10):
        chain = Chain(project)
        if not rebase_lib.in_progress(project):
            if Pin.load(project.pin_file).tree != kit.old_tree:
                break
            action = "start"
        else:
            action = "continue"
            if (rebase_lib.describe(project) or {}).get("stage") == "conflict":
                (root / "vendor" / "llama.cpp" / "src" / "llama.cpp").write_text(RESOLVED)
        try:
            with chain.exclusive(rebasing=action != "start"):
                if action == "start":
                    rebase_lib.start(chain, kit.onto[target.name], release="b0002")
                else:
                    rebase_lib.resume(chain, "continue")
        except PolyforgeError as exc:
            error = (type(exc).__name__, exc.message.replace(str(root), "PROJECT"))
            break
    else:
        raise AssertionError(f"{root}: the rebase did not end in 10 runs")
    with Chain(project).exclusive(rebasing=True):
        pass  # the next command: it clears what a dead run left
    return result(root), error


def go_back(root: Path) -> None:
    """--abort, as often as it takes (an abort killed midway is finished by the next)."""
    project = Project(root)
    chain = Chain(project)
    with chain.exclusive(rebasing=True):
        if rebase_lib.in_progress(project):
            rebase_lib.resume(chain, "abort")
    assert not rebase_lib.in_progress(project)


def cli(root: Path, *args: str, kill_at: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ}
    env.pop("COLUMNS", None)
    if kill_at is not None:
        env[KILL_ENV] = str(kill_at)
    return subprocess.run([sys.executable, "-m", "polyforge", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def _finished(kit: Kit, root: Path) -> bool:
    """The rebase got past its end (the kill came after, or never): nothing is left to abort."""
    project = Project(root)
    return not rebase_lib.in_progress(project) and Pin.load(project.pin_file).tree != kit.old_tree


def check_both_ways(kit: Kit, target: Target, root: Path, before: dict, label: str) -> None:
    """The killed state in `root`: undone by --abort, and (on a copy) finished by --continue."""
    second = root.with_name(root.name + "-continued")
    subprocess.run(["cp", "-a", str(root), str(second)], check=True)
    if not _finished(kit, root):
        go_back(root)
        after = every_byte(root)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        assert not changed, f"{label}: --abort left {changed[:8]}"
    got = go_on(kit, target, second)
    expected = kit.reference(target)
    assert got[1] == expected[1], f"{label}: --continue ended on {got[1]}, an uninterrupted run on {expected[1]}"
    diff = sorted(k for k in set(got[0]["files"]) | set(expected[0]["files"])
                  if got[0]["files"].get(k) != expected[0]["files"].get(k))
    assert not diff and got[0] == expected[0], f"{label}: --continue differs from an uninterrupted run: {diff[:8]}"
    shutil.rmtree(root.parent, ignore_errors=True)


def _killed(done: subprocess.CompletedProcess) -> bool:
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode == -signal.SIGKILL


# -- every step -----------------------------------------------------------------------------------
# the conflict target runs in every test run; the rest, a few minutes more, with the slow tests (CI)
@pytest.mark.parametrize("target", [pytest.param(t, id=t.name, marks=() if t.name == "conflict" else pytest.mark.slow)
                                    for t in TARGETS])
def test_a_kill_at_every_step(kit, target, tmp_path):
    """The rebase killed at each boundary of its journal in turn, until a run crosses them all."""
    before = every_byte(kit.templates[target.name])
    kills = 0
    for n in range(1, 200):
        root = kit.copy(target, tmp_path / f"step{n}" / "project")
        done = cli(root, "rebase", "--onto", kit.onto[target.name], "--release", "b0002", kill_at=n)
        if not _killed(done):
            break  # the run crossed fewer than n boundaries: every one has been killed at
        kills += 1
        check_both_ways(kit, target, root, before, f"{target.name}, killed at boundary {n}")
    else:
        raise AssertionError("the run never ended")
    # two boundaries a step: save, incoming, swap, a replay a patch, then the finish (6 steps),
    # the conflict and its stop, or the prepare step that fails
    assert kills == {"easy": 24, "conflict": 12, "failing": 14}[target.name], kills
    assert done.returncode == {"easy": 0, "conflict": 1, "failing": 2}[target.name], done.stderr


def _stopped_at_conflict(kit: Kit, dest: Path) -> Path:
    target = TARGETS[1]
    root = kit.copy(target, dest)
    done = cli(root, "rebase", "--onto", kit.onto[target.name], "--release", "b0002")
    assert done.returncode == 1 and "stopped" in done.stderr, done.stderr
    return root


@pytest.mark.parametrize("action", ["--continue", pytest.param("--skip", marks=pytest.mark.slow),
                                    pytest.param("--abort", marks=pytest.mark.slow)])
def test_a_kill_at_every_step_after_a_conflict(kit, action, tmp_path):
    """Stopped at the conflict: --continue (resolved), --skip and --abort each killed at every
    boundary; the killed state then continues (or, for --abort, aborts again) and aborts."""
    target = TARGETS[1]
    before = every_byte(kit.templates[target.name])
    stopped = _stopped_at_conflict(kit, tmp_path / "stopped")
    if action == "--continue":
        (stopped / "vendor" / "llama.cpp" / "src" / "llama.cpp").write_text(RESOLVED)
    kills = 0
    for n in range(1, 200):
        root = tmp_path / f"step{n}" / "project"
        root.parent.mkdir()
        subprocess.run(["cp", "-a", str(stopped), str(root)], check=True)
        done = cli(root, "rebase", action, kill_at=n)
        if not _killed(done):
            break
        kills += 1
        if action == "--abort":
            go_back(root)
            after = every_byte(root)
            assert after == before, f"--abort killed at {n}, then --abort: {sorted(set(after) ^ set(before))[:8]}"
            shutil.rmtree(root.parent)
        elif action == "--continue":
            check_both_ways(kit, target, root, before, f"--continue killed at boundary {n}")
        else:  # --skip: going on must give what an uninterrupted --skip gives
            second = root.with_name("skipped")
            subprocess.run(["cp", "-a", str(root), str(second)], check=True)
            go_back(root)
            assert every_byte(root) == before
            reference = tmp_path / "skip-reference"
            if not reference.exists():
                subprocess.run(["cp", "-a", str(stopped), str(reference)], check=True)
                assert cli(reference, "rebase", "--skip").returncode == 0
            project = Project(second)
            chain = Chain(project)
            if rebase_lib.in_progress(project):
                with chain.exclusive(rebasing=True):
                    action_now = "skip" if (rebase_lib.describe(project) or {}).get("stage", "").startswith("conflict") \
                        else "continue"
                    rebase_lib.resume(chain, action_now)
            with Chain(project).exclusive():
                pass
            assert result(second) == result(reference), f"--skip killed at {n}"
            shutil.rmtree(root.parent)
    assert kills >= 4 if action != "--abort" else kills >= 3
    assert done.returncode == 0, done.stderr


# -- random moments --------------------------------------------------------------------------------
@pytest.mark.slow
def test_random_kills(kit, tmp_path):
    """At least RANDOM_KILLS runs killed (process group, SIGKILL) at a random moment of the run,
    spread over the three targets, each then aborted and continued."""
    rng = random.Random(20261207)
    durations = {}
    for target in TARGETS:
        root = kit.copy(target, tmp_path / f"timing-{target.name}")
        started = time.monotonic()
        cli(root, "rebase", "--onto", kit.onto[target.name], "--release", "b0002")
        durations[target.name] = time.monotonic() - started
        kit.reference(target)
    befores = {t.name: every_byte(kit.templates[t.name]) for t in TARGETS}

    def trial(i: int, delay: float) -> bool:
        target = TARGETS[i % len(TARGETS)]
        root = kit.copy(target, tmp_path / f"trial{i}" / "project")
        env = {**os.environ}
        proc = subprocess.Popen([sys.executable, "-m", "polyforge", "rebase", "--onto", kit.onto[target.name],
                                 "--release", "b0002"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(delay)
        killed = proc.poll() is None
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        assert b"Traceback" not in err, err.decode(errors="replace")
        check_both_ways(kit, target, root, befores[target.name], f"{target.name}, killed after {delay:.2f} s")
        return killed

    kills = 0
    i = 0
    with ThreadPoolExecutor(max_workers=2) as pool:
        while kills < RANDOM_KILLS:
            numbers = range(i, i + 20)
            delays = [rng.uniform(0.2, durations[TARGETS[n % len(TARGETS)].name]) for n in numbers]
            batch = list(pool.map(trial, numbers, delays))
            kills += sum(batch)
            i += 20
    assert kills >= RANDOM_KILLS
