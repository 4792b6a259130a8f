"""Pin validation: bad pins are one-line BadInput errors."""

from __future__ import annotations

import pytest

from polyforge.errors import BadInput
from polyforge.settings import Pin


def _pin(tmp_path, text: str):
    path = tmp_path / "pin.yaml"
    path.write_text(text)
    return Pin.load(path)


GOOD = """
upstream: {release: b1, commit: %s, tree: %s}
sources:
  - {name: a, kind: dir, location: /x}
""" % ("a" * 40, "b" * 40)


def test_good_pin(tmp_path):
    pin = _pin(tmp_path, GOOD)
    assert pin.tree == "b" * 40 and pin.sources[0].kind == "dir"


@pytest.mark.parametrize("text, fragment", [
    ("[1, 2]", "must be a mapping"),
    ("upstream: {release: b1, commit: zz, tree: %s}\nsources: [{name: a, kind: dir, location: x}]" % ("b" * 40), "commit"),
    (GOOD.replace("kind: dir", "kind: ftp"), "unknown kind"),
    (GOOD.replace(", location: /x", ""), "missing 'location'"),
    ("upstream: {release: b1, commit: %s, tree: %s}\nsources: []" % ("a" * 40, "b" * 40), "'sources' is empty"),
    ("upstream: [", "not valid YAML"),
    (GOOD + "  - {name: a, kind: dir, location: /y}\n", "repeat"),
    (GOOD + "pack: {prune: [docs/x]}\n", "top-level"),
    ("upstream: {release: b1, commit: %s, tree: %s}\nsources:\n  - {name: s, kind: pypi-sdist, package: p}" % ("a" * 40, "b" * 40), "missing 'version'"),
])
def test_bad_pins(tmp_path, text, fragment):
    with pytest.raises(BadInput, match=fragment.replace("[", r"\[")):
        _pin(tmp_path, text)


def test_missing_pin(tmp_path):
    with pytest.raises(BadInput, match="pin file missing"):
        Pin.load(tmp_path / "nope.yaml")


def test_env_location(monkeypatch):
    from polyforge.settings import Source
    src = Source(name="m", kind="archive", location="${PF_TEST_MIRROR}/x.tar.gz", sha256="0" * 64)
    monkeypatch.delenv("PF_TEST_MIRROR", raising=False)
    assert src.resolved_location() is None
    monkeypatch.setenv("PF_TEST_MIRROR", "/srv")
    assert src.resolved_location() == "/srv/x.tar.gz"


@pytest.mark.parametrize("data, fragment", [
    (b"upstream:\n  project: caf\xe9\n", "not UTF-8"),  # latin-1: UnicodeDecodeError while reading
    (b"[" * 100000 + b"]" * 100000 + b"\n", "nested too deeply"),  # RecursionError inside yaml
])
def test_unreadable_pin_is_one_line_bad_input(tmp_path, data, fragment):
    path = tmp_path / "pin.yaml"
    path.write_bytes(data)
    with pytest.raises(BadInput, match=fragment) as info:
        Pin.load(path)
    assert "pin.yaml" in info.value.message and "\n" not in info.value.message


def test_pin_that_is_a_folder_is_bad_input(tmp_path):
    (tmp_path / "pin.yaml").mkdir()
    with pytest.raises(BadInput, match="pin.yaml: is a folder"):
        Pin.load(tmp_path / "pin.yaml")
    (tmp_path / "vendor").write_text("a file\n")
    with pytest.raises(BadInput, match="a parent is not a folder"):
        Pin.load(tmp_path / "vendor" / "pin.yaml")
