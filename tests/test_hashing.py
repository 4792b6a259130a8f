"""The one hashing routine: a folder's digest."""

from __future__ import annotations

from polyforge.hashing import sha256_files


def test_sha256_files_sees_content_and_names(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("1")
    first = sha256_files(tmp_path)
    assert sha256_files(tmp_path) == first
    (tmp_path / "a" / "x.py").write_text("2")
    second = sha256_files(tmp_path)
    assert second != first
    (tmp_path / "a" / "x.py").rename(tmp_path / "a" / "y.py")
    assert sha256_files(tmp_path) != second
    (tmp_path / "a" / "__pycache__").mkdir()
    (tmp_path / "a" / "__pycache__" / "y.pyc").write_bytes(b"\0")
    third = sha256_files(tmp_path)
    (tmp_path / "a" / "__pycache__" / "y.pyc").write_bytes(b"\1")
    assert sha256_files(tmp_path) == third  # bytecode is not an input
