"""polyforge rebase and upstream check on tiny trees: each kind of upstream move, --continue,
--skip and --abort (which puts every byte back), a run cut short, and the CLI's exit codes."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import UPSTREAM_FILES, Proj, assert_clean_error, capture, make_upstream, run_cli
from polyforge.chain import verify as verify_lib
from polyforge.errors import BadInput
from polyforge.chain import rebase as rebase_lib

LLAMA_CPP = UPSTREAM_FILES["src/llama.cpp"]


def new_upstream(tmp_path: Path, name: str, edits: dict[str, str | None]) -> str:
    """A second upstream: the first with edits (None deletes); returns its dir: spelling."""
    files = dict(UPSTREAM_FILES)
    for rel, text in edits.items():
        if text is None:
            files.pop(rel, None)
        else:
            files[rel] = text
    return f"dir:{make_upstream(tmp_path, files, name=name).path}"


def fingerprint(proj: Proj) -> dict[str, str]:
    """Every byte the project keeps: pin, patches, the vendored tree and its repository (less the
    stat cache every read rewrites, .git/polyforge/live.index, and the lock file)."""
    out = {}
    for base in (proj.root / "vendor", proj.patches):
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.is_symlink() and path.name not in (".lock", "live.index"):
                out[str(path.relative_to(proj.root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def statuses(report: rebase_lib.Report) -> dict[str, str]:
    return {o.name: o.status for o in report.outcomes}


def rebase(proj: Proj, onto: str, release: str = "b0002", force: bool = False) -> rebase_lib.Report:
    chain = proj.chain()
    with chain.exclusive():
        return rebase_lib.start(chain, onto, release=release, force=force)


def resume(proj: Proj, action: str) -> rebase_lib.Report:
    chain = proj.chain()
    with chain.exclusive(rebasing=True):
        return rebase_lib.resume(chain, action)


@pytest.fixture
def applied(chained: Proj) -> Proj:
    chained.chain().apply()
    return chained


def assert_rebased(proj: Proj, onto_tree: str) -> None:
    """The pin names the new tree, chain.lock follows it, and the chain proves."""
    pin = yaml.safe_load((proj.root / "vendor" / "pin.yaml").read_text())
    assert pin["upstream"]["tree"] == onto_tree and pin["upstream"]["release"] == "b0002"
    chain = proj.chain()
    assert chain.tree.baseline_tree() == onto_tree
    assert chain.chain_lock().base_tree == onto_tree
    assert verify_lib.verify(chain).ok
    assert not chain.live_changes()
    assert not (proj.root / "vendor" / "rebase").exists()


# -- classification ------------------------------------------------------------------------------
def test_context_drift_only_moves_the_pin(applied: Proj, tmp_path):
    onto = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// a new header line\n" * 5 + LLAMA_CPP})
    before = (applied.patches / "0001-a.patch").read_bytes()
    report = rebase(applied, onto)
    assert statuses(report) == {"0001-a.patch": "exact", "0002-b.patch": "offsets"}
    assert report.clean and report.done
    assert_rebased(applied, report.new_tree)
    assert (applied.patches / "0001-a.patch").read_bytes() == before  # nothing moved in its file
    assert "return 70;" in applied.read("src/llama.cpp") and applied.read("src/llama.cpp").startswith("// a new")
    history = yaml.safe_load((applied.root / "vendor" / "pin-history.yaml").read_text())["pins"]
    assert history[-1]["release"] == "b0001" and history[-1]["tree"] == applied.upstream.tree
    assert history[-1]["patches"] == {"0001-a.patch": "exact", "0002-b.patch": "offsets"}
    assert history[-1]["rebase_back"].startswith("polyforge rebase --onto dir:")


def test_a_patch_fully_upstream_is_dropped(applied: Proj, tmp_path):
    onto = new_upstream(tmp_path, "has-a", {"src/llama.h": "#pragma once\nint f0(void);\nint f1(void);\n"})
    report = rebase(applied, onto)
    assert statuses(report) == {"0001-a.patch": "upstream", "0002-b.patch": "exact"}
    assert not (applied.patches / "0001-a.patch").exists()
    assert_rebased(applied, report.new_tree)


def test_a_patch_partly_upstream(fetched: Proj, tmp_path):
    both = LLAMA_CPP.replace("return 3;", "return 30;").replace("return 50;", "return 500;")
    capture(fetched, "0001-two", {"src/llama.cpp": both})
    onto = new_upstream(tmp_path, "half", {"src/llama.cpp": LLAMA_CPP.replace("return 3;", "return 30;")})
    report = rebase(fetched, onto)
    assert statuses(report) == {"0001-two.patch": "partly-upstream"}
    assert "1 line(s)" in report.outcomes[0].detail
    patch = (fetched.patches / "0001-two.patch").read_text()
    assert "+int f50(void) { return 500; }" in patch and "return 30;" not in patch.split("---\n", 1)[1]
    assert fetched.read("src/llama.cpp") == both
    assert_rebased(fetched, report.new_tree)


def test_a_file_renamed_upstream_is_followed(applied: Proj, tmp_path):
    onto = new_upstream(tmp_path, "renamed", {"src/llama.cpp": None, "src/llama-core.cpp": LLAMA_CPP})
    report = rebase(applied, onto, force=True)  # (no src/llama.cpp: not llama.cpp-like)
    assert statuses(report)["0002-b.patch"] == "three-way"
    assert "src/llama-core.cpp" in (applied.patches / "0002-b.patch").read_text()
    assert "return 70;" in applied.read("src/llama-core.cpp")
    assert_rebased(applied, report.new_tree)


def test_dry_run_moves_nothing_and_forecasts_past_a_conflict(applied: Proj, tmp_path):
    onto = new_upstream(tmp_path, "clash", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 700;"),
                                             "src/llama.h": "#pragma once\nint f0(void);\nint fx(void);\n"})
    before = fingerprint(applied)
    report = rebase_lib.dry_run(applied.chain(), onto)
    assert statuses(report) == {"0001-a.patch": "conflict", "0002-b.patch": "conflict"}
    assert report.first_conflict.name == "0001-a.patch" and report.first_conflict.conflicts == ["src/llama.h"]
    assert "forecast: with 0001-a.patch left out" in report.outcomes[1].detail
    assert fingerprint(applied) == before
    drift = new_upstream(tmp_path, "only-h", {"src/llama.h": "#pragma once\nint f0(void);\nint fx(void);\n"})
    report = rebase_lib.dry_run(applied.chain(), drift)  # the later patch does not need the conflicting one
    assert statuses(report) == {"0001-a.patch": "conflict", "0002-b.patch": "exact"}


def test_a_file_deleted_upstream_conflicts(applied: Proj, tmp_path):
    onto = new_upstream(tmp_path, "deleted", {"src/llama.cpp": None})
    report = rebase_lib.dry_run(applied.chain(), onto, force=True)
    assert statuses(report) == {"0001-a.patch": "exact", "0002-b.patch": "conflict"}
    assert report.first_conflict.conflicts == ["src/llama.cpp"]


@pytest.mark.parametrize("theirs, expected", [("int g(void);\n", "conflict"), ("int g(void) { return 1; }\n", "upstream")])
def test_a_new_file_added_by_both(fetched: Proj, tmp_path, theirs, expected):
    capture(fetched, "0001-new", {"src/new.c": "int g(void) { return 1; }\n"})
    onto = new_upstream(tmp_path, f"both-{expected}", {"src/new.c": theirs})
    report = rebase_lib.dry_run(fetched.chain(), onto)
    assert statuses(report) == {"0001-new.patch": expected}


# -- a conflict: continue, skip, abort ----------------------------------------------------------------
@pytest.fixture
def conflicted(applied: Proj, tmp_path):
    onto = new_upstream(tmp_path, "clash", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 700;")})
    before = fingerprint(applied)
    report = rebase(applied, onto)
    return applied, report, before


def test_a_conflict_stops_with_markers_in_the_live_tree(conflicted):
    proj, report, _ = conflicted
    assert statuses(report) == {"0001-a.patch": "exact", "0002-b.patch": "conflict"}
    assert not report.clean and not report.done
    text = proj.read("src/llama.cpp")
    assert "<<<<<<< upstream-b0002" in text and ">>>>>>> 0002-b" in text
    assert "int f1(void);" in proj.read("src/llama.h")  # 0001-a is in place
    with pytest.raises(BadInput, match="a rebase is in progress"):
        with proj.chain().exclusive():
            pass


def test_continue_refuses_markers_then_keeps_the_header(conflicted):
    proj, report, _ = conflicted
    old_header = (proj.root / "vendor" / "rebase" / "previous" / "patches" / "0002-b.patch").read_text().split("---\n")[0]
    with pytest.raises(BadInput, match="conflict markers remain in src/llama.cpp"):
        resume(proj, "continue")
    proj.write("src/llama.cpp", LLAMA_CPP.replace("return 7;", "return 7000;"))
    report = resume(proj, "continue")
    assert statuses(report) == {"0001-a.patch": "exact", "0002-b.patch": "resolved"}
    assert report.done
    patch = (proj.patches / "0002-b.patch").read_text()
    assert patch.split("---\n")[0] == old_header  # From, Date, Subject, description, trailers
    assert "-int f7(void) { return 700; }" in patch and "+int f7(void) { return 7000; }" in patch
    assert any(f.kind == "interdiff" for f in report.outcomes[1].findings)  # a human changed it: listed
    assert_rebased(proj, report.new_tree)


def test_skip_drops_the_conflicting_patch(conflicted):
    proj, _, _ = conflicted
    report = resume(proj, "skip")
    assert statuses(report) == {"0001-a.patch": "exact", "0002-b.patch": "skipped"}
    assert not (proj.patches / "0002-b.patch").exists()
    assert "return 700;" in proj.read("src/llama.cpp") and "<<<<<<<" not in proj.read("src/llama.cpp")
    assert_rebased(proj, report.new_tree)


def test_abort_restores_every_byte(conflicted):
    proj, _, before = conflicted
    resume(proj, "abort")
    assert fingerprint(proj) == before
    assert verify_lib.verify(proj.chain()).ok


@pytest.mark.parametrize("edits, conflicted_path", [
    ({"src/llama.cpp": None}, "src/llama.cpp"),  # deleted upstream
    ({"src/llama.h": "#pragma once\nint f0(void);\nint fx(void);\n"}, "src/llama.h"),  # changed alike
    ({"src/llama.cpp": None, "src/llama-core.cpp": LLAMA_CPP.replace("return 7;", "return 700;")},
     "src/llama-core.cpp"),  # renamed and changed
])
def test_abort_after_each_kind_of_conflict(applied: Proj, tmp_path, edits, conflicted_path):
    onto = new_upstream(tmp_path, "moved", edits)
    before = fingerprint(applied)
    report = rebase(applied, onto, force=True)
    assert report.first_conflict is not None and conflicted_path in report.first_conflict.conflicts
    resume(applied, "abort")
    assert fingerprint(applied) == before


def test_abort_after_a_finished_step_and_after_a_run_cut_short(applied: Proj, tmp_path, monkeypatch):
    onto = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    before = fingerprint(applied)
    real = rebase_lib.replay_patch
    calls = []

    def killed_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the run dies between patches
        return real(*args, **kwargs)

    monkeypatch.setattr(rebase_lib, "replay_patch", killed_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        rebase(applied, onto)
    assert rebase_lib.in_progress(applied.chain().project)
    monkeypatch.setattr(rebase_lib, "replay_patch", real)
    report = resume(applied, "continue")  # carries on where it stopped
    assert statuses(report) == {"0001-a.patch": "exact", "0002-b.patch": "offsets"}
    assert_rebased(applied, report.new_tree)
    # and abort from a run cut short at its very first move
    onto2 = new_upstream(tmp_path, "drift2", {"README.md": "moved\n"})
    before = fingerprint(applied)
    monkeypatch.setattr(rebase_lib, "_replay", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        rebase(applied, onto2)
    resume(applied, "abort")
    assert fingerprint(applied) == before


def test_refusals(applied: Proj, tmp_path):
    chain = applied.chain()
    with pytest.raises(BadInput, match="no rebase is in progress"):
        rebase_lib.resume(chain, "continue")
    with pytest.raises(BadInput, match="is the pinned tree already"):
        rebase(applied, f"dir:{applied.upstream.path}")
    with pytest.raises(BadInput, match="--release"):
        with chain.exclusive():
            rebase_lib.start(chain, f"dir:{applied.upstream.path}", release="b 2")
    applied.write("src/llama.h", "edited\n")
    onto = new_upstream(tmp_path, "drift", {"README.md": "moved\n"})
    with pytest.raises(BadInput, match="live edits"):
        rebase(applied, onto)


# -- the CLI ------------------------------------------------------------------------------------
def test_cli_dry_run_json_and_upstream_check(applied: Proj, tmp_path):
    import json
    clean = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    clash = new_upstream(tmp_path, "clash", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 700;")})
    done = run_cli("rebase", "--onto", clean, "--dry-run", "--json", cwd=applied.root)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["clean"] and data["dry_run"] and [p["status"] for p in data["patches"]] == ["exact", "offsets"]
    done = run_cli("upstream", "check", clash, clean, "--json", cwd=applied.root)
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["newest_clean"] == clean
    assert data["sources"][0]["first_conflict"] == "0002-b.patch"
    assert_clean_error(run_cli("rebase", "--continue", cwd=applied.root), 2, "no rebase is in progress")
    assert_clean_error(run_cli("rebase", "--onto", clean, cwd=applied.root), 2, "--release")


def test_cli_conflict_then_abort(applied: Proj, tmp_path):
    import json
    clash = new_upstream(tmp_path, "clash", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 700;")})
    before = fingerprint(applied)
    done = run_cli("rebase", "--onto", clash, "--release", "b0002", cwd=applied.root)
    assert done.returncode == 1 and "stopped" in done.stderr and "0002-b" in done.stderr, done.stderr
    assert_clean_error(run_cli("apply", cwd=applied.root), 2, "a rebase is in progress")
    done = run_cli("status", "--json", cwd=applied.root)
    assert done.returncode == 1 and json.loads(done.stdout)["rebasing"] is True
    done = run_cli("rebase", "--abort", cwd=applied.root)
    assert done.returncode == 0, done.stderr
    assert fingerprint(applied) == before
    shutil.rmtree(applied.root / "vendor" / "backups", ignore_errors=True)


# -- a rebase cut short, and what it refuses ------------------------------------------------------
def test_continue_refuses_edits_outside_the_conflicted_files(conflicted):
    proj, _, _ = conflicted
    proj.write("src/llama.cpp", LLAMA_CPP.replace("return 7;", "return 7000;"))
    proj.write("docs/build.md", "an edit that is no part of the resolution\n")
    with pytest.raises(BadInput, match=r"outside its conflicted files \(src/llama.cpp\): docs/build.md"):
        resume(proj, "continue")
    proj.write("docs/build.md", UPSTREAM_FILES["docs/build.md"])
    report = resume(proj, "continue")
    assert statuses(report)["0002-b.patch"] == "resolved" and report.done


def test_a_conflict_checkout_cut_short_is_never_read_as_a_resolution(applied: Proj, tmp_path, monkeypatch):
    onto = new_upstream(tmp_path, "clash", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 700;")})
    real = rebase_lib._checkout

    def dies_halfway(tree, head, worktree_tree):
        real(tree, head, worktree_tree)
        (tree.path / "ggml" / "src" / "ggml.c").write_text("")  # a file git had only begun to write
        (tree.path / "docs" / "more" / "notes.md").unlink()  # and one it never reached
        raise KeyboardInterrupt

    monkeypatch.setattr(rebase_lib, "_checkout", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        rebase(applied, onto)
    monkeypatch.setattr(rebase_lib, "_checkout", real)
    info = rebase_lib.describe(applied.chain().project)
    assert info["stage"] == "conflict-checkout" and "cut short" in info["needs"]
    proj = applied
    proj.write("src/llama.cpp", LLAMA_CPP.replace("return 7;", "return 7000;"))  # "resolved" by a user
    report = resume(proj, "continue")  # writes the checkout again and stops: nothing is taken as resolved
    assert report.first_conflict.name == "0002-b.patch" and not report.done
    assert proj.read("ggml/src/ggml.c") == UPSTREAM_FILES["ggml/src/ggml.c"]
    assert proj.read("docs/more/notes.md") == UPSTREAM_FILES["docs/more/notes.md"]
    assert "<<<<<<<" in proj.read("src/llama.cpp")
    assert rebase_lib.describe(proj.chain().project)["stage"] == "conflict"


def test_a_kill_between_the_two_renames_of_the_swap(applied: Proj, tmp_path):
    """The old repository moved aside and the new one not yet in place: status names the rebase
    (not 'vendor fetch'), --continue finishes it and --abort would put everything back."""
    onto = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    before = fingerprint(applied)
    done = run_cli("rebase", "--onto", onto, "--release", "b0002", cwd=applied.root,
                   env={"POLYFORGE_KILL_AT_STEP": "6"})  # the 'swap' step recorded, nothing renamed yet
    assert done.returncode == -9, done.stderr
    project = applied.chain().project
    applied.tree.rename(project.rebase_dir / "previous" / "llama.cpp")  # the first rename, and the kill
    text = run_cli("status", cwd=applied.root)
    assert text.returncode == 1 and "rebase" in text.stderr and "--continue" in text.stderr, text.stderr
    assert "vendor fetch" not in text.stderr and "Traceback" not in text.stderr
    vendor_status = run_cli("vendor", "status", cwd=applied.root)
    assert vendor_status.returncode == 1 and "rebase" in vendor_status.stderr, vendor_status.stderr
    copy = tmp_path / "copy"
    shutil.copytree(applied.root, copy, symlinks=True)
    assert run_cli("rebase", "--abort", cwd=copy).returncode == 0
    done = run_cli("rebase", "--continue", cwd=applied.root)
    assert done.returncode == 0, done.stderr
    assert_rebased(applied, rebase_lib.source_tree(rebase_lib._parse_onto(onto, applied.chain())))
    assert fingerprint(Proj(copy, applied.upstream)) == before


def test_abort_restores_pin_history_after_a_kill_while_finishing(applied: Proj, tmp_path):
    history = applied.root / "vendor" / "pin-history.yaml"
    history.write_text("pins: []\n")
    onto = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    before = fingerprint(applied)
    for n in range(13, 60):  # up to the first boundary after the history was rewritten
        done = run_cli("rebase", "--onto", onto, "--release", "b0002", cwd=applied.root,
                       env={"POLYFORGE_KILL_AT_STEP": str(n)})
        assert done.returncode == -9, done.stderr
        if history.read_text() != "pins: []\n":
            break
        assert run_cli("rebase", "--abort", cwd=applied.root).returncode == 0
    assert "b0001" in history.read_text()  # a history entry the abort must take back
    done = run_cli("rebase", "--abort", cwd=applied.root)
    assert done.returncode == 0, done.stderr
    assert fingerprint(applied) == before


def test_a_failing_finish_moves_nothing_and_aborts(applied: Proj, tmp_path):
    history = applied.root / "vendor" / "pin-history.yaml"
    history.write_text("pins: [unclosed\n")
    onto = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    before = fingerprint(applied)
    done = run_cli("rebase", "--onto", onto, "--release", "b0002", cwd=applied.root)
    assert_clean_error(done, 2, "pin-history.yaml is unreadable")
    pin = (applied.root / "vendor" / "pin.yaml").read_text()
    assert "b0001" in pin and "b0002" not in pin  # nothing of the finish was written
    again = run_cli("rebase", "--continue", cwd=applied.root)
    assert_clean_error(again, 2, "pin-history.yaml is unreadable")
    status = run_cli("status", cwd=applied.root)
    assert "finishing" in status.stderr and "--continue" in status.stderr, status.stderr
    copy = tmp_path / "copy"
    shutil.copytree(applied.root, copy, symlinks=True)
    assert run_cli("rebase", "--abort", cwd=applied.root).returncode == 0
    assert fingerprint(applied) == before
    (copy / "vendor" / "pin-history.yaml").write_text("pins: []\n")  # repaired: the finish goes through
    done = run_cli("rebase", "--continue", cwd=copy)
    assert done.returncode == 0, done.stderr
    assert "b0001" in (copy / "vendor" / "pin-history.yaml").read_text()


def test_a_source_that_is_not_llama_cpp_is_refused_unless_forced(applied: Proj, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    unrelated = tmp_path / "unrelated"
    (unrelated / "src").mkdir(parents=True)
    (unrelated / "src" / "main.rs").write_text("fn main() {}\n")
    before = fingerprint(applied)
    for folder in (empty, unrelated):
        done = run_cli("rebase", "--onto", str(folder), "--dry-run", cwd=applied.root)
        assert_clean_error(done, 2, "does not look like a llama.cpp tree")
        done = run_cli("rebase", "--onto", str(folder), "--release", "b0002", cwd=applied.root)
        assert_clean_error(done, 2, "does not look like a llama.cpp tree")
    assert fingerprint(applied) == before
    done = run_cli("rebase", "--onto", str(unrelated), "--dry-run", "--force", "--json", cwd=applied.root)
    assert done.returncode == 1 and not json.loads(done.stdout)["clean"], done.stderr


def test_dry_run_says_which_forecast_conflicts_are_knock_ons(fetched: Proj, tmp_path):
    capture(fetched, "0001-a", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 70;")})
    capture(fetched, "0002-b", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 71;")})  # builds on 0001
    capture(fetched, "0003-c", {"src/llama.h": "#pragma once\nint f0(void);\nint f3(void);\n"})
    onto = new_upstream(tmp_path, "clash", {"src/llama.cpp": LLAMA_CPP.replace("return 7;", "return 700;"),
                                             "src/llama.h": "#pragma once\nint f0(void);\nint fx(void);\n"})
    report = rebase_lib.dry_run(fetched.chain(), onto)
    assert statuses(report) == {"0001-a.patch": "conflict", "0002-b.patch": "conflict", "0003-c.patch": "conflict"}
    knock_on = {o.name: o.knock_on for o in report.outcomes}
    assert knock_on == {"0001-a.patch": [], "0002-b.patch": ["0001-a.patch"], "0003-c.patch": []}
    assert "maybe a knock-on of 0001-a.patch" in report.outcomes[1].detail
    assert report.as_dict()["knock_on_conflicts"] == 1 and report.as_dict()["conflicts"] == 3


def test_upstream_check_keeps_every_result_when_one_source_fails(applied: Proj, tmp_path):
    history = applied.root / "vendor" / "pin-history.yaml"
    clean = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    older = new_upstream(tmp_path, "older", {"README.md": "older\n"})
    older_tree = rebase_lib.source_tree(rebase_lib._parse_onto(older, applied.chain()))
    history.write_text(yaml.safe_dump({"pins": [{"release": "b0000", "tree": older_tree, "for": "b0001"}]}))
    done = run_cli("upstream", "check", clean, "dir:/nonexistent/llama.cpp", older, "--json", cwd=applied.root)
    assert_clean_error(done, 2, "upstream check: dir:/nonexistent/llama.cpp")
    data = json.loads(done.stdout)
    assert [s["clean"] for s in data["sources"]] == [True, False, True] and data["newest_clean"] == clean
    assert data["sources"][1]["error"] and data["sources"][0]["error"] is None
    assert "older than the pin" in data["sources"][2]["note"] and "b0000" in data["sources"][2]["note"]
    text = run_cli("upstream", "check", clean, "dir:/nonexistent/llama.cpp", cwd=applied.root)
    assert text.returncode == 2 and f"checking {clean}" in text.stderr and "clean" in text.stderr, text.stderr
    assert "0001-a.patch: exact" in text.stderr  # progress as it goes


def test_an_older_release_is_noted(applied: Proj, tmp_path):
    (applied.root / "vendor" / "pin.yaml").write_text(
        (applied.root / "vendor" / "pin.yaml").read_text().replace("release: b0001", "release: b11549"))
    onto = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    assert rebase_lib.dry_run(applied.chain(), onto, release="b11311").note == "older than the pin: b11311 < b11549"
    assert rebase_lib.dry_run(applied.chain(), onto, release="b11600").note == ""


def test_commands_refused_during_a_rebase(conflicted, tmp_path):
    proj, _, _ = conflicted
    clean = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    for argv in (("vendor", "pack", str(tmp_path / "x.tar.xz")), ("rebase", "--onto", clean, "--dry-run"),
                 ("upstream", "check", clean), ("unapply",), ("lock",)):
        assert_clean_error(run_cli(*argv, cwd=proj.root), 2, "a rebase is in progress")
    assert not (tmp_path / "x.tar.xz").exists()
    status = run_cli("status", "--json", cwd=proj.root)
    info = json.loads(status.stdout)["rebase"]
    assert info["stage"] == "conflict" and info["patch"] == "0002-b.patch" and "--continue" in info["needs"]


def test_dead_runs_work_folders_are_removed(applied: Proj, tmp_path, cache):
    work = cache / "rebase-work"
    work.mkdir(parents=True, exist_ok=True)
    dead = work / "polyforge-replay-999999999_1-abc"
    dead.mkdir()
    older = work / "polyforge-rebase-xyz"  # named before owners were
    older.mkdir()
    onto = new_upstream(tmp_path, "drift", {"src/llama.cpp": "// new\n" + LLAMA_CPP})
    rebase_lib.dry_run(applied.chain(), onto)
    assert not dead.exists() and not older.exists()
    assert list(work.iterdir()) == []  # the run's own are gone with it
