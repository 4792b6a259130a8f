"""chain report: line attribution from the patch texts, rewriting pairs, touches, folds."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Proj, assert_clean_error, capture, run_cli
from polyforge.chain import patchfile, report


def _patch(name: str, diff: str) -> patchfile.Patch:
    return patchfile.parse(f"Subject: [PATCH] {name}\n\nUpstream-Status: Pending\n---\n{diff}".encode(), name, Path(name))


ADD = """diff --git a/f.c b/f.c
--- a/f.c
+++ b/f.c
@@ -2,0 +3,4 @@
+int added_one;
+int added_two;
+{
+int added_three;
"""
# rewrites one added line and one trivial added line, and a baseline line
REWRITE = """diff --git a/f.c b/f.c
--- a/f.c
+++ b/f.c
@@ -1,6 +1,5 @@
-line1
+LINE1
 line2
-int added_one;
+int added_ONE;
 int added_two;
-{
 int added_three;
"""
NEW_FILE = """diff --git a/g.c b/g.c
new file mode 100644
--- /dev/null
+++ b/g.c
@@ -0,0 +1,2 @@
+int g1;
+int g2;
"""
DELETE_FILE = """diff --git a/g.c b/g.c
deleted file mode 100644
--- a/g.c
+++ /dev/null
@@ -1,2 +0,0 @@
-int g1;
-int g2;
"""
OTHER = """diff --git a/h.c b/h.c
--- a/h.c
+++ b/h.c
@@ -1 +1 @@
-h
+H
"""


def test_a_later_patch_rewriting_added_lines_is_a_pair():
    chain = [_patch("0001-a.patch", ADD), _patch("0002-other.patch", OTHER), _patch("0003-b.patch", REWRITE)]
    built = report.build(chain)
    assert len(built.rewrites) == 1
    pair = built.rewrites[0]
    assert (pair.earlier, pair.later) == ("0001-a.patch", "0003-b.patch")
    assert (pair.lines, pair.trivial_lines, pair.files) == (1, 1, {"f.c": 1})
    assert built.touches == {"f.c": ["0001-a.patch", "0003-b.patch"], "h.c": ["0002-other.patch"]}
    assert built.changed_lines == 4 + 2 + 5
    [fold] = built.folds
    assert (fold.first, fold.last, fold.rewrites) == ("0001-a.patch", "0003-b.patch", 1)
    assert fold.unrelated == ["0002-other.patch"]  # touches none of the run's files: move it out first


def test_baseline_lines_are_nobody_s_and_hunks_far_down_are_placed():
    far = """diff --git a/f.c b/f.c
--- a/f.c
+++ b/f.c
@@ -500,3 +500,3 @@
 a
-b
+B
 c
"""
    built = report.build([_patch("0001-a.patch", far), _patch("0002-b.patch", far.replace("-b\n+B", "-B\n+b2"))])
    assert [(r.earlier, r.later, r.lines) for r in built.rewrites] == [("0001-a.patch", "0002-b.patch", 1)]


def test_a_file_deleted_later_vanishes():
    built = report.build([_patch("0001-new.patch", NEW_FILE), _patch("0002-gone.patch", DELETE_FILE)])
    assert built.vanished == [("0001-new.patch", "g.c")]
    assert built.rewrites[0].lines == 2


def test_a_chain_without_overlap_has_no_pairs():
    built = report.build([_patch("0001-a.patch", ADD), _patch("0002-other.patch", OTHER)])
    assert built.rewrites == [] and built.folds == [] and built.vanished == []


def test_cli_report_and_its_ci_check(fetched: Proj):
    capture(fetched, "0001-first", {"src/llama.cpp": fetched.read("src/llama.cpp").replace("return 5;", "return 50;")})
    capture(fetched, "0002-second", {"src/llama.cpp": fetched.read("src/llama.cpp").replace("return 50;", "return 500;")})
    done = run_cli("chain", "report", "--json", cwd=fetched.root)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["rewrites"][0]["earlier"] == "0001-first.patch" and data["rewritten_lines"] == 1
    assert data["folds"][0]["patches"] == ["0001-first.patch", "0002-second.patch"]
    assert run_cli("chain", "report", "--max-rewrites", "1", cwd=fetched.root).returncode == 0
    assert_clean_error(run_cli("chain", "report", "--max-rewrites", "0", cwd=fetched.root), 1, "rewrite")
