"""The project's documents name the chain as it is: README's patch table and patches/README.md's
index list exactly the patches in patches/, in order, each with its own subject's concern, so
neither can drift from the chain again; and CI runs the README's commands as written."""

from __future__ import annotations

import re
from pathlib import Path

from polyforge.chain import patchfile

ROOT = Path(__file__).resolve().parent.parent
PATCHES = sorted(p.name.removesuffix(".patch") for p in (ROOT / "patches").glob("*.patch"))


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^#{1,2} ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + following.start()] if following else text[start:]


def test_readme_table_lists_the_chain():
    section = _section((ROOT / "README.md").read_text(), "## The chain")
    rows = re.findall(r"^\| `(\d{4}-[a-z0-9.-]+)` \|", section, re.M)
    assert rows == PATCHES


def test_patch_index_lists_the_chain():
    index = (ROOT / "patches" / "README.md").read_text()
    headings = re.findall(r"^### (\d{4}-[a-z0-9.-]+)", index, re.M)
    assert headings == PATCHES
    assert len(index.splitlines()) <= 400


def test_patches_folder_holds_patches_lock_and_index_only():
    extra = {p.name for p in (ROOT / "patches").iterdir()} - {f"{n}.patch" for n in PATCHES} - {"chain.lock", "README.md"}
    assert extra == set()


def test_every_patch_says_why_and_has_a_real_author():
    for name in PATCHES:
        patch = patchfile.read(ROOT / "patches" / f"{name}.patch")
        assert patch.header.trailer("Upstream-Status"), name
        assert len(patch.header.description().split()) >= 30, f"{name}: a description says what and why"
        assert not patch.header.author.endswith("@localhost>"), f"{name}: {patch.header.author}"
        assert re.match(r"^[a-z0-9-]+ : \S", patch.header.subject), f"{name}: subject style 'module : what'"


def test_ci_runs_the_readme_commands_as_written():
    """.ci/run promises the README's main command, then its test command, exactly as written."""
    blocks = re.findall(r"```sh\n(.*?)\n```", _section((ROOT / "README.md").read_text(), "## Set-up on a fresh machine"),
                        re.S)
    main, tests = blocks[0], blocks[1]
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("python3 -m venv")]
    assert ci == [main, tests]
    assert "pytest" in tests and "polyforge up" in main
