"""polyforge.chain.status: the typed status and its --json shape."""

from __future__ import annotations

from conftest import Proj, capture
from polyforge.chain.status import read as read_status

CHAIN_KEYS = ["patches", "lock_drift", "interrupted", "journal_problem", "rebasing", "applied", "unapplied", "live_edits",
              "applied_changed", "applied_missing", "chain_mismatch", "git_locks"]


def test_status_of_an_applied_chain_with_a_live_edit(fetched: Proj):
    capture(fetched, "0001-a", {"src/llama.h": "#pragma once\nint a(void);\n"})
    capture(fetched, "0002-b", {"README.md": "b\n"})
    fetched.chain().unapply(to="0001")
    fetched.write("src/llama.h", "live\n")
    info = read_status(fetched.chain())
    assert info.ok and info.vendored
    assert info.applied == ["0001-a.patch"] and info.unapplied == ["0002-b.patch"]
    assert info.live_edits == [{"status": "M", "path": "src/llama.h"}]
    assert info.git_locks.removable == info.git_locks.blocking == []
    d = info.as_dict()
    # today's JSON: vendor status's keys (its "ok" now the whole status's), then the chain's
    assert list(d)[:len(info.vendor)] == list(info.vendor) and list(d)[len(info.vendor):] == CHAIN_KEYS
    assert d["ok"] is True and d["rebasing"] is False and d["git_locks"] == {"removable": [], "blocking": []}


def test_a_git_lock_someone_else_holds_makes_status_not_ok(fetched: Proj):
    (fetched.tree / ".git" / "index.lock").write_text("")
    info = read_status(fetched.chain())
    assert info.git_locks.blocking == [".git/index.lock"] and not info.ok


def test_status_before_anything_is_vendored(proj: Proj):
    info = read_status(proj.chain())
    assert not info.vendored and not info.ok
    d = info.as_dict()
    assert d["vendored"] is False and d["ok"] is False
    assert "applied" not in d and "git_locks" not in d  # the tree's keys only with a tree
