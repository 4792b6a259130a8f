"""patches/chain.lock reading and writing: a broken lock is one BadInput line, never a traceback."""

from __future__ import annotations

import pytest

from polyforge.errors import BadInput
from polyforge.lockfile import ChainLock, LockEntry

LOCK = ChainLock(base_tree="a" * 40, patches=(LockEntry("0001-a.patch", "b" * 64, "c" * 40),))


def test_round_trip(tmp_path):
    path = tmp_path / "chain.lock"
    LOCK.write(path)
    assert ChainLock.read(path) == LOCK
    assert ChainLock.read(tmp_path / "absent.lock") is None


@pytest.mark.parametrize("data, fragment", [
    (b"[" * 100000 + b"]" * 100000 + b"\n", "nested too deeply"),  # RecursionError inside json
    (b"{ not json\n", "not valid JSON"),
    (b'{"version": 1, "base_tree": "\xff\xfe"}\n', "not UTF-8"),
])
def test_malformed_lock_is_bad_input(tmp_path, data, fragment):
    path = tmp_path / "chain.lock"
    path.write_bytes(data)
    with pytest.raises(BadInput, match=fragment) as info:
        ChainLock.read(path)
    assert "chain.lock" in info.value.message and "\n" not in info.value.message


def test_lock_that_is_a_folder_is_bad_input(tmp_path):
    (tmp_path / "chain.lock").mkdir()
    with pytest.raises(BadInput, match="chain.lock: is a folder"):
        ChainLock.read(tmp_path / "chain.lock")
    with pytest.raises(BadInput, match="it is a folder"):
        LOCK.write(tmp_path / "chain.lock")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.lock"], "no .tmp left behind"


def test_lock_under_a_file_is_bad_input(tmp_path):
    (tmp_path / "patches").write_text("not a folder\n")
    with pytest.raises(BadInput, match="a parent is not a folder"):
        ChainLock.read(tmp_path / "patches" / "chain.lock")
    with pytest.raises(BadInput, match="a parent is not a folder"):
        LOCK.write(tmp_path / "patches" / "chain.lock")
    assert (tmp_path / "patches").read_text() == "not a folder\n"
