"""review_patch on tiny synthetic upstreams: each finding kind fires when it should, and a
clean replay gives none."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyforge.git import Git, scratch_index
from polyforge.chain import review as review_module
from polyforge.chain.review import FAR_LINES, KINDS, Finding, review_patch


@pytest.fixture
def repo(tmp_path: Path) -> Git:
    git = Git(tmp_path)
    git.run("init", "-q")
    return git


def trees(repo: Git, **named: dict[str, str]) -> dict[str, str]:
    """Tree ids of the named {path: text} dicts: one hash-object for every text, then a
    scratch index per distinct tree (the tests make hundreds of trees: keep git calls few)."""
    texts = sorted({text for files in named.values() for text in files.values()})
    folder = repo.cwd / "texts"
    folder.mkdir(exist_ok=True)
    for i, text in enumerate(texts):
        (folder / str(i)).write_text(text)
    paths = "\n".join(str(folder / str(i)) for i in range(len(texts)))
    blob = dict(zip(texts, repo.run("hash-object", "-w", "--stdin-paths", input=paths.encode()).split()))
    made: dict[tuple, str] = {}
    with scratch_index(repo) as index:
        for files in named.values():
            key = tuple(sorted(files.items()))
            if key not in made:
                index.run("read-tree", "--empty")
                entries = "".join(f"100644 {blob[text]}\t{path}\n" for path, text in files.items())
                index.run("update-index", "--index-info", input=entries.encode())
                made[key] = index.write_tree()
    return {name: made[tuple(sorted(files.items()))] for name, files in named.items()}


def tree(repo: Git, files: dict[str, str]) -> str:
    return trees(repo, tree=files)["tree"]


def funcs(first: int, last: int, name: str = "calc", body: int = 6) -> str:
    """C-like functions calc<first>..calc<last-1>, body + 6 lines each, no two lines alike."""
    out = []
    for k in range(first, last):
        out += [f"int {name}{k}(int x)", "{", f"    int y{k} = x * {k};"]
        out += [f"    y{k} += {j} * x + {k};" for j in range(body)]
        out += [f"    return y{k};", "}", ""]
    return "\n".join(out) + "\n"


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def review(repo: Git, old_base: dict, new_base: dict, old_post: dict, new_post: dict,
           old_pre: dict | None = None, new_pre: dict | None = None) -> list[Finding]:
    findings = review_patch(repo, **trees(repo, old_base=old_base, new_base=new_base, old_post=old_post,
                                          new_post=new_post, old_pre=old_pre or old_base, new_pre=new_pre or new_base))
    assert all(f.kind in KINDS for f in findings)
    return findings


def kinds(findings: list[Finding]) -> list[str]:
    return [f.kind for f in findings]


TABLE = "static int table[] = {\n    1, 2, 3,\n    4, 5, 6,\n    7, 8, 9,\n};\n\n"
PATCH_OLD, PATCH_NEW = "    y30 += 2 * x + 30;", "    y30 += 2 * x + 30 + calc3(x);"


def replay(base: dict[str, str], old: str = PATCH_OLD, new: str = PATCH_NEW) -> dict[str, str]:
    return {**base, "src/calc.c": edit(base["src/calc.c"], old, new)}


# -- a clean replay ---------------------------------------------------------------------------
def test_clean_replay_with_upstream_lines_above_gives_nothing(repo: Git):
    old_base = {"src/calc.c": funcs(0, 50), "README.md": "calc\n"}
    added = "".join(f"/* upstream note {i} */\n" for i in range(FAR_LINES - 10))
    new_base = {**old_base, "src/calc.c": added + funcs(0, 50)}
    assert review(repo, old_base, new_base, replay(old_base), replay(new_base)) == []


def test_identical_trees_give_nothing(repo: Git):
    base = {"src/calc.c": funcs(0, 50)}
    assert review(repo, base, base, replay(base), replay(base)) == []


# -- far-hunk --------------------------------------------------------------------------------
def test_no_far_hunk_when_upstream_edits_above_explain_the_move(repo: Git):
    old_base = {"src/calc.c": funcs(0, 50)}
    added = "".join(f"/* upstream note {i} */\n" for i in range(150))
    new_base = {"src/calc.c": added + funcs(0, 50)}
    assert review(repo, old_base, new_base, replay(old_base), replay(new_base)) == []


def test_far_hunk_when_the_hunk_stayed_put_but_its_code_moved(repo: Git):
    # upstream put 144 lines above calc30; the replay edits whatever now sits at calc30's old lines
    old_base = {"src/calc.c": funcs(0, 50)}
    new_base = {"src/calc.c": "".join(f"/* upstream note {i} */\n" for i in range(144)) + funcs(0, 50)}
    stayed = replay(new_base, "    y18 += 2 * x + 18;", "    y18 += 2 * x + 18 + calc3(x);")
    findings = review(repo, old_base, new_base, replay(old_base), stayed)
    assert kinds(findings) == ["far-hunk", "interdiff"]
    assert findings[0].detail == "hunk 1 of src/calc.c moved +0 lines (old line 363, new line 363; edits above it explain +144)"


def test_far_hunk_and_ambiguous_context_when_the_merge_picked_a_look_alike(repo: Git):
    # the same table twice, 300 lines apart; the replay edits the second copy, and upstream
    # moved nothing: the move is all the merge's, and the patch's own change is the same
    table, edited = TABLE, TABLE.replace("4, 5, 6", "4, 5, 60")
    base = {"src/calc.c": "/* top */\n\n" + table + funcs(0, 25) + table + funcs(25, 30)}
    old_post = {"src/calc.c": "/* top */\n\n" + edited + funcs(0, 25) + table + funcs(25, 30)}
    new_post = {"src/calc.c": "/* top */\n\n" + table + funcs(0, 25) + edited + funcs(25, 30)}
    findings = review(repo, base, base, old_post, new_post)
    assert kinds(findings) == ["far-hunk", "ambiguous-context"]  # no interdiff: the same own change
    # each hunk starts at the blank line above its copy: line 2, and 2 + 6 + 300
    assert findings[0].detail == "hunk 1 of src/calc.c moved +306 lines (old line 2, new line 308)"
    assert findings[1].detail == ("hunk 1 of src/calc.c: its 7-line pre-image occurs 2 times (lines 2, 308; "
                                  "the patch is at 308); the merge may have picked a look-alike place")


def test_hunks_pair_by_their_changed_lines_when_the_counts_differ(repo: Git):
    base = {"src/calc.c": funcs(0, 50)}
    old_post = replay(base)
    # the replay gains a hunk near the top: the old hunk pairs with its look-alike, not by order
    new_post = {"src/calc.c": edit(old_post["src/calc.c"], "    y1 += 0 * x + 1;", "    y1 += 0 * x + 11;")}
    findings = review(repo, base, base, old_post, new_post)
    assert kinds(findings) == ["interdiff"]


# -- ambiguous-context -----------------------------------------------------------------------
def test_short_pre_images_are_not_called_ambiguous(repo: Git):
    # the replay gains an insertion at the top: its pre-image is `}`, ``, `}` (two non-blank
    # lines), which recurs at the end
    text = "}\n\n}\n" + funcs(0, 3) + "}\n\n}\n"
    base = {"src/calc.c": text}
    old_post = {"src/calc.c": text.replace("    return y1;", "    return 0;")}
    findings = review(repo, base, base, old_post, {"src/calc.c": "/* top */\n" + old_post["src/calc.c"]})
    assert kinds(findings) == ["interdiff"]


def test_look_alikes_the_old_patch_had_too_are_quiet_when_replayed_in_place(repo: Git):
    # the patch edits both copies of the table; upstream adds lines above both: same places
    text = funcs(0, 2) + TABLE + funcs(2, 5) + TABLE + funcs(5, 8)
    old_base = {"src/calc.c": text}
    new_base = {"src/calc.c": "".join(f"/* new {i} */\n" for i in range(20)) + text}
    both = TABLE.replace("4, 5, 6", "4, 5, 60")
    findings = review(repo, old_base, new_base, {"src/calc.c": old_base["src/calc.c"].replace(TABLE, both)},
                      {"src/calc.c": new_base["src/calc.c"].replace(TABLE, both)})
    assert findings == []


def test_a_look_alike_upstream_added_is_ambiguous(repo: Git):
    text = "/* top */\n\n" + TABLE + funcs(0, 5)
    old_base = {"src/calc.c": text}
    new_base = {"src/calc.c": text + TABLE}  # upstream copied the table below
    edited = TABLE.replace("4, 5, 6", "4, 5, 60")
    findings = review(repo, old_base, new_base, {"src/calc.c": text.replace(TABLE, edited)},
                      {"src/calc.c": text.replace(TABLE, edited) + TABLE})
    assert kinds(findings) == ["ambiguous-context"]
    assert "occurs 2 times (lines 2, 68; the patch is at 2)" in findings[0].detail


# -- function-changed-upstream ---------------------------------------------------------------
def test_function_changed_upstream_by_name(repo: Git):
    old_base = {"src/calc.c": funcs(0, 50, body=20)}
    # upstream edits calc30's return, 18 lines below the patch's line: no overlap, one function
    new_base = {"src/calc.c": edit(old_base["src/calc.c"], "    return y30;", "    return y30 + 1;")}
    findings = review(repo, old_base, new_base, replay(old_base), replay(new_base))
    assert kinds(findings) == ["function-changed-upstream"]
    assert findings[0].detail == "src/calc.c: int calc30(int x) changed upstream too; check the merge"


def test_function_changed_upstream_by_overlap_without_a_function(repo: Git):
    header = "".join(f"/* header line {i} */\n" for i in range(10))  # no funcname before these
    old_base = {"src/calc.c": header + funcs(0, 5)}
    new_base = {"src/calc.c": edit(old_base["src/calc.c"], "/* header line 6 */", "/* header line six */")}
    old_post = {"src/calc.c": edit(old_base["src/calc.c"], "/* header line 3 */", "/* header line three */")}
    new_post = {"src/calc.c": edit(new_base["src/calc.c"], "/* header line 3 */", "/* header line three */")}
    findings = review(repo, old_base, new_base, old_post, new_post)
    assert kinds(findings) == ["function-changed-upstream"]
    assert findings[0].detail == "src/calc.c: lines 1-7 changed upstream too (upstream's hunk at line 4); check the merge"


def test_overlap_is_compared_past_the_earlier_patches(repo: Git):
    # an earlier patch put 120 lines at the top: in new_pre the patch's hunk sits at the line
    # numbers of upstream's edit in calc40 (120 lines below calc30's); carried back to new_base
    # over the earlier patches, the two do not meet
    old_base = {"src/calc.c": funcs(0, 50)}
    new_base = {"src/calc.c": edit(funcs(0, 50), "    y40 += 2 * x + 40;", "    y40 += 2 * x + 41;")}
    earlier = "".join(f"/* chain line {i} */\n" for i in range(120))
    old_pre = {"src/calc.c": earlier + old_base["src/calc.c"]}
    new_pre = {"src/calc.c": earlier + new_base["src/calc.c"]}
    assert review(repo, old_base, new_base, replay(old_pre), replay(new_pre), old_pre, new_pre) == []


def test_files_upstream_renamed_deleted_or_added(repo: Git):
    old_base = {"src/calc.c": funcs(0, 50), "src/gone.c": funcs(0, 3, "gone"), "src/keep.c": funcs(0, 3, "keep")}
    new_base = {"src/calc2.c": funcs(0, 50), "src/keep.c": funcs(0, 3, "keep"), "src/new.c": "int fresh;\n"}
    old_post = {**replay(old_base), "src/gone.c": edit(old_base["src/gone.c"], "    return y1;", "    return 0;"),
                "src/new.c": "int fresh;\n"}
    new_post = {**new_base, "src/keep.c": edit(new_base["src/keep.c"], "    return y1;", "    return 0;")}
    findings = [f for f in review(repo, old_base, new_base, old_post, new_post) if f.kind != "interdiff"]
    assert [f.detail for f in findings] == [
        "src/calc.c: upstream renamed it to src/calc2.c; the patch changed it, check where that change went",
        "src/gone.c: upstream deleted it; the patch changed it, check where that change went",
        "src/new.c: the patch adds it, but upstream now has it too; check the merge",
    ]


# -- name-gone --------------------------------------------------------------------------------
def test_name_gone_when_upstream_renamed_what_the_patch_calls(repo: Git):
    api = "int compute_total(int x);\nint keep_this(int x);\n"
    old_base = {"src/api.h": api, "src/calc.c": funcs(0, 50), "README.md": "Tally the numbers.\n"}
    new_base = {**old_base, "src/api.h": api.replace("compute_total", "compute_sum"),
                "README.md": "Sum the numbers.\n"}
    line = "    y30 += 2 * x + 30 + compute_total(x) + keep_this(x) + chain_helper(x) + patch_helper(x);"
    earlier = {"src/chain.h": "int chain_helper(int x);\n"}  # an earlier patch's name
    old_pre, new_pre = {**old_base, **earlier}, {**new_base, **earlier}
    doc = {"docs/calc.md": "Tally the numbers.\n"}  # prose: a reworded sentence is no vanished name
    old_post, new_post = {**replay(old_pre, new=line), **doc}, {**replay(new_pre, new=line), **doc}
    findings = review(repo, old_base, new_base, old_post, new_post, old_pre, new_pre)
    assert kinds(findings) == ["name-gone"]
    assert findings[0].path == "src/calc.c"
    assert "'compute_total' is gone upstream" in findings[0].detail


def test_name_the_chain_still_defines_is_not_gone(repo: Git):
    old_base = {"src/api.h": "int compute_total(int x);\n", "src/calc.c": funcs(0, 50)}
    new_base = {**old_base, "src/api.h": "int compute_sum(int x);\n"}
    keep = {"src/compat.h": "int compute_total(int x);\n"}  # an earlier patch keeps the old name
    old_pre, new_pre = {**old_base, **keep}, {**new_base, **keep}
    line = "    y30 += 2 * x + 30 + compute_total(x);"
    assert review(repo, old_base, new_base, replay(old_pre, new=line), replay(new_pre, new=line),
                  old_pre, new_pre) == []


def test_vanished_names_come_from_one_upstream_diff(repo: Git):
    old_base = tree(repo, {"a.c": "int alpha_one;\nint beta_two;\n", "b.c": "int beta_two;\n"})
    new_base = tree(repo, {"a.c": "int alpha_uno;\n", "b.c": "int beta_two;\n"})
    # beta_two left a.c but stays in b.c: still a candidate, which the grep of new_base settles
    assert review_module._vanished(repo, old_base, new_base) == {"alpha_one", "beta_two"}
    assert review_module._present(repo, new_base, {"alpha_one", "beta_two", "alpha"}) == {"beta_two"}


# -- interdiff --------------------------------------------------------------------------------
def test_interdiff_shows_how_the_patch_itself_changed(repo: Git):
    base = {"src/calc.c": funcs(0, 50), "src/old.c": "int old;\n", "src/new.c": "int new;\n"}
    old_post = {**replay(base), "src/old.c": "int old = 1;\n"}
    new_post = {**replay(base, new="    y30 += 2 * x + 30 + calc4(x);"), "src/new.c": "int new = 1;\n"}
    findings = review(repo, base, base, old_post, new_post)
    assert kinds(findings) == ["interdiff"] * 3
    by_path = {f.path: f.detail.split("\n") for f in findings}
    assert by_path["src/calc.c"] == [
        "src/calc.c: the replayed patch's own change differs from the old one",
        "@@ -1,2 +1,2 @@", f" -{PATCH_OLD}", f"-+{PATCH_NEW}", "++    y30 += 2 * x + 30 + calc4(x);"]
    assert by_path["src/old.c"][0] == "src/old.c: the replayed patch no longer changes it"
    assert by_path["src/new.c"][0] == "src/new.c: the replayed patch now changes it too"


def test_interdiff_is_short_and_reads_odd_paths(repo: Git):
    odd = 'src/we ird"name.c'  # git quotes this one in its diff headers
    base = {odd: funcs(0, 10)}
    old_post = {odd: base[odd].replace("    return y", "    return 1 + y")}
    new_post = {odd: base[odd].replace("    return y", "    return 2 + y")}
    findings = review(repo, base, base, old_post, new_post)
    assert kinds(findings) == ["interdiff"]
    assert findings[0].path == odd
    lines = findings[0].detail.split("\n")
    assert len(lines) == 1 + review_module.INTERDIFF_LINES + 1 and lines[-1].endswith("more lines")


def test_finding_as_dict():
    finding = Finding("name-gone", "src/a.c", "src/a.c: 'x' is gone upstream")
    assert finding.as_dict() == {"kind": "name-gone", "path": "src/a.c", "detail": "src/a.c: 'x' is gone upstream"}
    assert KINDS == ("far-hunk", "ambiguous-context", "function-changed-upstream", "name-gone", "interdiff")
