"""Pin validation: bad pins are one-line BadInput errors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import ROOT
from polyforge.errors import BadInput, EnvironmentProblem
from polyforge.upstream.pin import Pin, render_pin
from polyforge.upstream.source import PYPI_INDEX, Archive, Dir, Git, PypiSdist


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
    assert pin.tree == "b" * 40 and pin.sources == (Dir(name="a", location="/x"),)


def test_each_kind_from_the_pin(tmp_path):
    pin = _pin(tmp_path, GOOD.replace("  - {name: a, kind: dir, location: /x}\n", """\
  - {name: s, kind: pypi-sdist, package: p, version: "1.0", filename: p-1.0.tar.gz, sha256: %s, subdir: p-1.0/up}
  - {name: g, kind: git, location: https://example.org/up}
  - {name: t, kind: archive, location: "${MIRROR}", sha256: %s}
  - {name: d, kind: dir, location: /x}
""" % ("c" * 64, "d" * 64)))
    assert pin.sources == (
        PypiSdist(name="s", package="p", version="1.0", filename="p-1.0.tar.gz", sha256="c" * 64, subdir="p-1.0/up"),
        Git(name="g", url="https://example.org/up", rev="a" * 40),  # a pinned git source is at the pin's commit
        Archive(name="t", location="${MIRROR}", sha256="d" * 64),
        Dir(name="d", location="/x"),
    )


def test_the_projects_pin_is_valid():
    pin = Pin.load(ROOT / "vendor" / "pin.yaml")
    assert all(isinstance(s, (PypiSdist, Archive)) and s.sha256 for s in pin.sources)  # bytes pinned
    assert all(s.rev == pin.commit for s in pin.sources if isinstance(s, Git))


def test_the_writer_round_trips_every_kind(tmp_path):
    """render_pin (what a rebase writes) reads back as the same pin, each source from its pin_entry()."""
    sources = (PypiSdist(name="s", package="p", version="1.0", filename="p-1.0.tar.gz", sha256="c" * 64, subdir="p-1.0/up"),
               Git(name="g", url="https://example.org/up", rev="a" * 40),
               Archive(name="t", location="${MIRROR}", sha256="d" * 64),
               Dir(name="d", location="/x"))
    text = render_pin(project="llama.cpp", release="b2", commit="a" * 40, tree="b" * 40, pack_prune=("docs", "models"),
                      pack_tree="e" * 40, sources=[s.pin_entry() for s in sources])
    pin = _pin(tmp_path, text)
    assert (pin.release, pin.commit, pin.tree, pin.pack_prune, pin.pack_tree) == ("b2", "a" * 40, "b" * 40,
                                                                                  ("docs", "models"), "e" * 40)
    assert pin.sources == tuple(replace(s, index=PYPI_INDEX) if isinstance(s, PypiSdist) else s for s in sources)
    assert text.startswith("# The upstream llama.cpp") and "\n  - name: s\n    kind: pypi-sdist\n" in text


def test_a_pin_without_a_commit(tmp_path):
    no_commit = "upstream: {release: b1, tree: %s}\nsources:\n" % ("b" * 40)
    pin = _pin(tmp_path, no_commit + "  - {name: a, kind: dir, location: /x}\n")
    assert pin.commit is None and pin.label == "b1"
    with pytest.raises(BadInput, match="a git source fetches upstream.commit, and the pin has none"):
        _pin(tmp_path, no_commit + "  - {name: g, kind: git, location: https://example.org/up}\n")


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
    (GOOD.replace("location: /x", "location: /x, subdir: up"), "source 'a': 'subdir' is not a key of this kind"),
    (GOOD.replace("kind: dir", "kind: archive"), "source 'a': missing 'sha256'"),
    (GOOD.replace("kind: dir", "kind: archive").replace("location: /x", "location: /x, sha256: 00ff"),
     "'sha256' is not a lowercase hex digest"),
    (GOOD.replace("kind: dir", "kind: archive").replace("location: /x", "location: /x, sha256: %s, subdir: ../up" % ("e" * 64)),
     "subdir '../up' must be a relative path"),
    (GOOD.replace("{name: a, kind: dir, location: /x}", "just-a-name"), "'source' must be a mapping"),
])
def test_bad_pins(tmp_path, text, fragment):
    with pytest.raises(BadInput, match=fragment.replace("[", r"\[")):
        _pin(tmp_path, text)


def test_missing_pin(tmp_path):
    with pytest.raises(BadInput, match="pin file missing"):
        Pin.load(tmp_path / "nope.yaml")


def test_env_location(monkeypatch, tmp_path):
    src = Archive(name="m", location="${PF_TEST_MIRROR}/x.tar.gz", sha256="0" * 64)
    monkeypatch.delenv("PF_TEST_MIRROR", raising=False)
    # an unset variable: this machine lacks the source, and fetch tries the next one
    with pytest.raises(EnvironmentProblem, match="names an unset variable"):
        src.materialize(tmp_path / "cache", tmp_path / "tree")
    monkeypatch.setenv("PF_TEST_MIRROR", "/srv")
    assert src.spelling == "archive:/srv/x.tar.gz"


# unreadable pins (not UTF-8, nested too deeply, a folder): tests/test_textfile.py
