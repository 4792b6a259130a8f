"""Strict patch reading: every malformed or unsafe patch is a one-line BadInput."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from polyforge.chain import patchfile
from polyforge.errors import BadInput

GOOD = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: polyforge <polyforge@localhost>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: [PATCH] demo: change a line

Why: because.

Upstream-Status: Pending
---
diff --git a/src/a.c b/src/a.c
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/src/a.c
+++ b/src/a.c
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
diff --git a/src/new.c b/src/new.c
new file mode 100644
index 0000000000000000000000000000000000000000..3333333333333333333333333333333333333333
--- /dev/null
+++ b/src/new.c
@@ -0,0 +1 @@
+new
"""


def parse(text: str):
    return patchfile.parse(text.encode(), "0001-demo.patch", Path("0001-demo.patch"))


def assert_refused(text: str, fragment: str) -> None:
    with pytest.raises(BadInput, match=fragment):
        parse(text)


def _new_file_at(path: str) -> str:
    """GOOD with its added file at `path`."""
    return GOOD.replace("src/new.c", path)


def test_good_patch_parses():
    patch = parse(GOOD)
    assert patch.header.subject == "demo: change a line"
    assert patch.header.trailer("Upstream-Status") == "Pending"
    assert [(c.path, c.kind) for c in patch.changes] == [("src/a.c", "modified"), ("src/new.c", "added")]
    assert patchfile.render(patch.header, patch.diff) == GOOD.encode(), "render(parse(x)) == x for canonical x"


MUTATIONS = Path(__file__).resolve().parents[1] / "data" / "patchfile-mutations.yaml"


def _found(text: str, part: str) -> str:
    assert part in text, f"the mutation names {part!r}, which GOOD does not hold"
    return part


# one operation on GOOD per row of MUTATIONS (its header says what each does)
MUTATE = {
    "replace": lambda t, arg: t.replace(_found(t, arg[0]), arg[1]),
    "cut_before": lambda t, mark: t[: t.index(mark)],
    "split_before": lambda t, sep: t.split(_found(t, sep), 1)[0],
    "append_from": lambda t, mark: t + t[t.index(mark):],
    "drop_last": lambda t, n: t[:-n],
    "text": lambda t, text: text,
}


def _mutations() -> list:
    rows = yaml.safe_load(MUTATIONS.read_text(encoding="utf-8"))
    params = []
    for row in rows:
        (op, arg), = ((k, v) for k, v in row.items() if k != "fragment")
        params.append(pytest.param(op, arg, row["fragment"], id=f"{op}-{row['fragment']}"))
    return params


@pytest.mark.parametrize("op, arg, fragment", _mutations())
def test_bad_patches(op, arg, fragment):
    assert_refused(MUTATE[op](GOOD, arg), fragment)


def test_not_utf8():
    with pytest.raises(BadInput, match="UTF-8"):
        patchfile.parse(b"\xff\xfe" + GOOD.encode(), "0001-x.patch", Path("x"))


@pytest.mark.parametrize("name, ok", [("0072-poly-kv-pool", True), ("0072-poly-kv-pool.patch", True),
                                      ("72-x", False), ("0072_x", False), ("0072-X", False), ("abcd-x", False)])
def test_names(name, ok):
    if ok:
        assert patchfile.check_name(name).endswith(".patch")
    else:
        with pytest.raises(BadInput, match="bad patch name"):
            patchfile.check_name(name)


def test_quoted_paths_are_unquoted_and_checked():
    text = GOOD.replace("diff --git a/src/new.c b/src/new.c", 'diff --git "a/src/n\\303\\251w.c" "b/src/n\\303\\251w.c"')
    text = text.replace("+++ b/src/new.c", '+++ "b/src/n\\303\\251w.c"')
    patch = parse(text)
    assert patch.changes[1].path == "src/néw.c"


# -- hostile input -------------------------------------------------------------------------------
def test_parse_errors_count_lines_from_the_top_of_the_file():
    # GOOD's '+TWO' is line 17 of the file (line 8 of its diff section)
    assert_refused(GOOD.replace("+TWO\n", "*TWO\n"), r"line 17: corrupt hunk line")


# class 2: trailers
def test_trailers_are_the_last_paragraph_of_the_body():
    header = parse(GOOD.replace("Upstream-Status: Pending\n", "Signed-off-by: A <a@x>\nUpstream-Status: Pending\n")).header
    assert header.description() == "Why: because."
    assert header.trailers() == ["Signed-off-by: A <a@x>", "Upstream-Status: Pending"]


