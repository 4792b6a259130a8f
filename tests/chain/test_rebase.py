"""polyforge rebase and upstream check on tiny trees: each kind of upstream move, --continue,
--skip and --abort (which puts every byte back), a run cut short, and the CLI's exit codes."""

from __future__ import annotations

import hashlib
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


def rebase(proj: Proj, onto: str, release: str = "b0002") -> rebase_lib.Report:
    chain = proj.chain()
    with chain.exclusive():
        return rebase_lib.start(chain, onto, release=release)


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
    report = rebase(applied, onto)
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
    report = rebase_lib.dry_run(applied.chain(), onto)
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
    report = rebase(applied, onto)
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
