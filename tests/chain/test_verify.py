"""verify-patches: each proof holds on a good chain and fails, with a precise reason, on a bad one."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from conftest import Proj, capture, run_cli
from polyforge.chain import verify
from polyforge.chain.lockfile import ChainLock, LockEntry


def _chain_of_three(p: Proj) -> None:
    capture(p, "0001-a", {"src/llama.cpp": p.read("src/llama.cpp").replace("return 3;", "return 30;"), "src/n.c": "n\n"})
    capture(p, "0002-b", {"ggml/src/ggml.c": p.read("ggml/src/ggml.c").replace("// line 7\n", "// LINE 7\n")})
    capture(p, "0003-c", {"src/llama.cpp": p.read("src/llama.cpp").replace("return 30;", "return 300;")})


def test_good_chain_proves(fetched: Proj):
    _chain_of_three(fetched)
    proof = verify.verify(fetched.chain())
    assert proof.ok, proof.as_dict()
    data = proof.as_dict()
    assert data["base_tree"] == fetched.upstream.tree
    assert [p["name"] for p in data["patches"]] == ["0001-a.patch", "0002-b.patch", "0003-c.patch"]
    for p in data["patches"]:
        assert p["forward"] and p["reverse"] and p["lock"] and p["canonical"] and len(p["sha256"]) == 64
    for side in ("forward", "reverse"):
        assert data[side]["identical"] and data[side]["differing"] == data[side]["only_live"] == data[side]["only_fresh"] == 0
    assert data["patches"][-1]["tree"] == data["live_tree"]


def test_verify_never_touches_the_live_tree(fetched: Proj):
    _chain_of_three(fetched)
    fetched.write("src/llama.h", "uncaptured\n")
    chain = fetched.chain()
    before = chain.tree.snapshot()
    head = chain.tree.head()
    verify.verify(chain)
    assert chain.tree.snapshot() == before and chain.tree.head() == head
    assert fetched.read("src/llama.h") == "uncaptured\n"


def test_live_edits_break_forward_identity_with_counts(fetched: Proj):
    _chain_of_three(fetched)
    fetched.write("src/llama.h", "uncaptured\n")
    fetched.write("src/only-live.c", "x\n")
    (fetched.tree / "README.md").unlink()
    proof = verify.verify(fetched.chain())
    assert not proof.ok
    d = proof.as_dict()["forward"]
    assert (d["identical"], d["differing"], d["only_live"], d["only_fresh"]) == (False, 1, 1, 1)
    assert d["files"] == {"differing": ["src/llama.h"], "only_live": ["src/only-live.c"], "only_fresh": ["README.md"]}


def test_build_dirs_are_excluded(fetched: Proj):
    _chain_of_three(fetched)
    for rel in ("build/CMakeCache.txt", "build-cuda/x.o", "gguf-py/gguf/__pycache__/a.pyc"):
        fetched.write(rel, "output\n")
    assert verify.verify(fetched.chain()).ok


def test_patch_applied_in_live_but_missing_from_chain(fetched: Proj):
    _chain_of_three(fetched)
    (fetched.patches / "0003-c.patch").unlink()
    fetched.chain().relock()
    proof = verify.verify(fetched.chain())
    assert not proof.forward.identical and proof.forward.differing == ["src/llama.cpp"]
    assert not proof.reverse.identical


def test_lock_mismatch_names_first_divergent_patch(fetched: Proj):
    _chain_of_three(fetched)
    lock_path = fetched.patches / "chain.lock"
    lock = ChainLock.read(lock_path)
    entries = list(lock.patches)
    entries[1] = LockEntry(entries[1].name, entries[1].sha256, "f" * 40, entries[1].pack_tree)
    ChainLock(lock.base_tree, lock.pack_base_tree, tuple(entries)).write(lock_path)
    proof = verify.verify(fetched.chain())
    assert not proof.ok
    assert [p.lock for p in proof.patches] == [True, False, True]
    assert "chain.lock: first divergent patch is 0002-b.patch" in proof.problems


def test_sha_drift_is_reported(fetched: Proj):
    _chain_of_three(fetched)
    path = fetched.patches / "0002-b.patch"
    path.write_text(path.read_text().replace("Upstream-Status: Pending", "Upstream-Status: Backport"))
    proof = verify.verify(fetched.chain())
    assert not proof.ok
    assert any("0002-b.patch: sha256" in p for p in proof.problems)


def test_non_canonical_patch_fails_canonical_check(fetched: Proj):
    _chain_of_three(fetched)
    path = fetched.patches / "0003-c.patch"
    text = path.read_text()
    # same change, but with a diff written with one line of context: applies, is not canonical
    path.write_text(text.replace("Upstream-Status: Pending\n", "Upstream-Status: Pending\nExtra: trailer\n"))
    fetched.chain().relock()
    proof = verify.verify(fetched.chain())
    assert [p.canonical for p in proof.patches] == [True, True, True]  # a header edit is still canonical form
    fixed = text.replace("@@ -1,6 +1,6 @@", "@@ -1,6 +1,6 @@")
    lines = fixed.split("\n")
    # drop one context line at the end of the hunk and fix the counts: a valid, non-canonical diff
    hunk = next(i for i, ln in enumerate(lines) if ln.startswith("@@ "))
    old, new = lines[hunk].split(" ")[1:3]
    o_start, o_len = old[1:].split(",")
    n_start, n_len = new[1:].split(",")
    lines[hunk] = f"@@ -{o_start},{int(o_len) - 1} +{n_start},{int(n_len) - 1} @@" + lines[hunk].split("@@", 2)[2]
    end = next(i for i in range(hunk + 1, len(lines)) if not lines[i].startswith((" ", "+", "-")) or i == len(lines) - 1)
    del lines[end - 1]
    path.write_text("\n".join(lines))
    fetched.chain().relock()
    proof = verify.verify(fetched.chain())
    assert [p.canonical for p in proof.patches] == [True, True, False], proof.as_dict()
    assert not proof.ok


def test_misnumbered_patch_is_named(fetched: Proj):
    capture(fetched, "0001-a", {"src/llama.h": "one\n"})
    capture(fetched, "0002-b", {"src/llama.h": "two\n"})
    # swap the numbers: lexical order now puts the dependent patch first
    (fetched.patches / "0001-a.patch").rename(fetched.patches / "0009-a.patch")
    proof = verify.verify(fetched.chain())
    assert not proof.ok
    assert "misnumbered: renumber 0002-b.patch to sort after 0009-a.patch" in proof.problems, proof.problems


def test_cli_json_and_junit(fetched: Proj, tmp_path):
    _chain_of_three(fetched)
    junit = tmp_path / "verify.xml"
    done = run_cli("verify-patches", "--json", "--junit", str(junit), cwd=fetched.root)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is True and set(data) >= {"ok", "base_tree", "patches", "forward", "reverse"}
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests")) == 3 * 4 + 2
    fetched.write("src/llama.h", "drift\n")
    done = run_cli("verify-patches", "--json", "--junit", str(junit), cwd=fetched.root)
    assert done.returncode == 1
    assert json.loads(done.stdout)["forward"]["differing"] == 1
    assert ET.parse(junit).getroot().get("failures") == "2"  # forward and reverse identity


def test_verify_on_empty_chain(fetched: Proj):
    proof = verify.verify(fetched.chain())
    assert proof.ok and proof.patches == []


# -- the smallest renumbering that makes the chain apply ---------------------------
def _dependent_on_two(p: Proj) -> None:
    capture(p, "0001-a", {"src/llama.h": "one\n"})
    capture(p, "0002-b", {"ggml/src/ggml.c": p.read("ggml/src/ggml.c").replace("// line 7\n", "// LINE 7\n")})
    capture(p, "0003-c", {"src/llama.h": "one\nthree\n",
                          "ggml/src/ggml.c": p.read("ggml/src/ggml.c").replace("// LINE 7\n", "// LINE 7 (c)\n")})


def test_renumbering_hint_moves_one_patch_that_depends_on_two(fetched: Proj):
    _dependent_on_two(fetched)
    (fetched.patches / "0003-c.patch").rename(fetched.patches / "0000-c.patch")
    proof = verify.verify(fetched.chain())
    assert not proof.ok
    assert "misnumbered: renumber 0000-c.patch to sort after 0002-b.patch" in proof.problems, proof.problems


def test_lock_refusal_names_the_renumbering(fetched: Proj):
    import pytest
    from polyforge.errors import VerificationFailed
    _dependent_on_two(fetched)
    (fetched.patches / "0003-c.patch").rename(fetched.patches / "0000-c.patch")
    with pytest.raises(VerificationFailed) as info:
        fetched.chain().relock()
    assert info.value.hint == "renumber 0000-c.patch to sort after 0002-b.patch"


def test_no_order_applies_is_said(fetched: Proj):
    capture(fetched, "0001-a", {"src/llama.h": "one\n"})
    chain = fetched.chain()
    chain.unapply()
    data = (fetched.patches / "0001-a.patch").read_bytes()
    fetched.write("src/llama.h", "other\n")
    (fetched.patches / "0001-a.patch").unlink()
    chain.relock()
    chain.capture("0001-b")
    (fetched.patches / "0002-a.patch").write_bytes(data)  # both edit the same line of the baseline
    proof = verify.verify(fetched.chain())
    assert any(p.startswith("no order of the chain applies") for p in proof.problems), proof.problems


def test_renumbering_search_on_twenty_patches_answers_in_seconds(fetched: Proj):
    import time
    from polyforge.chain.engine import find_misnumbered
    for k in range(1, 21):  # patch k needs patch k-1: a strict dependency chain
        capture(fetched, f"{k:04d}-p", {"src/llama.h": "".join(f"v{i}\n" for i in range(k))})
    for k in range(1, 21):  # number them backwards: lexical order is the reverse of the one that applies
        (fetched.patches / f"{k:04d}-p.patch").rename(fetched.patches / f"{100 - k:04d}-q.patch")
    chain = fetched.chain()
    patches = chain.patches()
    started = time.monotonic()
    hint = find_misnumbered(chain.tree.git, fetched.upstream.tree, patches, 0)
    assert time.monotonic() - started < 20
    assert hint is not None and hint.startswith("renumber ") and hint.count(" to sort after ") == 19, hint