def test_merge_trailers_collapses_duplicates_and_keeps_one_upstream_status():
    merged = patchfile.merge_trailers(["Signed-off-by: A <a@x>", "Upstream-Status: Pending", "Acked-by: B <b@x>"],
                                      ["Signed-off-by: A <a@x>", "Signed-off-by: C <c@x>", "upstream-status: Submitted"])
    assert merged == ["Signed-off-by: A <a@x>", "Upstream-Status: Submitted", "Acked-by: B <b@x>", "Signed-off-by: C <c@x>"]


def test_canonical_header_has_one_upstream_status():
    # what older polyforge wrote: Upstream-Status appended as a paragraph of its own, again and again
    legacy = GOOD.replace("Upstream-Status: Pending\n", "Upstream-Status: Pending\n\nUpstream-Status: Pending\n\nUpstream-Status: Pending\n")
    header = parse(legacy).header
    assert header.canonical().body == "Why: because.\n\nUpstream-Status: Pending"
    assert parse(GOOD).header.canonical() == parse(GOOD).header, "a canonical header stays as it is"


# class 3: nothing before the first 'diff --git' may read as a diff to git
@pytest.mark.parametrize("quoted", [
    "--- a/src/b.c\n+++ b/src/b.c\n@@ -1 +1 @@\n-x\n+y\n",
    "@@ -1,3 +1,3 @@\n",
    "GIT binary patch\nliteral 3\n",
    "---\nmore words\n",
])
def test_description_lines_git_would_read_as_a_diff_are_refused(quoted):
    assert_refused(GOOD.replace("Why: because.\n", f"Why: because.\n{quoted}"), "git would read")


def test_diff_lines_between_the_separator_and_the_diff_are_refused():
    assert_refused(GOOD.replace("---\ndiff --git a/src/a.c", "---\n--- a/src/b.c\n+++ b/src/b.c\n@@ -1 +1 @@\n-x\n+y\ndiff --git a/src/a.c"), "git would read")


# class 6: states with no way out
@pytest.mark.parametrize("path", ["build/x.c", "build-cuda/CMakeCache.txt", "__pycache__/m.pyc", "gguf-py/gguf/__pycache__/m.pyc"])
def test_paths_excluded_from_the_tree_identity_are_refused(path):
    assert_refused(_new_file_at(path), "excluded from the tree")


@pytest.mark.parametrize("path", ["build", "src/build/x.c", "build.sh", "buildx/y.c", "src/__pycache__.txt"])
def test_paths_that_only_look_excluded_are_fine(path):
    assert parse(_new_file_at(path)).changes[1].path == path


def test_gitlinks_are_refused():
    assert_refused(GOOD.replace("new file mode 100644", "new file mode 160000"), "gitlink")


# class 7: file modes
@pytest.mark.parametrize("mutate", [
    lambda t: t.replace("new file mode 100644", "new file mode 100666"),
    lambda t: t.replace("new file mode 100644", "new file mode 100777"),
    lambda t: t.replace("index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644",
                        "old mode 100644\nnew mode 104755\nindex 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222"),
    lambda t: t.replace("index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644",
                        "old mode 100777\nnew mode 100644\nindex 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222"),
    lambda t: t.replace("2222222222222222222222222222222222222222 100644", "2222222222222222222222222222222222222222 100664"),
])
def test_file_modes_other_than_644_and_755_are_refused(mutate):
    assert_refused(mutate(GOOD), "mode")


def test_mode_change_to_755_is_fine():
    text = GOOD.replace("index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644",
                        "old mode 100644\nnew mode 100755\nindex 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222")
    assert parse(text).changes[0].kind == "mode"


def test_deleting_a_symlink_or_gitlink_is_refused():
    deletion = GOOD.replace("new file mode 100644", "deleted file mode 120000").replace(
        "--- /dev/null\n+++ b/src/new.c\n@@ -0,0 +1 @@\n+new\n", "--- a/src/new.c\n+++ /dev/null\n@@ -1 +0,0 @@\n-new\n")
    assert_refused(deletion, "symlink")


# class 8: quoted paths as git writes them
def _quoted(path: str) -> str:
    text = GOOD.replace("diff --git a/src/new.c b/src/new.c", f'diff --git "a/{path}" "b/{path}"')
    return text.replace("+++ b/src/new.c", f'+++ "b/{path}"')


def test_quoted_octal_utf8_is_a_legal_name():
    assert parse(_quoted("src/a\\342\\210\\225b.c")).changes[1].path == "src/a\u2215b.c"


def test_quoted_name_with_a_literal_non_latin1_character():
    # core.quotepath=false: git quotes a path with a tab but leaves its UTF-8 as it is
    assert_refused(_quoted("src/\u2215\\tb.c"), "control character")
    assert parse(_quoted('src/\u2215 \\"q\\".c')).changes[1].path == 'src/\u2215 "q".c'


