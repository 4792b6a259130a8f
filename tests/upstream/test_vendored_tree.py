"""The vendored repository: its tree id, its state files, and what a dead run leaves behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import Proj, assert_clean_error, capture, make_upstream, run_cli, write_pin
from polyforge.upstream import vendor
from polyforge.errors import BadInput, EnvironmentProblem
from polyforge.filelock import FileLock

ROOT = Path(__file__).resolve().parents[2]


# -- the tree id ----------------------------------------------------------------------------
def _build_outputs(p: Proj, elsewhere: Path) -> None:
    """The build folders people really have: a symlinked build/, a real build-x/, a symlinked build-y,
    and __pycache__ folders, real and symlinked."""
    elsewhere.mkdir()
    (elsewhere / "CMakeCache.txt").write_text("cache\n")
    (p.tree / "build").symlink_to(elsewhere)
    (p.tree / "build-y").symlink_to(elsewhere)
    p.write("build-x/bin/llama-cli", "binary\n")
    p.write("src/__pycache__/mod.pyc", "pyc\n")
    (p.tree / "ggml" / "__pycache__").symlink_to(elsewhere)


def test_build_outputs_are_not_content_even_as_symlinks(fetched: Proj, tmp_path):
    _build_outputs(fetched, tmp_path / "elsewhere")
    tree = fetched.chain().tree
    assert tree.snapshot() == fetched.upstream.tree
    assert fetched.chain().live_changes() == []


def test_a_file_named_build_something_is_content(fetched: Proj):
    # llama.cpp's own build-xcframework.sh: only folders and symlinks named build* are build outputs
    fetched.write("build-tool.sh", "#!/bin/sh\n")
    assert fetched.chain().live_changes() == [("A", "build-tool.sh")]


def test_snapshots_side_by_side_share_no_git_lock(fetched: Proj):
    """Readers run side by side: none may take a lock another needs (live.index.lock was one)."""
    fetched.write("src/llama.h", "edited\n")
    tree = fetched.chain().tree
    expected = tree.snapshot()
    failures: list[BaseException] = []
    results: list[str] = []

    def many() -> None:
        try:
            for _ in range(15):
                results.append(fetched.chain().tree.snapshot())
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=many) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == [] and set(results) == {expected} and len(results) == 45


# -- state files ----------------------------------------------------------------------------
def test_corrupt_state_is_one_line(fetched: Proj):
    (fetched.tree / ".git" / "polyforge" / "state.json").write_text('{"pruned": fal')
    with pytest.raises(BadInput, match="state.json is corrupt"):
        fetched.chain().tree.state()


def test_state_is_written_whole(fetched: Proj):
    tree = fetched.chain().tree
    tree.write_state(extra="value")
    assert tree.state()["extra"] == "value"
    assert [p.name for p in tree.state_dir.iterdir() if p.name.startswith("state")] == ["state.json"]


def test_corrupt_journal_is_one_line(fetched: Proj):
    (fetched.tree / ".git" / "polyforge" / "journal.json").write_text('{"op": "apply", "from_comm')
    chain = fetched.chain()
    with pytest.raises(BadInput, match="journal.json is corrupt"):
        chain.tree.pending_journal()
    with pytest.raises(BadInput, match="journal.json is corrupt"):
        with chain.exclusive():
            pass


# -- what a dead run leaves behind ------------------------------------------------------------
def _die_holding_the_project_lock(p: Proj, leave: list[str]) -> int:
    """A polyforge run killed (kill -9) inside the vendored repository: it held the project lock and
    had created git lock files and a scratch index, exactly as a cut-short run leaves them."""
    code = ("import os, signal; from pathlib import Path; from polyforge.filelock import FileLock\n"
            f"lock = FileLock(Path({str(p.root / 'vendor' / '.lock')!r}), 'vendored tree').__enter__()\n"
            f"for rel in {leave!r}:\n"
            f"    Path({str(p.tree)!r}, rel).write_text('')\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
    assert child.returncode == -signal.SIGKILL
    return int((p.root / "vendor" / ".lock").read_text().split()[0])


LEFT_BY_A_DEAD_RUN = [".git/index.lock", ".git/polyforge/live.index.lock", ".git/refs/heads/main.lock",
                      ".git/polyforge-index-abc123", ".git/polyforge-index-abc123.lock"]


def test_a_dead_runs_lock_files_are_removed_with_a_notice(fetched: Proj):
    dead = _die_holding_the_project_lock(fetched, LEFT_BY_A_DEAD_RUN)
    chain = fetched.chain()
    with chain.exclusive() as notices:
        assert f"removed a stale .git/index.lock left by a polyforge run that died (pid {dead})" in notices
        assert any("refs/heads/main.lock" in n for n in notices)
        for rel in LEFT_BY_A_DEAD_RUN:
            assert not (fetched.tree / rel).exists(), rel
        assert chain.live_changes() == []


def test_a_lock_file_in_use_is_left_alone(fetched: Proj):
    _die_holding_the_project_lock(fetched, [".git/index.lock"])
    lock_file = fetched.tree / ".git" / "index.lock"
    # the user's own git, still running in the vendored repository, holds it open
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(lock_file)!r}); print(1, flush=True); "
                               "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "1"
        with pytest.raises(EnvironmentProblem, match=r"\.git/index\.lock exists"):
            with fetched.chain().exclusive():
                pass
        assert lock_file.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_file_no_polyforge_run_left_is_not_ours_to_remove(fetched: Proj):
    (fetched.tree / ".git" / "index.lock").write_text("")  # a git process of the user's, or its debris
    with pytest.raises(EnvironmentProblem, match=r"\.git/index\.lock exists") as caught:
        with fetched.chain().exclusive():
            pass
    assert caught.value.hint and "delete" in caught.value.hint
    assert (fetched.tree / ".git" / "index.lock").exists()


def test_stale_locks_as_a_reader_sees_them(fetched: Proj):
    dead = _die_holding_the_project_lock(fetched, [".git/index.lock"])
    tree = fetched.chain().tree
    with FileLock(fetched.root / "vendor" / ".lock", "vendored tree", shared=True) as reader:
        removable, blocking = tree.leftover_locks(reader.dead_holder)
    assert removable == [".git/index.lock"] and blocking == [] and reader.dead_holder == dead
    assert tree.leftover_locks(None) == ([], [".git/index.lock"])


def test_capture_after_a_dead_run(fetched: Proj):
    _die_holding_the_project_lock(fetched, [".git/index.lock", ".git/refs/heads/main.lock"])
    fetched.write("src/llama.h", "after\n")
    chain = fetched.chain()
    with chain.exclusive():
        info = chain.capture("0001-after")
    assert info["name"] == "0001-after.patch" and [a.name for a in chain.tree.applied()] == ["0001-after.patch"]


# -- the CLI, end to end ----------------------------------------------------------------------
def _status_loop(root: Path, stop: threading.Event, answers: list) -> None:
    while not stop.is_set():
        answers.append(run_cli("status", "--json", cwd=root))


def test_status_in_a_loop_never_breaks_apply_or_unapply(chained: Proj):
    """A real race: two status loops beside up to 6 rounds of apply + unapply (bounded by a deadline).
    Every writer must succeed; every status answer must be a true state, or 'busy'."""
    stop = threading.Event()
    answers: list[subprocess.CompletedProcess] = []
    readers = [threading.Thread(target=_status_loop, args=(chained.root, stop, answers)) for _ in range(2)]
    for reader in readers:
        reader.start()
    rounds = 0
    try:
        deadline = time.monotonic() + 30
        while rounds < 6 and time.monotonic() < deadline:
            for command in ("apply", "unapply"):
                done = run_cli(command, cwd=chained.root)
                assert done.returncode == 0, (command, rounds, done.stderr)
            rounds += 1
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=120)
    assert rounds >= 2 and len(answers) >= 2
    for done in answers:
        if done.returncode == 3:
            assert "busy" in done.stderr and "Traceback" not in done.stderr
            continue
        assert done.returncode == 0, done.stderr
        info = json.loads(done.stdout)
        assert info["applied"] in ([], ["0001-a.patch", "0002-b.patch"]), info
        assert info["live_edits"] == [] and info["interrupted"] is None, info


def test_a_symlinked_build_folder_changes_nothing(chained: Proj, tmp_path):
    _build_outputs(chained, tmp_path / "elsewhere")
    for command in ("status", "apply", "verify-patches", "status", "unapply", "status"):
        done = run_cli(command, cwd=chained.root)
        assert done.returncode == 0, (command, done.stderr)
    assert chained.chain().tree.snapshot() == chained.upstream.tree
    assert (chained.tree / "build" / "CMakeCache.txt").read_text() == "cache\n"


def test_corrupt_state_via_the_cli_is_one_line(chained: Proj):
    (chained.tree / ".git" / "polyforge" / "state.json").write_text("{not json")
    for command in ("status", "apply"):
        assert_clean_error(run_cli(command, cwd=chained.root), 2, "state.json is corrupt")


def test_a_lock_file_that_cannot_be_opened_via_the_cli(chained: Proj):
    (chained.root / "vendor" / ".lock").mkdir()
    for command in ("status", "apply"):
        assert_clean_error(run_cli(command, cwd=chained.root), 3, "cannot open the vendored tree lock")


def test_the_command_after_a_dead_run_recovers(chained: Proj):
    before = chained.chain().tree.snapshot()
    dead = _die_holding_the_project_lock(chained, LEFT_BY_A_DEAD_RUN)
    done = run_cli("status", "--json", cwd=chained.root)
    info = json.loads(done.stdout)
    assert done.returncode == 0 and info["git_locks"]["removable"], (done.stderr, info)
    assert "the next command removes" in run_cli("status", cwd=chained.root).stderr
    done = run_cli("apply", cwd=chained.root)
    assert done.returncode == 0, done.stderr
    assert f"removed a stale .git/index.lock left by a polyforge run that died (pid {dead})" in done.stderr
    assert run_cli("verify-patches", cwd=chained.root).returncode == 0
    assert run_cli("unapply", cwd=chained.root).returncode == 0
    assert chained.chain().tree.snapshot() == before


def test_status_is_not_ok_with_a_lock_file_the_next_command_would_trip_on(chained: Proj):
    (chained.tree / ".git" / "index.lock").write_text("")
    done = run_cli("status", "--json", cwd=chained.root)
    info = json.loads(done.stdout)
    assert done.returncode == 1 and info["ok"] is False and info["git_locks"]["blocking"] == [".git/index.lock"]
    assert_clean_error(run_cli("apply", cwd=chained.root), 3, ".git/index.lock exists")


def _many_files_project(tmp_path: Path, monkeypatch, count: int) -> Proj:
    files = {f"src/gen/file{i:04d}.c": f"int g{i}(void) {{ return {i}; }}\n" for i in range(count)}
    up = make_upstream(tmp_path, files)
    root = tmp_path / "project"
    write_pin(root, up)
    (root / "patches").mkdir()
    monkeypatch.chdir(root)
    p = Proj(root, up)
    chain = p.chain()
    vendor.fetch(chain)
    chain.relock()
    capture(p, "0001-all", {rel: text.replace("return", "return 1 +") for rel, text in files.items()})
    p.chain().unapply()
    return p


def _kill_group_when(p: Proj, sign: str, env: dict) -> bool:
    """Run `polyforge apply` in its own process group and kill -9 the group the moment `sign` (a glob
    under the tree's .git) appears; False if the apply ended before it was seen."""
    run = subprocess.Popen([sys.executable, "-m", "polyforge", "apply"], cwd=p.root, env=env,
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    git_dir = p.tree / ".git"
    deadline = time.monotonic() + 60
    seen = False
    while run.poll() is None and time.monotonic() < deadline:
        if next(git_dir.glob(sign), None) is not None:
            seen = True
            break
        time.sleep(0.001)
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    return seen


def test_kill_9_of_apply_then_apply_succeeds(tmp_path, cache, monkeypatch):
    """A cancelled CI job: kill -9 of the whole process group while apply is inside the repository
    (git's index.lock held, a scratch index in use, the move journalled); the next apply succeeds."""
    p = _many_files_project(tmp_path, monkeypatch, 800)
    base = p.chain().tree.snapshot()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    killed = 0
    for sign in ("index.lock", "polyforge-index-*", "polyforge/journal.json"):
        killed += _kill_group_when(p, sign, env)
        done = run_cli("apply", cwd=p.root)
        assert done.returncode == 0, (sign, done.stderr)
        assert run_cli("verify-patches", cwd=p.root).returncode == 0, sign
        done = run_cli("unapply", cwd=p.root)
        assert done.returncode == 0, (sign, done.stderr)
        assert p.chain().tree.snapshot() == base
    assert killed, "no kill landed inside the repository"


# -- the journal: recovery never loses a live edit ----------------------------------------------
def _journal_file(p: Proj) -> Path:
    return p.tree / ".git" / "polyforge" / "journal.json"


def _write_journal(p: Proj, **journal: str) -> None:
    _journal_file(p).write_text(json.dumps(journal))


def _apply_cut_short(chain) -> None:
    """apply killed after the live tree moved but before the branch did (the journal stays)."""
    from polyforge.git import Git
    real_run = Git.run

    def crash_on_ref_update(self, *args, **kwargs):
        if args and args[0] == "update-ref":
            raise KeyboardInterrupt
        return real_run(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(Git, "run", crash_on_ref_update)
        with pytest.raises(KeyboardInterrupt):
            with chain.exclusive():
                chain.apply()


def test_a_journal_of_no_real_run_changes_nothing(chained: Proj):
    """Case env-journal-bogus-commit: recovery used to reset the live tree to to_tree first,
    wiping the user's uncaptured edit, and only then fail on the bogus from_commit."""
    from polyforge.chain.status import read as read_status
    chain = chained.chain()
    chain.apply()
    chained.write("docs/build.md", "a user edit nobody captured\n")
    tree = chain.tree
    head, head_tree, base = tree.head(), tree.head_tree(), tree.baseline_commit()
    bogus = [dict(op="apply", from_commit="f" * 40, to_tree=head_tree),         # no such commit
             dict(op="rebase", from_commit=head, to_tree=head_tree),            # not an op of ours
             dict(op="apply", from_commit=head, to_tree=head),                  # a commit, not a tree
             dict(op="apply", from_commit=head_tree, to_tree=head_tree),        # a tree, not a commit
             dict(op="apply", from_commit=12, to_tree=None),                    # not ids at all
             dict(op="apply", from_commit=base, to_tree=tree.baseline_tree())]  # HEAD is neither
    for journal in bogus:
        _write_journal(chained, **journal)
        with pytest.raises(BadInput, match="journal.json") as caught:
            with chained.chain().exclusive():
                pass
        assert "delete" in caught.value.hint and "\n" not in caught.value.message
        info = read_status(chained.chain()).as_dict()
        assert info["ok"] is False and "journal.json" in info["journal_problem"], journal
        assert chained.read("docs/build.md") == "a user edit nobody captured\n", journal
        assert tree.head() == head and _journal_file(chained).exists(), journal
    _write_journal(chained, **bogus[0])
    assert_clean_error(run_cli("apply", cwd=chained.root), 2, "ffffffffffff")
    assert run_cli("status", cwd=chained.root).returncode == 1
    assert chained.read("docs/build.md") == "a user edit nobody captured\n"


def test_recovery_refuses_to_overwrite_an_edit_made_after_the_crash(chained: Proj):
    """A real interrupted apply, then the user edits a file: rolling back would lose the edit, so
    nothing moves until it is saved; a file the move had half-done (or deleted) is no edit."""
    chain = chained.chain()
    before = chain.tree.snapshot()
    _apply_cut_short(chain)
    edited = "src/llama.h"
    chained.write(edited, "edited after the crash\n")
    (chained.tree / "src" / "llama.cpp").unlink()  # a move cut short between unlink and write
    with pytest.raises(BadInput, match=f"{edited} in .* is neither") as caught:
        with chained.chain().exclusive():
            pass
    assert "checkout HEAD -- src/llama.h" in caught.value.hint
    assert chained.read(edited) == "edited after the crash\n" and _journal_file(chained).exists()
    assert "neither" in status_info_problem(chained)
    subprocess.run(["git", "-C", str(chained.tree), "checkout", "HEAD", "--", edited], check=True)
    with chained.chain().exclusive() as notices:
        assert any("interrupted apply" in n for n in notices)
    assert not _journal_file(chained).exists()
    assert chained.chain().tree.snapshot() == before


def test_recovery_takes_a_file_git_was_half_way_through_writing(chained: Proj):
    """kill -9 while git writes a file leaves a prefix of the version it was writing: that is the
    move's own debris, not an edit, and the rollback restores the file."""
    chain = chained.chain()
    before = chain.tree.snapshot()
    _apply_cut_short(chain)
    written = chained.read("src/llama.cpp")  # 0002-b's version, as the move wrote it
    chained.write("src/llama.cpp", written[: len(written) // 3])
    with chained.chain().exclusive() as notices:
        assert any("interrupted apply" in n for n in notices)
    assert chained.chain().tree.snapshot() == before


def status_info_problem(p: Proj) -> str:
    from polyforge.chain.status import read as read_status
    info = read_status(p.chain()).as_dict()
    assert info["ok"] is False and info["interrupted"] == "apply"
    return info["journal_problem"]


def test_recovery_after_the_branch_moved(chained: Proj):
    """Cut short after update-ref (HEAD at the new commit, journal still there): rolled back too."""
    chain = chained.chain()
    before, head = chain.tree.snapshot(), chain.tree.head()
    real_sync = type(chain.tree).sync_index
    calls = []

    def crash_after_the_ref(self):
        calls.append(1)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(type(chain.tree), "sync_index", crash_after_the_ref)
        with pytest.raises(KeyboardInterrupt):
            with chain.exclusive():
                chain.apply()
    assert calls and chain.tree.head() != head and _journal_file(chained).exists()
    assert type(chain.tree).sync_index is real_sync
    with chained.chain().exclusive() as notices:
        assert any("interrupted apply" in n for n in notices)
    assert chain.tree.head() == head and chain.tree.snapshot() == before
