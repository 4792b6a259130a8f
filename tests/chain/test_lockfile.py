"""patches/chain.lock reading and writing: a broken lock is one BadInput line, never a traceback."""

from __future__ import annotations

import pytest

from polyforge.errors import BadInput
from polyforge.chain.lockfile import ChainLock, LockEntry

LOCK = ChainLock(base_tree="a" * 40, patches=(LockEntry("0001-a.patch", "b" * 64, "c" * 40),))


def test_round_trip(tmp_path):
    path = tmp_path / "chain.lock"
    LOCK.write(path)
    assert ChainLock.read(path) == LOCK
    assert ChainLock.read(tmp_path / "absent.lock") is None


def test_lock_that_is_not_json_is_bad_input(tmp_path):
    # unreadable text (not UTF-8, nested too deeply, a folder): tests/test_textfile.py
    path = tmp_path / "chain.lock"
    path.write_bytes(b"{ not json\n")
    with pytest.raises(BadInput, match="not valid JSON") as info:
        ChainLock.read(path)
    assert "chain.lock" in info.value.message and "\n" not in info.value.message


def test_lock_cannot_be_written_over_a_folder(tmp_path):
    (tmp_path / "chain.lock").mkdir()
    with pytest.raises(BadInput, match="it is a folder"):
        LOCK.write(tmp_path / "chain.lock")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.lock"], "no .tmp left behind"


def test_lock_cannot_be_written_under_a_file(tmp_path):
    (tmp_path / "patches").write_text("not a folder\n")
    with pytest.raises(BadInput, match="a parent is not a folder"):
        LOCK.write(tmp_path / "patches" / "chain.lock")
    assert (tmp_path / "patches").read_text() == "not a folder\n"
