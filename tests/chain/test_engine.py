"""apply / unapply / capture / refresh / lock / status on synthetic projects."""

from __future__ import annotations

import pytest

from conftest import UPSTREAM_FILES, Proj, capture, make_upstream, write_pin
from polyforge.upstream import vendor
from polyforge.chain.engine import run_chain
from polyforge.chain.lockfile import LockEntry
from polyforge.chain import patchfile
from polyforge.upstream.workspace import DirtyTree
from polyforge.errors import BadInput, VerificationFailed
from polyforge.chain.lockfile import ChainLock


def _three(fetched: Proj) -> None:
    capture(fetched, "0001-first", {"src/llama.cpp": fetched.read("src/llama.cpp").replace("return 5;", "return 50;"),
                                    "src/added.c": "int added;\n"}, "first: change f5\n\nBecause tests.")
    capture(fetched, "0002-second", {"ggml/src/ggml.c": fetched.read("ggml/src/ggml.c").replace("// line 60\n", "// LINE 60\n"),
                                     "docs/build.md": None})
    capture(fetched, "0003-third", {"src/llama.cpp": fetched.read("src/llama.cpp").replace("return 40;", "return 400;"),
                                    "README.md": fetched.read("README.md") + "patched\n"})


def test_capture_writes_canonical_patch_and_lock(fetched: Proj):
    info = capture(fetched, "0001-first", {"src/llama.cpp": "changed\n", "src/new.c": "x\n"}, "first: change\n\nWhy.")
    path = fetched.patches / "0001-first.patch"
    data = path.read_bytes()
    assert info["name"] == "0001-first.patch"
    patch = patchfile.read(path)
    assert patch.header.subject == "first: change"
    assert patch.header.trailer("Upstream-Status") == "Pending"
    assert {c.path for c in patch.changes} == {"src/llama.cpp", "src/new.c"}
    assert b"\r" not in data
    lock = ChainLock.read(fetched.patches / "chain.lock")
    assert lock.patches[0].sha256 == patch.sha256 and lock.patches[0].tree == info["tree"]
    assert fetched.chain().live_changes() == []


def test_unapply_apply_round_trip_restores_bytes_and_modes(fetched: Proj):
    _three(fetched)
    chain = fetched.chain()
    live = chain.tree.snapshot()
    assert [r["name"] for r in chain.unapply()] == ["0003-third.patch", "0002-second.patch", "0001-first.patch"]
    assert chain.tree.snapshot() == fetched.upstream.tree
    assert not (fetched.tree / "src/added.c").exists() and (fetched.tree / "docs/build.md").exists()
    report = chain.apply()
    assert [r["status"] for r in report] == ["applied"] * 3
    assert chain.tree.snapshot() == live


def test_apply_is_idempotent_and_to_is_honoured(fetched: Proj):
    _three(fetched)
    chain = fetched.chain()
    chain.unapply()
    chain.apply(to="0002")
    assert [a.name for a in chain.tree.applied()] == ["0001-first.patch", "0002-second.patch"]
    report = chain.apply()
    assert [r["status"] for r in report] == ["already applied", "already applied", "applied"]
    assert chain.apply() == [{"name": n, "status": "already applied"} for n in
                             ("0001-first.patch", "0002-second.patch", "0003-third.patch")]
    chain.unapply(to="0001")
    assert [a.name for a in chain.tree.applied()] == ["0001-first.patch"]


def test_failing_patch_leaves_tree_exactly_as_before(fetched: Proj):
    _three(fetched)
    chain = fetched.chain()
    chain.unapply()
    # a 0004 whose context is not in the tree once 0001-0003 apply
    bad = (fetched.patches / "0001-first.patch").read_text().replace("0001-first", "0004-bad")
    (fetched.patches / "0004-bad.patch").write_text(bad)
    # the lock is stale now: apply must refuse on drift first
    with pytest.raises(VerificationFailed, match="drift"):
        chain.apply()
    # even with the lock forced aside, nothing moves when a patch fails mid-chain
    lock = ChainLock.read(fetched.patches / "chain.lock")
    from polyforge.chain.lockfile import LockEntry
    import hashlib
    extra = LockEntry("0004-bad.patch", hashlib.sha256(bad.encode()).hexdigest(), "0" * 40)
    ChainLock(lock.base_tree, lock.pack_base_tree, lock.patches + (extra,)).write(fetched.patches / "chain.lock")
    before = chain.tree.snapshot()
    with pytest.raises(VerificationFailed, match="0004-bad.patch does not apply"):
        chain.apply()
    assert chain.tree.snapshot() == before
    assert chain.tree.applied() == []


