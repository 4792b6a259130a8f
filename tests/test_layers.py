"""The package's layers depend one way: upstream/ (the vendored baseline) below chain/ (the
patch chain on it), and the floor modules below both."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "polyforge"


def imported_packages(source: str, module: str) -> set[str]:
    """Every module `source` imports, absolute, top-level and function-level imports alike;
    `module` (dotted) resolves relative imports."""
    found = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from polyforge import chain`
    return found


def _offenders(folder: str | None, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    files = sorted((PACKAGE / folder).glob("*.py")) if folder else [PACKAGE / f"{n}.py" for n in FLOOR]
    assert files, f"no modules under {folder}"
    offenders = {}
    for path in files:
        module = "polyforge." + (f"{folder}." if folder else "") + path.stem
        bad = sorted(m for m in imported_packages(path.read_text(), module)
                     if any(m == f or m.startswith(f + ".") for f in forbidden))
        if bad:
            offenders[path.name] = bad
    return offenders


FLOOR = ("tree_identity", "git", "hashing", "project", "errors", "filelock", "textfile")


def test_upstream_never_imports_chain():
    assert _offenders("upstream", ("polyforge.chain",)) == {}


def test_the_floor_imports_no_layer_above_it():
    assert _offenders(None, ("polyforge.upstream", "polyforge.chain", "polyforge.build", "polyforge.cli")) == {}


@pytest.mark.parametrize("line", [
    "from polyforge.chain.engine import Chain",
    "from polyforge.chain import patchfile",
    "from polyforge import chain",
    "import polyforge.chain.patchfile",
    "from ..chain import engine",
    "def f():\n    from ..chain.engine import run_chain",
])
def test_every_spelling_of_an_import_is_seen(line):
    found = imported_packages(line, "polyforge.upstream.vendor")
    assert any(m == "polyforge.chain" or m.startswith("polyforge.chain.") for m in found), found