@pytest.mark.parametrize("text, fragment", [
    (_quoted("src/\\377x"), "not UTF-8"),
    (_quoted("src/\\u2215"), "bad escape"),
    (_quoted("src/x\\"), "cannot read file names"),
    (_quoted("src/\\0x"), "bad escape"),
    (_quoted("src/\\000x"), "control character"),
    # paths git would refuse or normalise
    (_new_file_at("src/.git/hooks/pre-commit"), "git metadata"),
    (_new_file_at(".GIT/config"), "git metadata"),
    (_new_file_at("src/./new.c"), "escapes the tree"),
    (_new_file_at("src//new.c"), "escapes the tree"),
    # too long to check out
    (_new_file_at("src/" + "x" * 256 + ".c"), "too long"),
    (_new_file_at("/".join(["d" * 200] * 21) + "/x.c"), "too long"),
])
def test_bad_names_are_refused(text, fragment):
    assert_refused(text, fragment)


def test_unquoted_name_with_a_space():
    text = GOOD.replace("src/new.c", "src/new file.c")
    assert parse(text).changes[1].path == "src/new file.c"


def test_a_folded_subject_is_unfolded_as_git_am_reads_it():
    text = GOOD.replace("Subject: [PATCH] demo: change a line", "Subject: [PATCH] demo: change\n a line")
    assert parse(text).header.subject == "demo: change a line"


def test_a_no_newline_marker_must_follow_a_hunk_line():
    assert_refused(GOOD.replace("@@ -1,3 +1,3 @@\n", "@@ -1,3 +1,3 @@\n\\ No newline at end of file\n"), "corrupt hunk line")
    assert parse(GOOD.replace("+new\n", "+new\n\\ No newline at end of file\n")).changes[1].kind == "added"


def test_canonical_date_is_the_day():
    header = parse(GOOD.replace("00:00:00 +0000", "13:45:10 -0700")).header
    assert header.canonical().date == "Sun, 29 Nov 2026 00:00:00 +0000"


def test_parse_message():
    assert patchfile.parse_message("s: x\r\n\r\nbody\r\n\r\nSigned-off-by: A <a@x>\r\n") == ("s: x", "body", ["Signed-off-by: A <a@x>"])
    assert patchfile.parse_message("\n\n  s: x  \n") == ("s: x", "", [])
    with pytest.raises(BadInput, match="Upstream-Status"):
        patchfile.parse_message("s\n\nUpstream-Status: Maybe")
    with pytest.raises(BadInput, match="line 4: git would read"):
        patchfile.parse_message("\ns\n\n@@ -1 +1 @@")


def test_names_take_ascii_digits_only():
    with pytest.raises(BadInput, match="bad patch name"):
        patchfile.check_name("\u0660\u0660\u0660\u0669-x")


def test_only_regular_files_are_read(tmp_path):
    import os
    (tmp_path / "real.patch").write_text(GOOD)
    (tmp_path / "0001-link.patch").symlink_to(tmp_path / "real.patch")
    os.mkfifo(tmp_path / "0002-fifo.patch")
    (tmp_path / "0003-dir.patch").mkdir()
    with pytest.raises(BadInput, match="symlink"):
        patchfile.read(tmp_path / "0001-link.patch")
    for name in ("0002-fifo.patch", "0003-dir.patch"):
        with pytest.raises(BadInput, match="not a regular file"):
            patchfile.read(tmp_path / name)


def test_a_captured_crlf_line_round_trips(fetched):
    """A CR at the end of a content line (a file with CRLF endings) is legitimate content, not a
    CRLF patch: capture takes it, the patch is canonical (refresh --check clean), verify passes,
    and unapply/apply reproduce the bytes, CR included."""
    from conftest import capture
    from polyforge.chain import verify
    original = (fetched.tree / "ggml/src/ggml.c").read_bytes()
    edited = original.replace(b"// line 10\n", b"// line 10\n// a CRLF line\r\n", 1)
    (fetched.tree / "ggml/src/ggml.c").write_bytes(edited)
    info = capture(fetched, "0001-crlf-line", {})
    data = (fetched.patches / "0001-crlf-line.patch").read_bytes()
    assert b"\n+// a CRLF line\r\n" in data
    assert patchfile.read(fetched.patches / "0001-crlf-line.patch").sha256 == info["sha256"]
    chain = fetched.chain()
    assert chain.refresh(check=True) == {"name": "0001-crlf-line.patch", "changed": False}
    proof = verify.verify(chain)
    assert proof.ok, proof.problems
    chain.unapply()
    assert (fetched.tree / "ggml/src/ggml.c").read_bytes() == original
    chain.apply()
    assert (fetched.tree / "ggml/src/ggml.c").read_bytes() == edited
    assert fetched.chain().lock_drift(fetched.chain().patches()) == []
