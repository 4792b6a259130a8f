"""Strict patch reading: every malformed or unsafe patch is a one-line BadInput."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyforge import patchfile
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


def test_good_patch_parses():
    patch = parse(GOOD)
    assert patch.header.subject == "demo: change a line"
    assert patch.header.trailer("Upstream-Status") == "Pending"
    assert [(c.path, c.kind) for c in patch.changes] == [("src/a.c", "modified"), ("src/new.c", "added")]
    assert patchfile.render(patch.header, patch.diff) == GOOD.encode(), "render(parse(x)) == x for canonical x"


@pytest.mark.parametrize("mutate, fragment", [
    (lambda t: t.replace("\n", "\r\n"), "CRLF"),
    (lambda t: t[: t.index("+TWO")], "truncated"),
    (lambda t: t[:-1], "no final newline"),
    (lambda t: t.replace(" three\n", " three\n more\n"), "corrupt"),
    (lambda t: t.replace("a/src/a.c b/src/a.c", "a/../etc/passwd b/../etc/passwd"), "escapes the tree"),
    (lambda t: t.replace("a/src/a.c b/src/a.c", "a//etc/passwd b//etc/passwd"), "absolute path"),
    (lambda t: t.replace("--- a/src/a.c", "--- a/../../x"), "escapes the tree"),
    (lambda t: t.replace("a/src/new.c b/src/new.c", "a/.git/config b/.git/config"), "git metadata"),
    (lambda t: t.replace("new file mode 100644", "new file mode 120000"), "symlink"),
    (lambda t: t.replace("@@ -0,0 +1 @@\n+new\n", "GIT binary patch\nliteral 3\nKcmZ?\n"), "binary hunk"),
    (lambda t: t.replace("--- /dev/null\n+++ b/src/new.c\n@@ -0,0 +1 @@\n+new\n", "Binary files /dev/null and b/src/new.c differ\n"), "binary hunk"),
    (lambda t: t.split("---\n", 1)[0], "no 'diff --git'"),
    (lambda t: t.replace("diff --git a/src/new.c b/src/new.c", "diff --git a/src/old.c b/src/new.c"), "renames"),
    (lambda t: t.replace("@@ -1,3 +1,3 @@", "@@ -1,x +1,3 @@"), "malformed hunk"),
    (lambda t: "", "empty"),
])
def test_bad_patches(mutate, fragment):
    with pytest.raises(BadInput, match=fragment):
        parse(mutate(GOOD))


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
