"""The project's text inputs (chain.lock, pin.yaml), read through polyforge/textfile.py: an
unreadable file is one BadInput line naming it, never a traceback."""

from __future__ import annotations

import pytest

from polyforge.errors import BadInput
from polyforge.chain.lockfile import ChainLock
from polyforge.upstream.pin import Pin

READERS = [pytest.param("chain.lock", ChainLock.read, id="chain.lock"),
           pytest.param("pin.yaml", Pin.load, id="pin.yaml")]


@pytest.mark.parametrize("name, read", READERS)
@pytest.mark.parametrize("data, fragment", [
    (b"upstream:\n  project: caf\xe9\n", "not UTF-8"),  # latin-1: UnicodeDecodeError while reading
    (b'{"version": 1, "base_tree": "\xff\xfe"}\n', "not UTF-8"),
    (b"[" * 100000 + b"]" * 100000 + b"\n", "nested too deeply"),  # RecursionError inside json or yaml
])
def test_unreadable_file_is_one_line_bad_input(tmp_path, name, read, data, fragment):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(BadInput, match=fragment) as info:
        read(path)
    assert name in info.value.message and "\n" not in info.value.message


@pytest.mark.parametrize("name, read", READERS)
def test_a_folder_is_bad_input(tmp_path, name, read):
    (tmp_path / name).mkdir()
    with pytest.raises(BadInput, match=f"{name}: is a folder"):
        read(tmp_path / name)


@pytest.mark.parametrize("name, read", READERS)
def test_a_path_under_a_file_is_bad_input(tmp_path, name, read):
    (tmp_path / "parent").write_text("a file\n")
    with pytest.raises(BadInput, match="a parent is not a folder"):
        read(tmp_path / "parent" / name)
