"""fold / move / rename on synthetic projects: the proofs, the refusals that write nothing, and
a kill -9 at every step of a real run (POLYFORGE_KILL_AT_STEP) rolled back by the next command."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Proj, assert_clean_error, capture, run_cli
from polyforge import journal
from polyforge.chain import patchfile, queue
from polyforge.chain.lockfile import ChainLock
from polyforge.errors import BadInput, VerificationFailed


def _four(fetched: Proj) -> None:
    """0001 and 0003 change the same function (0003 rewrites 0001's line); 0002 and 0004 touch
    files of their own."""
    llama = fetched.read("src/llama.cpp")
    capture(fetched, "0001-first", {"src/llama.cpp": llama.replace("return 5;", "return 50;")},
            "first : change f5\n\nWhy the first.\n\nUpstream-Status: Submitted")
    capture(fetched, "0002-second", {"ggml/src/ggml.c": fetched.read("ggml/src/ggml.c").replace("// line 60\n", "// LINE 60\n")},
            "second : ggml line\n\nWhy the second.")
    capture(fetched, "0003-third", {"src/llama.cpp": fetched.read("src/llama.cpp").replace("return 50;", "return 500;")},
            "third : f5 again\n\nWhy the third.\n\nUpstream-Status: Pending")
    capture(fetched, "0004-fourth", {"README.md": fetched.read("README.md") + "patched\n"}, "fourth : readme\n\nWhy.")


def _state(proj: Proj) -> tuple:
    """Every byte fold/move/rename may write: patches/ (chain.lock too), the branch, the live tree."""
    files = {p.name: p.read_bytes() for p in sorted(proj.patches.iterdir())}
    chain = proj.chain()
    return files, chain.tree.head(), chain.tree.snapshot()


def _final_tree(proj: Proj) -> str:
    return ChainLock.read(proj.patches / "chain.lock").patches[-1].tree


def test_fold_keeps_the_final_tree_and_the_first_header(fetched: Proj):
    _four(fetched)
    chain = fetched.chain()
    final, live = _final_tree(fetched), chain.tree.snapshot()
    first = patchfile.read(fetched.patches / "0001-first.patch")
    result = queue.fold(chain, "0001", "0003", "0001-first-third")
    names = sorted(p.name for p in fetched.patches.glob("*.patch"))
    assert names == ["0001-first-third.patch", "0004-fourth.patch"]
    folded = patchfile.read(fetched.patches / "0001-first-third.patch")
    assert folded.header.author == first.header.author and folded.header.date == first.header.date
    assert folded.header.subject == "first : change f5"
    assert "Why the first." in folded.header.body and "Why the third." in folded.header.body
    assert folded.header.trailers().count("Upstream-Status: Pending") == 1  # the newest wins, once
    assert "Submitted" not in folded.header.body
    assert _final_tree(fetched) == final and chain.tree.snapshot() == live
    assert [a.name for a in chain.tree.applied()] == names  # the applied commits re-recorded
    assert result.applied == 2
    from polyforge.chain import verify
    assert verify.verify(fetched.chain()).ok
    # the folded patch holds 0003's version of the line only: nothing rewritten any more
    from polyforge.chain import report
    assert [r for r in report.build(fetched.chain().patches()) .rewrites if r.lines] == []


def test_fold_with_a_message_and_author(fetched: Proj):
    _four(fetched)
    chain = fetched.chain()
    queue.fold(chain, "0002", "0004", "0002-rest", "rest : all of it\n\nOne concern.\n\nUpstream-Status: Backport",
               author="A Person <a@example.org>")
    folded = patchfile.read(fetched.patches / "0002-rest.patch")
    assert folded.header.author == "A Person <a@example.org>"
    assert folded.header.subject == "rest : all of it" and folded.header.trailer("Upstream-Status") == "Backport"


@pytest.mark.parametrize("args, error, fragment", [
    (("0003", "0001", "0001-x"), BadInput, "first patch"),
    (("0001", "0003", "0004-x"), BadInput, "must sort"),
    (("0002", "0003", "0001-a"), BadInput, "must sort"),
    (("0001", "0003", "bad_name"), BadInput, "bad patch name"),
    (("0001", "0009", "0001-x"), BadInput, "0009"),
    (("base", "0002", "0001-x"), BadInput, "baseline"),
])
def test_fold_refusals_write_nothing(fetched: Proj, args, error, fragment):
    _four(fetched)
    before = _state(fetched)
    with pytest.raises(error, match=fragment):
        queue.fold(fetched.chain(), *args)
    assert _state(fetched) == before


def test_fold_refuses_a_run_the_live_tree_is_inside(fetched: Proj):
    _four(fetched)
    chain = fetched.chain()
    chain.unapply(to="0002")
    before = _state(fetched)
    with pytest.raises(BadInput, match="inside the run"):
        queue.fold(chain, "0001", "0003", "0001-x")
    assert _state(fetched) == before
    queue.fold(chain, "0003", "0004", "0003-x")  # above the applied ones: the live tree stays
    assert [a.name for a in chain.tree.applied()] == ["0001-first.patch", "0002-second.patch"]


def test_move_renumbers_the_slots_it_passes(fetched: Proj):
    _four(fetched)
    chain = fetched.chain()
    final = _final_tree(fetched)
    result = queue.move(chain, "0004", "0001")
    names = sorted(p.name for p in fetched.patches.glob("*.patch"))
    assert names == ["0001-first.patch", "0002-fourth.patch", "0003-second.patch", "0004-third.patch"]
    assert result.statuses["0002-fourth.patch"].startswith("exact")
    assert _final_tree(fetched) == final
    assert [a.name for a in chain.tree.applied()] == names
    from polyforge.chain import verify
    assert verify.verify(fetched.chain()).ok
    # and back: the bytes of every patch return (hunks re-rendered canonically both ways)
    queue.move(fetched.chain(), "0002", "0004")
    again = sorted(p.name for p in fetched.patches.glob("*.patch"))
    assert again == ["0001-first.patch", "0002-second.patch", "0003-third.patch", "0004-fourth.patch"]


def test_move_that_does_not_commute_writes_nothing(fetched: Proj):
    _four(fetched)
    before = _state(fetched)
    with pytest.raises(VerificationFailed, match="0003-third|conflict|tree"):
        queue.move(fetched.chain(), "0003", "base")  # 0003 changes 0001's line: it cannot go first
    assert _state(fetched) == before
    with pytest.raises(BadInput, match="already"):
        queue.move(fetched.chain(), "0002", "0001")
    assert _state(fetched) == before


def test_move_carries_a_patch_by_three_way_merge(fetched: Proj):
    """A patch whose context holds a line another patch changed cannot apply past it, but its own
    change merges cleanly: the move re-renders it."""
    text = fetched.read("ggml/src/ggml.c")
    capture(fetched, "0001-a", {"ggml/src/ggml.c": text.replace("// line 10\n", "// LINE 10\n")})
    text = fetched.read("ggml/src/ggml.c")
    capture(fetched, "0002-b", {"ggml/src/ggml.c": text.replace("// line 12\n", "// LINE 12\n")})
    final = _final_tree(fetched)
    result = queue.move(fetched.chain(), "0002", "base")
    assert result.statuses["0001-b.patch"].startswith("three-way")
    assert _final_tree(fetched) == final


def test_rename(fetched: Proj):
    _four(fetched)
    chain = fetched.chain()
    queue.rename(chain, "0002", "0002-ggml-line")
    assert (fetched.patches / "0002-ggml-line.patch").is_file() and not (fetched.patches / "0002-second.patch").exists()
    assert "0002-ggml-line.patch" in [a.name for a in chain.tree.applied()]
    before = _state(fetched)
    with pytest.raises(BadInput, match="must sort"):
        queue.rename(chain, "0002", "0009-late")
    with pytest.raises(BadInput, match="its name already"):
        queue.rename(chain, "0002", "0002-ggml-line")
    assert _state(fetched) == before


def test_cli_errors_are_one_line(fetched: Proj):
    _four(fetched)
    before = _state(fetched)
    assert_clean_error(run_cli("fold", "0001", "--into", "0001-x", cwd=fetched.root), 2, "FIRST..LAST")
    assert_clean_error(run_cli("fold", "0001..0003", "--into", "0001-x", "--author", "x <y>", "--reset-author",
                               cwd=fetched.root), 2, "not both")
    assert_clean_error(run_cli("move", "0003", "--after", "base", cwd=fetched.root), 1, "nothing was written")
    assert_clean_error(run_cli("rename", "0002", "0007-x", cwd=fetched.root), 2, "must sort")
    assert _state(fetched) == before


# -- kills ------------------------------------------------------------------------------------
FOLD = ("fold", "0001..0003", "--into", "0001-folded", "-m", "folded : one\n\nOne.")


def _kill_each_step(fetched: Proj, argv: tuple[str, ...]) -> int:
    """Run argv once per step boundary, killed there; after each kill the next command (status
    reads, apply recovers) must find the project exactly as before or exactly as after."""
    before = _state(fetched)
    scratch = fetched.root.parent / "uninterrupted"
    subprocess.run(["cp", "-a", str(fetched.root), str(scratch)], check=True)
    assert run_cli(*argv, cwd=scratch).returncode == 0
    after = _state(Proj(scratch, fetched.upstream))
    step = 0
    while True:
        step += 1
        done = run_cli(*argv, cwd=fetched.root, env={journal.KILL_ENV: str(step)})
        if done.returncode == 0:
            break
        assert done.returncode == -signal.SIGKILL, done.stderr
        if (fetched.root / "vendor" / "transaction" / "journal.json").exists():
            said = run_cli("status", cwd=fetched.root)
            assert "interrupted" in said.stderr and "recovered by the next command" in said.stderr, said.stderr
        recovered = run_cli("apply", cwd=fetched.root)
        assert recovered.returncode == 0, recovered.stderr
        state = _state(fetched)
        assert state in (before, after), f"step {step}: neither before nor after"
        if state == after:  # killed after the last write: the run is complete
            break
        assert not (fetched.root / "vendor" / "transaction").exists()
    assert _state(fetched) == after
    return step


def test_fold_killed_at_every_step_is_undone_or_complete(fetched: Proj):
    _four(fetched)
    steps = _kill_each_step(fetched, FOLD)
    assert steps >= 5  # journal, three deletions, one write, the lock, the branch, the end


def test_move_killed_at_every_step_is_undone_or_complete(fetched: Proj):
    _four(fetched)
    assert _kill_each_step(fetched, ("move", "0004", "--after", "0001")) >= 5


def test_fold_killed_at_random_moments(fetched: Proj):
    """SIGKILL from outside at random delays, whatever the process is doing (git included)."""
    _four(fetched)
    before = _state(fetched)
    scratch = fetched.root.parent / "uninterrupted"
    subprocess.run(["cp", "-a", str(fetched.root), str(scratch)], check=True)
    started = time.monotonic()
    assert run_cli(*FOLD, cwd=scratch).returncode == 0
    duration = time.monotonic() - started
    after = _state(Proj(scratch, fetched.upstream))
    rng = random.Random(1234)
    outcomes = {"before": 0, "after": 0}
    for _ in range(12):
        process = subprocess.Popen([sys.executable, "-m", "polyforge", *FOLD], cwd=fetched.root,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.3, duration))
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert run_cli("apply", cwd=fetched.root).returncode == 0
        state = _state(fetched)
        assert state in (before, after)
        outcomes["before" if state == before else "after"] += 1
        if state == after:  # start again from before
            for name in os.listdir(fetched.patches):
                (fetched.patches / name).unlink()
            for name, data in before[0].items():
                (fetched.patches / name).write_bytes(data)
            fetched.chain().tree.git.run("update-ref", "refs/heads/main", before[1])
            assert _state(fetched) == before
    assert sum(outcomes.values()) == 12