def test_dirty_tree_is_never_overwritten(fetched: Proj):
    _three(fetched)
    chain = fetched.chain()
    chain.unapply(to="0002")
    fetched.write("README.md", "user edit\n")
    with pytest.raises(DirtyTree, match="README.md"):
        chain.apply()
    with pytest.raises(DirtyTree, match="README.md"):
        chain.unapply()
    assert fetched.read("README.md") == "user edit\n"


def test_capture_position_rules(fetched: Proj):
    _three(fetched)
    chain = fetched.chain()
    fetched.write("src/llama.h", "edited\n")
    with pytest.raises(BadInput, match="sort before the applied"):
        chain.capture("0002-late")
    with pytest.raises(BadInput, match="exists already"):
        chain.capture("0003-third")
    chain.refresh()  # fold the edit into the top patch instead
    chain.unapply(to="0001")
    fetched.write("src/inserted.c", "inserted\n")
    with pytest.raises(BadInput, match="sort after the unapplied"):
        chain.capture("0005-x")
    info = chain.capture("0001-inserted")
    assert info["name"] == "0001-inserted.patch"
    chain.apply()
    assert [a.name for a in chain.tree.applied()] == ["0001-first.patch", "0001-inserted.patch",
                                                       "0002-second.patch", "0003-third.patch"]


def test_capture_without_edits_and_bad_names(fetched: Proj):
    with pytest.raises(BadInput, match="no live edits"):
        fetched.chain().capture("0001-x")
    with pytest.raises(BadInput, match="bad patch name"):
        fetched.chain().capture("first")


def test_patches_that_is_a_file_is_bad_input_everywhere(fetched: Proj):
    """patches/ a regular file: every command that reads the chain says so in one BadInput line
    (not a NotADirectoryError from reading patches/chain.lock), and nothing is written."""
    import shutil
    from polyforge.chain.engine import discover
    from polyforge.chain.status import read as read_status
    fetched.write("src/llama.cpp", fetched.read("src/llama.cpp") + "// an edit to capture\n")
    shutil.rmtree(fetched.patches)
    fetched.patches.write_text("not a folder\n")
    head = fetched.chain().tree.head()
    chain = fetched.chain()
    with pytest.raises(BadInput, match="patches: is not a folder"):
        discover(chain.project)
    for command in (chain.patches, chain.apply, chain.relock, lambda: read_status(chain),
                    lambda: chain.capture("0005-x"), chain.refresh, lambda: chain.unapply()):
        with pytest.raises(BadInput, match="patches: is not a folder"):
            command()
    assert fetched.patches.read_text() == "not a folder\n"
    assert chain.tree.head() == head


