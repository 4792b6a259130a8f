"""The CLI end to end: exit codes, one-line errors, no tracebacks, --json on stdout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import Proj, assert_clean_error, capture, run_cli
from polyforge.filelock import FileLock
from polyforge.git import Git


def test_main_flow_and_json(chained: Proj):
    done = run_cli("apply", "--json", cwd=chained.root)
    assert done.returncode == 0, done.stderr
    assert [r["status"] for r in json.loads(done.stdout)["patches"]] == ["applied", "applied"]
    done = run_cli("status", "--json", cwd=chained.root)
    info = json.loads(done.stdout)
    assert done.returncode == 0 and info["applied"] == ["0001-a.patch", "0002-b.patch"] and info["live_edits"] == []
    assert run_cli("verify-patches", cwd=chained.root).returncode == 0
    assert run_cli("unapply", "--to", "0001", cwd=chained.root).returncode == 0
    assert json.loads(run_cli("status", "--json", cwd=chained.root).stdout)["unapplied"] == ["0002-b.patch"]


def test_outside_a_project(tmp_path):
    assert_clean_error(run_cli("status", cwd=tmp_path), 2, "not inside a polyforge project")


def test_usage_error_exit_2(chained: Proj):
    done = run_cli("apply", "--bogus", cwd=chained.root)
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_unknown_to(chained: Proj):
    assert_clean_error(run_cli("apply", "--to", "0042", cwd=chained.root), 2, "--to 0042")


def _corrupt(chained: Proj, transform) -> None:
    path = chained.patches / "0002-b.patch"
    path.write_bytes(transform(path.read_bytes()))


@pytest.mark.parametrize("transform, code, fragment", [
    (lambda b: b[: len(b) - 40], 2, "truncated"),
    (lambda b: b.replace(b"\n", b"\r\n"), 2, "CRLF"),
    (lambda b: b.replace(b"a/src/llama.cpp", b"a/../outside.cpp").replace(b"b/src/llama.cpp", b"b/../outside.cpp"), 2, "escapes the tree"),
    (lambda b: b.replace(b"a/src/llama.cpp", b"a//etc/passwd").replace(b"b/src/llama.cpp", b"b//etc/passwd"), 2, "absolute path"),
    (lambda b: b.replace(b"@@ -", b"GIT binary patch\n@@ -", 1), 2, "binary hunk"),
    (lambda b: b.replace(b"return 70;", b"return 71;"), 1, "chain.lock drift"),
])
def test_bad_patches_leave_everything_untouched(chained: Proj, transform, code, fragment):
    before = chained.chain().tree.snapshot()
    _corrupt(chained, transform)
    assert_clean_error(run_cli("apply", cwd=chained.root), code, fragment)
    assert chained.chain().tree.snapshot() == before
    assert chained.chain().tree.applied() == []


def test_dirty_tree_refusal_names_files(chained: Proj):
    chained.write("src/llama.h", "mine\n")
    assert_clean_error(run_cli("apply", cwd=chained.root), 2, "src/llama.h")
    assert chained.read("src/llama.h") == "mine\n"


def test_patch_through_a_symlink_is_refused(chained: Proj):
    # put a symlinked folder into the baseline, then a patch that writes through it
    from polyforge.upstream import vendor
    (chained.upstream.path / "linked").symlink_to("src")
    from conftest import git_tree_id, write_pin
    import shutil
    tree = git_tree_id(chained.upstream.path)
    chained.upstream.tree = tree
    write_pin(chained.root, chained.upstream)
    shutil.rmtree(chained.tree)
    (chained.patches / "chain.lock").unlink()
    vendor.fetch(chained.chain())
    path = chained.patches / "0002-b.patch"
    path.write_bytes(path.read_bytes().replace(b"src/llama.cpp", b"linked/llama.cpp"))
    (chained.patches / "0001-a.patch").unlink()
    chain = chained.chain()
    from polyforge.errors import BadInput
    with pytest.raises(BadInput, match="symlink linked"):
        chain.relock()


def test_git_missing_is_environment_error(chained: Proj):
    env = {"PATH": "/nonexistent"}
    done = run_cli("status", cwd=chained.root, env=env)
    assert_clean_error(done, 3, "git not found")


def test_lock_held_by_another_run(chained: Proj):
    with FileLock(chained.root / "vendor" / ".lock", "vendored tree"):
        done = run_cli("apply", cwd=chained.root)
    assert_clean_error(done, 3, f"pid {os.getpid()}")
    assert chained.chain().tree.applied() == []


def _apply_cut_short(chain, monkeypatch) -> None:
    """Interrupt apply after the live tree moved but before the branch did."""
    real_run = Git.run

    def crash_on_ref_update(self, *args, **kwargs):
        if args and args[0] == "update-ref":
            raise KeyboardInterrupt
        return real_run(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(Git, "run", crash_on_ref_update)
        with pytest.raises(KeyboardInterrupt):
            with chain.exclusive():
                chain.apply()


def test_interrupted_apply_is_recovered(chained: Proj, monkeypatch):
    chain = chained.chain()
    before = chain.tree.snapshot()
    _apply_cut_short(chain, monkeypatch)
    assert chain.tree.pending_journal() is not None
    assert chained.read("src/llama.h").endswith("int f1(void);\n"), "the files had moved"
    status = json.loads(run_cli("status", "--json", cwd=chained.root).stdout)
    assert status["interrupted"] == "apply"
    done = run_cli("apply", cwd=chained.root)
    assert done.returncode == 0, done.stderr
    assert "recovered from an interrupted apply" in done.stderr
    assert run_cli("verify-patches", cwd=chained.root).returncode == 0
    chain = chained.chain()
    chain.unapply()
    assert chain.tree.snapshot() == before


def test_interrupted_apply_with_new_files_is_recovered(fetched: Proj, monkeypatch):
    capture(fetched, "0001-new", {"src/brand-new.c": "new\n", "README.md": "changed\n"})
    chain = fetched.chain()
    chain.unapply()
    before = chain.tree.snapshot()
    _apply_cut_short(chain, monkeypatch)
    assert (fetched.tree / "src/brand-new.c").exists()
    with chain.exclusive() as notices:
        assert notices and "interrupted apply" in notices[0]
    assert not (fetched.tree / "src/brand-new.c").exists()
    assert chain.tree.snapshot() == before


def test_capture_and_refresh_cli(fetched: Proj):
    fetched.write("src/llama.h", "cli\n")
    done = run_cli("capture", "0001-cli", "-m", "cli: capture\n\nFrom the CLI.", "--json", cwd=fetched.root)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files"] == [{"path": "src/llama.h", "change": "modified"}]
    assert run_cli("refresh", "--check", cwd=fetched.root).returncode == 0
    fetched.write("src/llama.h", "cli 2\n")
    assert_clean_error(run_cli("refresh", "--check", cwd=fetched.root), 1, "not what refresh would write")
    assert run_cli("refresh", cwd=fetched.root).returncode == 0
    assert run_cli("verify-patches", cwd=fetched.root).returncode == 0
    assert run_cli("refresh", "-m", "cli: refreshed\n\nNew words.", cwd=fetched.root).returncode == 0
    assert "Subject: [PATCH] cli: refreshed" in (fetched.patches / "0001-cli.patch").read_text()


def test_vendor_cli(fetched: Proj, tmp_path):
    done = run_cli("vendor", "status", "--json", cwd=fetched.root)
    assert done.returncode == 0 and json.loads(done.stdout)["baseline_ok"] is True
    done = run_cli("vendor", "fetch", "--source", "nope-not-a-source", cwd=fetched.root)
    assert_clean_error(done, 2, "neither a source name")
    done = run_cli("vendor", "pack", str(tmp_path / "t.tar.xz"), "--json", cwd=fetched.root)
    assert done.returncode == 0 and json.loads(done.stdout)["tree"] == fetched.upstream.pack_tree


COMMANDS = ("apply", "unapply", "status", "capture", "refresh", "fold", "move", "rename", "chain", "lock", "verify-patches", "vendor", "rebase", "upstream",
            "build", "package", "doctor", "models", "gate", "bench", "up")


def test_help_lists_the_commands(tmp_path):
    done = run_cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    listed = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("│ ") and len(line.split()) > 2}
    assert set(COMMANDS) <= listed, done.stdout


def test_command_names_are_unchanged():
    """One CLI module per command group; splitting them must not rename, add or drop a command."""
    import typer
    from polyforge.cli import app
    assert sorted(typer.main.get_command(app).commands) == sorted(COMMANDS)


def test_status_and_unapply_cli_with_an_applied_patch_gone(chained: Proj):
    assert run_cli("apply", cwd=chained.root).returncode == 0
    (chained.patches / "0002-b.patch").unlink()
    assert run_cli("lock", cwd=chained.root).returncode == 0
    done = run_cli("status", cwd=chained.root)
    assert done.returncode == 1 and "0002-b.patch" in done.stderr and "not in patches/" in done.stderr, done.stderr
    done = run_cli("unapply", cwd=chained.root)
    assert done.returncode == 0, done.stderr
    assert "0002-b.patch" in done.stderr and "recorded" in done.stderr
    assert run_cli("apply", cwd=chained.root).returncode == 0
    assert run_cli("verify-patches", cwd=chained.root).returncode == 0
    assert run_cli("status", cwd=chained.root).returncode == 0


@pytest.mark.parametrize("text, fragment", [
    ("{", "not valid JSON"),
    ('{"version": 1, "base_tree": 5, "patches": []}', "base_tree"),
    ('{"version": 1, "base_tree": "%s", "patches": [{"name": 1, "sha256": "x", "tree": "y"}]}' % ("a" * 40), "name"),
])
def test_malformed_chain_lock_is_one_line_exit_2(chained: Proj, text: str, fragment: str):
    (chained.patches / "chain.lock").write_text(text)
    for command in ("status", "verify-patches", "apply"):
        assert_clean_error(run_cli(command, cwd=chained.root), 2, fragment)


@pytest.mark.parametrize("old, new, fragment", [
    ("project: llama.cpp", "project: [1]", "'upstream.project' must be a string"),
    ("kind: dir", "kind: dir\n  subdir: 5", "'subdir'"),
])
def test_pin_with_a_wrong_type_is_one_line_exit_2(chained: Proj, old: str, new: str, fragment: str):
    pin = chained.root / "vendor" / "pin.yaml"
    pin.write_text(pin.read_text().replace(old, new))
    for command in ("status", "vendor status", "verify-patches"):
        assert_clean_error(run_cli(*command.split(), cwd=chained.root), 2, fragment)


# -- hostile input -------------------------------------------------------------------------------
def _written_state(proj: Proj) -> tuple:
    """Everything a refused command must leave as it was: patch files, chain.lock, the vendored repo."""
    chain = proj.chain()
    files = {p.name: p.read_bytes() for p in sorted(proj.patches.iterdir())}
    return files, chain.tree.head(), chain.tree.snapshot()


@pytest.fixture
def edited(fetched: Proj) -> Proj:
    capture(fetched, "0001-a", {"src/llama.h": "#pragma once\nint f0(void);\nint f1(void);\n"})
    fetched.write("README.md", "edited\n")
    return fetched


@pytest.mark.parametrize("quoted", [
    "diff --git a/src/x.c b/src/x.c",
    "--- a/src/x.c\n+++ b/src/x.c",
    "@@ -1,3 +1,3 @@",
    "GIT binary patch",
    "---",
])
def test_capture_refuses_a_message_git_would_read_as_a_diff(edited: Proj, quoted: str):
    before = _written_state(edited)
    done = run_cli("capture", "0002-b", "-m", f"b: subject\n\nAs in:\n{quoted}\nthe end.", cwd=edited.root)
    assert_clean_error(done, 2, "git would read")
    assert _written_state(edited) == before
    assert_clean_error(run_cli("refresh", "-m", f"a: subject\n\n{quoted}", cwd=edited.root), 2, "git would read")
    assert _written_state(edited) == before


def _hostile_patch(chained: Proj, transform) -> None:
    path = chained.patches / "0002-b.patch"
    path.write_text(transform(path.read_text()))


_NEW_FILE = ("diff --git a/{p} b/{p}\nnew file mode {mode}\nindex 0000000000000000000000000000000000000000..{blob}\n"
             "--- /dev/null\n+++ b/{p}\n@@ -0,0 +1 @@\n+{line}\n")


@pytest.mark.parametrize("transform, fragment", [
    (lambda t: t.replace("\n---\n", "\n--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# tiny upstream\n+# owned\n---\n", 1),
     "git would read"),
    (lambda t: t + _NEW_FILE.format(p="build/evil.c", mode="100644", blob="1" * 40, line="x"), "excluded from the tree"),
    (lambda t: t + _NEW_FILE.format(p="src/__pycache__/m.pyc", mode="100644", blob="1" * 40, line="x"), "excluded from the tree"),
    (lambda t: t + _NEW_FILE.format(p="sub", mode="160000", blob="1" * 40, line="Subproject commit " + "1" * 40), "gitlink"),
    (lambda t: t.replace("index ", "old mode 100644\nnew mode 104755\nindex ", 1).replace(" 100644\n--- a/", "\n--- a/", 1), "mode 104755"),
    (lambda t: t + _NEW_FILE.format(p="src/open.c", mode="100666", blob="1" * 40, line="x"), "mode 100666"),
    (lambda t: t.replace("a/src/llama.cpp", '"a/src/\\377x"').replace("b/src/llama.cpp", '"b/src/\\377x"'), "not UTF-8"),
])
def test_hostile_patch_files_are_refused_before_anything_moves(chained: Proj, transform, fragment):
    _hostile_patch(chained, transform)
    before = _written_state(chained)
    for command in ("lock", "apply", "status", "verify-patches"):
        assert_clean_error(run_cli(command, cwd=chained.root), 2, fragment)
    assert _written_state(chained) == before


def test_bad_message_arguments_are_one_line_exit_2(edited: Proj, tmp_path: Path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9: subject\n".encode("latin-1"))
    before = _written_state(edited)
    for args, fragment in [
        (("-F", str(tmp_path / "missing.txt")), "missing.txt"),
        (("-F", str(tmp_path)), "is a folder"),
        (("-F", str(latin1)), "not UTF-8"),
        (("-m", "   "), "empty"),
        (("-m", "subject\n\nbody \x1b[31m red"), "control character"),
    ]:
        assert_clean_error(run_cli("capture", "0002-b", *args, cwd=edited.root), 2, fragment)
        assert_clean_error(run_cli("refresh", *args, cwd=edited.root), 2, fragment)
    for status, fragment in [("", "--upstream-status"), ("Whatever", "--upstream-status"), ("Pending\nSigned-off-by: x", "--upstream-status")]:
        assert_clean_error(run_cli("capture", "0002-b", "--upstream-status", status, cwd=edited.root), 2, fragment)
    assert_clean_error(run_cli("capture", "0002-b", "--author", "x\nSubject: evil", cwd=edited.root), 2, "--author")
    assert _written_state(edited) == before


def test_junit_into_a_missing_folder_is_one_line_exit_2(chained: Proj, tmp_path: Path):
    assert run_cli("apply", cwd=chained.root).returncode == 0
    for target in (tmp_path / "missing" / "report.xml", tmp_path):
        assert_clean_error(run_cli("verify-patches", "--junit", str(target), cwd=chained.root), 2, "--junit")
    done = run_cli("verify-patches", "--junit", str(tmp_path / "report.xml"), cwd=chained.root)
    assert done.returncode == 0 and "<testsuite" in (tmp_path / "report.xml").read_text()


def test_message_and_message_file_together_are_refused(edited: Proj, tmp_path: Path):
    (tmp_path / "msg.txt").write_text("b: subject\n")
    before = _written_state(edited)
    done = run_cli("capture", "0002-b", "-m", "b: other", "-F", str(tmp_path / "msg.txt"), cwd=edited.root)
    assert_clean_error(done, 2, "not both")
    assert _written_state(edited) == before
    done = run_cli("capture", "0002-b", "-F", str(tmp_path / "msg.txt"), "--json", cwd=edited.root)
    assert done.returncode == 0, done.stderr
    assert "Subject: [PATCH] b: subject\n" in (edited.patches / "0002-b.patch").read_text()