def test_capture_refuses_binary_files(fetched: Proj):
    (fetched.tree / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    with pytest.raises(BadInput, match="binary"):
        fetched.chain().capture("0001-bin")
    assert list(fetched.patches.glob("*.patch")) == []


def test_capture_includes_mode_changes_and_deletions(fetched: Proj):
    (fetched.tree / "src/llama.h").chmod(0o755)
    (fetched.tree / "docs/more/notes.md").unlink()
    info = fetched.chain().capture("0001-modes")
    kinds = {f["path"]: f["change"] for f in info["files"]}
    assert kinds == {"src/llama.h": "mode", "docs/more/notes.md": "deleted"}
    chain = fetched.chain()
    chain.unapply()
    assert not (fetched.tree / "src/llama.h").stat().st_mode & 0o111
    chain.apply()
    assert (fetched.tree / "src/llama.h").stat().st_mode & 0o111


def test_refresh_and_check(fetched: Proj):
    capture(fetched, "0001-first", {"src/llama.h": "v1\n"})
    chain = fetched.chain()
    assert chain.refresh(check=True) == {"name": "0001-first.patch", "changed": False}
    fetched.write("src/llama.h", "v2\n")
    with pytest.raises(VerificationFailed, match="live edits beyond it"):
        chain.refresh(check=True)
    info = chain.refresh()
    assert info["changed"] and "+v2" in (fetched.patches / "0001-first.patch").read_text()
    header_before = patchfile.read(fetched.patches / "0001-first.patch").header
    chain.refresh()
    assert patchfile.read(fetched.patches / "0001-first.patch").header == header_before
    assert ChainLock.read(fetched.patches / "chain.lock").patches[0].sha256 == info["sha256"]


def test_refresh_with_a_message_rewrites_the_description(fetched: Proj):
    capture(fetched, "0001-first", {"src/llama.h": "v1\n"})
    chain = fetched.chain()
    with pytest.raises(BadInput, match="takes no message"):
        chain.refresh(check=True, message="x")
    fetched.write("src/llama.h", "v2\n")
    chain.refresh(message="llama : second subject\n\nWhy it changed.")
    header = patchfile.read(fetched.patches / "0001-first.patch").header
    assert header.subject == "llama : second subject"
    assert header.body == "Why it changed.\n\nUpstream-Status: Pending"
    assert chain.refresh(check=True)["changed"] is False


def test_refresh_below_the_top_rebases_the_unapplied_patches(fetched: Proj):
    capture(fetched, "0001-first", {"ggml/src/ggml.c": fetched.read("ggml/src/ggml.c").replace("// line 10\n", "// LINE 10\n")})
    capture(fetched, "0002-second", {"ggml/src/ggml.c": fetched.read("ggml/src/ggml.c").replace("// line 100\n", "// LINE 100\n")})
    chain = fetched.chain()
    second = (fetched.patches / "0002-second.patch").read_bytes()
    chain.unapply(to="0001")
    # two more lines in 0001 move 0002's hunk: refresh re-renders 0002, the chain stays exact
    fetched.write("ggml/src/ggml.c", fetched.read("ggml/src/ggml.c").replace("// LINE 10\n", "// LINE 10\n// a\n// b\n"))
    info = chain.refresh()
    assert info["rebased"] == ["0002-second.patch"]
    rebased = (fetched.patches / "0002-second.patch").read_bytes()
    assert rebased != second and rebased.split(b"\ndiff --git")[0] == second.split(b"\ndiff --git")[0]
    assert chain.apply()[-1]["offsets"] == []
    assert "// LINE 100" in fetched.read("ggml/src/ggml.c") and "// a\n// b\n" in fetched.read("ggml/src/ggml.c")
    assert chain.refresh(check=True)["changed"] is False


def test_capture_below_an_unapplied_patch_rebases_it(fetched: Proj):
    capture(fetched, "0002-second", {"ggml/src/ggml.c": fetched.read("ggml/src/ggml.c").replace("// line 100\n", "// LINE 100\n")})
    chain = fetched.chain()
    chain.unapply()
    fetched.write("ggml/src/ggml.c", fetched.read("ggml/src/ggml.c").replace("// line 10\n", "// line 10\n// new\n"))
    info = chain.capture("0001-first")
    assert info["rebased"] == ["0002-second.patch"]
    report = chain.apply()
    assert [r["status"] for r in report] == ["already applied", "applied"] and report[-1]["offsets"] == []
    assert fetched.chain().refresh(check=True)["changed"] is False
    from polyforge.chain.verify import verify
    assert verify(fetched.chain()).ok


def test_refresh_that_would_break_an_unapplied_patch_writes_nothing(fetched: Proj):
    capture(fetched, "0001-first", {"ggml/src/ggml.c": fetched.read("ggml/src/ggml.c").replace("// line 10\n", "// LINE 10\n")})
    capture(fetched, "0002-second", {"ggml/src/ggml.c": fetched.read("ggml/src/ggml.c").replace("// line 12\n", "// LINE 12\n")})
    chain = fetched.chain()
    chain.unapply(to="0001")
    before = {p.name: p.read_bytes() for p in fetched.patches.iterdir()}
    fetched.write("ggml/src/ggml.c", fetched.read("ggml/src/ggml.c").replace("// line 11\n", "// changed 11\n"))
    with pytest.raises(VerificationFailed, match="would break the unapplied 0002-second.patch"):
        chain.refresh()
    assert {p.name: p.read_bytes() for p in fetched.patches.iterdir()} == before


def test_refresh_check_catches_non_canonical_bytes(fetched: Proj):
    capture(fetched, "0001-first", {"src/llama.h": "v1\n"})
    path = fetched.patches / "0001-first.patch"
    path.write_text(path.read_text().replace("Upstream-Status: Pending\n---", "Upstream-Status: Pending\n\n\n---"))
    fetched.chain().relock()
    with pytest.raises(VerificationFailed, match="applied patch|changed since|non-canonical"):
        fetched.chain().refresh(check=True)


def test_offsets_need_the_flag(fetched: Proj, tmp_path):
    capture(fetched, "0001-first", {"ggml/src/ggml.c": fetched.read("ggml/src/ggml.c").replace("// line 100\n", "// LINE 100\n")})
    # another upstream whose ggml.c has two more lines on top: the hunk lands at an offset
    files = dict(UPSTREAM_FILES)
    files["ggml/src/ggml.c"] = "// extra 1\n// extra 2\n" + files["ggml/src/ggml.c"]
    shifted = make_upstream(tmp_path, files, name="shifted")
    root = tmp_path / "shifted-project"
    write_pin(root, shifted)
    (root / "patches").mkdir()
    (root / "patches" / "0001-first.patch").write_bytes((fetched.patches / "0001-first.patch").read_bytes())
    other = Proj(root, shifted)
    vendor.fetch(other.chain())
    chain = other.chain()
    with pytest.raises(VerificationFailed, match="cannot lock"):
        chain.relock()
    patch = chain.patches()[0]
    step = run_chain(chain.tree.git, shifted.tree, [patch], allow_offset=True)[0]
    ChainLock(shifted.tree, shifted.pack_tree, (LockEntry(patch.name, patch.sha256, step.tree),)).write(root / "patches/chain.lock")
    with pytest.raises(VerificationFailed, match="offset 2"):
        chain.apply()
    assert chain.tree.applied() == []
    report = chain.apply(allow_offset=True)
    assert report[-1]["offsets"] == ["hunk 1 at line 100 (offset 2)"]
    assert "// LINE 100" in other.read("ggml/src/ggml.c")


def test_status_reports_drift_and_live_edits(fetched: Proj):
    from polyforge.chain.status import read as read_status
    _three(fetched)
    fetched.write("src/llama.h", "live\n")
    path = fetched.patches / "0002-second.patch"
    path.write_text(path.read_text().replace("Upstream-Status: Pending", "Upstream-Status: Submitted"))
    info = read_status(fetched.chain()).as_dict()
    assert info["live_edits"] == [{"status": "M", "path": "src/llama.h"}]
    assert any("0002-second.patch" in d for d in info["lock_drift"])
    assert info["applied_changed"] == ["0002-second.patch"]
    assert info["ok"] is False


def test_lock_rewrites_after_intended_change(fetched: Proj):
    _three(fetched)
    chain = fetched.chain()
    chain.unapply()
    path = fetched.patches / "0002-second.patch"
    path.write_text(path.read_text().replace("Upstream-Status: Pending", "Upstream-Status: Submitted"))
    with pytest.raises(VerificationFailed, match="drift"):
        chain.apply()
    chain.relock()
    assert [r["status"] for r in chain.apply()] == ["applied"] * 3


# -- applied patches the chain no longer has, or has changed or reordered ---------
def test_status_and_unapply_with_an_applied_patch_deleted_from_patches(fetched: Proj):
    from polyforge.chain.status import read as read_status
    _three(fetched)
    (fetched.patches / "0003-third.patch").unlink()
    fetched.chain().relock()  # as after switching to a branch whose chain lacks 0003
    info = read_status(fetched.chain()).as_dict()
    assert info["applied"] == ["0001-first.patch", "0002-second.patch", "0003-third.patch"]
    assert info["applied_missing"] == ["0003-third.patch"]
    assert any("0003-third.patch" in m and "not in patches/" in m for m in info["chain_mismatch"])
    assert info["ok"] is False
    report = fetched.chain().unapply()
    assert report[0]["name"] == "0003-third.patch" and "recorded" in report[0]["status"]
    chain = fetched.chain()
    assert chain.tree.snapshot() == fetched.upstream.tree and chain.tree.applied() == []
    assert [r["status"] for r in chain.apply()] == ["applied", "applied"]
    assert read_status(fetched.chain()).ok is True


def test_status_and_unapply_after_a_renumbering(fetched: Proj):
    from polyforge.chain.status import read as read_status
    _three(fetched)
    (fetched.patches / "0001-first.patch").rename(fetched.patches / "0004-first.patch")
    fetched.chain().relock()
    info = read_status(fetched.chain()).as_dict()
    assert info["ok"] is False and info["applied_missing"] == ["0001-first.patch"]
    text = " ".join(info["chain_mismatch"])
    assert "renamed to 0004-first.patch" in text
    assert "0002-second.patch is applied as patch 2 but is patch 1 of the chain" in text
    fetched.chain().unapply()
    chain = fetched.chain()
    assert chain.tree.snapshot() == fetched.upstream.tree
    assert [r["name"] for r in chain.apply()] == ["0002-second.patch", "0003-third.patch", "0004-first.patch"]


def test_unapply_when_a_new_patch_sorts_below_the_applied_ones(fetched: Proj):
    from polyforge.chain.status import read as read_status
    _three(fetched)
    chain = fetched.chain()
    chain.unapply()
    fetched.write("src/llama.h", "zero\n")
    chain.capture("0000-zero")
    data = (fetched.patches / "0000-zero.patch").read_bytes()
    chain.unapply()
    (fetched.patches / "0000-zero.patch").unlink()
    chain.relock()
    chain.apply()
    (fetched.patches / "0000-zero.patch").write_bytes(data)  # e.g. pulled from upstream of the project
    chain.relock()
    info = read_status(fetched.chain()).as_dict()
    assert info["ok"] is False and info["applied_missing"] == []
    assert "0001-first.patch is applied as patch 1 but is patch 2 of the chain" in " ".join(info["chain_mismatch"])
    assert [r["status"] for r in fetched.chain().unapply()] == ["unapplied"] * 3
    assert [r["status"] for r in fetched.chain().apply()] == ["applied"] * 4


def test_unapply_of_a_changed_patch_restores_the_recorded_tree_and_says_so(fetched: Proj):
    from polyforge.chain.status import read as read_status
    _three(fetched)
    path = fetched.patches / "0002-second.patch"
    path.write_text(path.read_text().replace("Upstream-Status: Pending", "Upstream-Status: Submitted"))
    fetched.chain().relock()
    info = read_status(fetched.chain()).as_dict()
    assert info["applied_changed"] == ["0002-second.patch"] and info["ok"] is False
    assert any("0002-second.patch changed since it was applied" in m for m in info["chain_mismatch"])
    report = fetched.chain().unapply()
    assert "changed" in report[1]["status"] and report[1]["name"] == "0002-second.patch"
    assert fetched.chain().tree.snapshot() == fetched.upstream.tree
    assert [r["status"] for r in fetched.chain().apply()] == ["applied"] * 3


# -- hostile input: trailers, and what reaches git --------------------------------------
def test_capture_keeps_the_message_trailers_with_one_upstream_status(fetched: Proj):
    message = "first: subject\n\nWhy.\n\nSigned-off-by: A <a@x>\nUpstream-Status: Submitted [https://x/1]"
    capture(fetched, "0001-first", {"src/llama.h": "v1\n"}, message)
    header = patchfile.read(fetched.patches / "0001-first.patch").header
    assert header.body == "Why.\n\nSigned-off-by: A <a@x>\nUpstream-Status: Submitted [https://x/1]"
    fetched.write("src/llama.cpp", "v2\n")
    fetched.chain().capture("0002-second", message, upstream_status="Backport")
    header = patchfile.read(fetched.patches / "0002-second.patch").header
    assert header.body == "Why.\n\nSigned-off-by: A <a@x>\nUpstream-Status: Backport", "the explicit status wins, in place"


def test_refresh_with_a_message_keeps_the_old_trailers(fetched: Proj):
    capture(fetched, "0001-first", {"src/llama.h": "v1\n"}, "first\n\nWhy.\n\nSigned-off-by: A <a@x>")
    chain = fetched.chain()
    chain.refresh(message="first: reworded\n\nNew words.")
    header = patchfile.read(fetched.patches / "0001-first.patch").header
    assert header.body == "New words.\n\nSigned-off-by: A <a@x>\nUpstream-Status: Pending"
    chain.refresh(message="first: again\n\nNew words.\n\nSigned-off-by: A <a@x>\nUpstream-Status: Submitted")
    header = patchfile.read(fetched.patches / "0001-first.patch").header
    assert header.body == "New words.\n\nSigned-off-by: A <a@x>\nUpstream-Status: Submitted"
    assert chain.refresh(check=True)["changed"] is False


def test_duplicate_upstream_status_is_not_canonical_and_refresh_collapses_it(fetched: Proj):
    from polyforge.chain.verify import verify
    capture(fetched, "0001-first", {"src/llama.h": "v1\n"}, "first\n\nWhy.")
    path = fetched.patches / "0001-first.patch"
    path.write_text(path.read_text().replace("Upstream-Status: Pending\n", "Upstream-Status: Pending\n\nUpstream-Status: Pending\n"))
    chain = fetched.chain()
    chain.relock()
    with pytest.raises(VerificationFailed, match="not what refresh would write"):
        chain.refresh(check=True)
    proof = verify(fetched.chain())
    assert [p.canonical for p in proof.patches] == [False] and not proof.ok
    assert chain.refresh()["changed"] is True
    assert path.read_text().count("Upstream-Status") == 1
    assert verify(fetched.chain()).ok


def test_only_the_diff_section_reaches_git(fetched: Proj):
    from polyforge.chain.engine import apply_in_index
    from polyforge.git import scratch_index
    capture(fetched, "0001-first", {"src/llama.h": "v1\n"})
    chain = fetched.chain()
    patch = chain.patches()[0]
    expected = chain.chain_lock().entry(patch.name).tree
    # a description that git would apply too; the parser refuses it, this proves git never sees it either
    hostile = "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# tiny upstream\n+# owned\n---\n"
    patch.path.write_bytes(patch.data.replace(b"\n---\n", b"\n" + hostile.encode(), 1))
    with scratch_index(chain.tree.git, fetched.upstream.tree) as index:
        step = apply_in_index(index, patch)
    assert step.ok and step.tree == expected


def test_refresh_refuses_an_unsound_chain_lock_before_writing(fetched: Proj):
    capture(fetched, "0001-first", {"src/llama.h": "v1\n"})
    fetched.write("src/llama.h", "v2\n")
    lock_file = fetched.patches / "chain.lock"
    for text in ("{", lock_file.read_text().replace(fetched.upstream.tree, "0" * 40)):
        lock_file.write_text(text)
        before = {p.name: p.read_bytes() for p in fetched.patches.iterdir()}
        head = fetched.chain().tree.head()
        with pytest.raises((BadInput, VerificationFailed)):
            fetched.chain().refresh()
        assert {p.name: p.read_bytes() for p in fetched.patches.iterdir()} == before
        assert fetched.chain().tree.head() == head


THROUGH_LINK = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: hostile <hostile@localhost>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: [PATCH] write through a symlinked folder

Upstream-Status: Pending
---
diff --git a/{path} b/{path}
new file mode 100644
index 0000000000000000000000000000000000000000..3bfe2ec8400e8422a85b2aba1cd83389a3de172c
--- /dev/null
+++ b/{path}
@@ -0,0 +1 @@
+int new_fn(void) {{ return 1; }}
"""


def test_a_patch_through_a_baseline_symlink_is_unsafe_before_it_is_drift(tmp_path, cache, monkeypatch):
    """`linked -> src` in the baseline: a patch writing linked/x.c is refused as unsafe (exit 2) by
    every command that reads the chain, not reported as chain.lock drift (exit 1) first."""
    from conftest import git_tree_id
    from conftest import Upstream
    from polyforge.chain.status import read as read_status
    up = make_upstream(tmp_path)
    pruned = tmp_path / "upstream-pruned"
    for folder in (up.path, pruned):
        (folder / "linked").symlink_to("src")
        (folder / "outside").symlink_to("../..")
    up = Upstream(up.path, git_tree_id(up.path), git_tree_id(pruned))
    root = tmp_path / "project"
    write_pin(root, up)
    (root / "patches").mkdir()
    monkeypatch.chdir(root)
    p = Proj(root, up)
    vendor.fetch(p.chain())
    p.chain().relock()
    capture(p, "0001-ok", {"linkedfoo.c": "a file whose name only starts like the link\n"})
    head = p.chain().tree.head()
    for path in ("linked/through.c", "outside/pwned.c", "linked"):
        (p.patches / "0002-through.patch").write_text(THROUGH_LINK.format(path=path))
        chain = p.chain()
        for command in (chain.patches, chain.apply, chain.relock, lambda: read_status(chain),
                        lambda: chain.capture("0003-more"), chain.refresh):
            with pytest.raises(BadInput, match=f"{path} goes through the symlink {path.split('/')[0]}"):
                command()
        assert chain.tree.head() == head


def test_unapply_refuses_a_malformed_chain_lock(chained: Proj):
    chained.chain().apply()
    before = chained.chain().tree.head()
    (chained.patches / "chain.lock").write_text("{ not json\n")
    with pytest.raises(BadInput, match="chain.lock"):
        with chained.chain().exclusive():
            chained.chain().unapply()
    assert chained.chain().tree.head() == before
