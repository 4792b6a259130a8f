"""Fixtures: small synthetic upstream trees and projects in tmp_path, and a CLI runner."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import cli_fork

ROOT = Path(__file__).resolve().parent.parent


def git_tree_id(folder: Path) -> str:
    """Tree id of a plain folder, computed independently of polyforge (plain git)."""
    env = {**os.environ, "GIT_INDEX_FILE": str(folder.parent / f".{folder.name}.idx"),
           "GIT_DIR": str(folder.parent / f".{folder.name}.git"), "GIT_WORK_TREE": str(folder)}
    subprocess.run(["git", "init", "-q", "--bare", env["GIT_DIR"]], check=True)
    subprocess.run(["git", "add", "-A", "-f", "."], check=True, env=env, cwd=folder)
    out = subprocess.run(["git", "write-tree"], check=True, env=env, capture_output=True, text=True, cwd=folder)
    return out.stdout.strip()


UPSTREAM_FILES = {
    "README.md": "# tiny upstream\n\nA synthetic llama.cpp stand-in.\n",
    "CMakeLists.txt": "project(llama)\n",  # with ggml/ and src/llama.cpp: what rebase takes for llama.cpp
    ".gitignore": "build*/\n*.log\n",
    "bench.log": "ignored by upstream's own .gitignore, but content all the same\n",
    "src/llama.cpp": "".join(f"int f{i}(void) {{ return {i}; }}\n" for i in range(60)),
    "src/llama.h": "#pragma once\nint f0(void);\n",
    "ggml/src/ggml.c": "".join(f"// line {i}\n" for i in range(120)),
    "docs/build.md": "How to build.\n",
    "docs/more/notes.md": "Notes.\n",
}


@dataclass
class Upstream:
    path: Path
    tree: str
    pack_tree: str


def make_upstream(base: Path, files: dict[str, str] | None = None, name: str = "upstream",
                  links: dict[str, str] | None = None) -> Upstream:
    """A synthetic upstream tree; `links` adds symlinks (path -> target) to it."""
    folder = base / name
    for rel, text in (files or UPSTREAM_FILES).items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (folder / "scripts").mkdir(exist_ok=True)
    tool = folder / "scripts" / "tool.sh"
    tool.write_text("#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    for rel, target in (links or {}).items():
        (folder / rel).symlink_to(target)
    tree = git_tree_id(folder)
    pruned = base / f"{name}-pruned"
    subprocess.run(["cp", "-a", str(folder), str(pruned)], check=True)
    subprocess.run(["rm", "-rf", str(pruned / "docs")], check=True)
    return Upstream(folder, tree, git_tree_id(pruned))


@dataclass
class Proj:
    root: Path
    upstream: Upstream

    @property
    def tree(self) -> Path:
        return self.root / "vendor" / "llama.cpp"

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    def write(self, rel: str, text: str) -> None:
        target = self.tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def read(self, rel: str) -> str:
        return (self.tree / rel).read_text()

    def chain(self):
        from polyforge.chain.engine import Chain
        from polyforge.project import Project
        return Chain(Project(self.root))


def write_pin(root: Path, upstream: Upstream, sources: list[dict] | None = None) -> None:
    pin = {
        "upstream": {"project": "llama.cpp", "release": "b0001", "commit": "1" * 40, "tree": upstream.tree},
        "pack": {"prune": ["docs"], "tree": upstream.pack_tree},
        "sources": sources or [{"name": "local", "kind": "dir", "location": str(upstream.path)}],
    }
    (root / "vendor").mkdir(parents=True, exist_ok=True)
    (root / "vendor" / "pin.yaml").write_text(yaml.safe_dump(pin, sort_keys=False))


def fetched_project(root: Path, upstream: Upstream) -> Proj:
    """A project at root pinned to upstream, vendored and locked (no patches yet); the cache is
    whatever POLYFORGE_CACHE names."""
    from polyforge.upstream import vendor
    write_pin(root, upstream)
    (root / "patches").mkdir()
    proj = Proj(root, upstream)
    chain = proj.chain()
    vendor.fetch(chain)
    chain.relock()
    return proj


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("POLYFORGE_CACHE", str(folder))
    monkeypatch.delenv("POLYFORGE_ROOT", raising=False)
    return folder


@pytest.fixture
def upstream(tmp_path) -> Upstream:
    return make_upstream(tmp_path)


@pytest.fixture
def proj(tmp_path, upstream, cache, monkeypatch) -> Proj:
    root = tmp_path / "project"
    write_pin(root, upstream)
    (root / "patches").mkdir()
    monkeypatch.chdir(root)
    return Proj(root, upstream)


@pytest.fixture
def fetched(proj) -> Proj:
    from polyforge.upstream import vendor
    chain = proj.chain()
    vendor.fetch(chain)
    chain.relock()
    return proj


def capture(proj: Proj, name: str, edits: dict[str, str | None], message: str | None = None) -> dict:
    for rel, text in edits.items():
        if text is None:
            (proj.tree / rel).unlink()
        else:
            proj.write(rel, text)
    return proj.chain().capture(name, message)


@pytest.fixture
def chained(fetched: Proj) -> Proj:
    """A fetched project with a chain of two patches (0001-a, 0002-b), neither applied."""
    capture(fetched, "0001-a", {"src/llama.h": "#pragma once\nint f0(void);\nint f1(void);\n"})
    capture(fetched, "0002-b", {"src/llama.cpp": fetched.read("src/llama.cpp").replace("return 7;", "return 70;")})
    fetched.chain().unapply()
    return fetched


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m polyforge ARGS` as a process of its own (cli_fork: forked where it can be)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("COLUMNS", None)
    code, out, err = cli_fork.run(args, cwd, full_env, timeout)
    if code is None:
        raise subprocess.TimeoutExpired(["polyforge", *args], timeout, out, err)
    return subprocess.CompletedProcess(["polyforge", *args], code, out, err)


def assert_clean_error(done: subprocess.CompletedProcess, code: int, fragment: str) -> None:
    """A bad input gives one error line (plus an optional hint), the exit code, no traceback."""
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    error_lines = [ln for ln in lines if ln.startswith("error:")]
    assert len(error_lines) == 1, done.stderr
    assert fragment in done.stderr.replace("\n", " "), done.stderr


# The tests on the real build share the repository's vendored tree and build/KEY/ (one of them
# re-runs a gate there): under pytest-xdist (`-n auto --dist loadgroup`, the README's test
# command) they all run on one worker, one after another; the rest spread over the others.
REAL_BUILD_GROUP = "real-build"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "real_build" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(REAL_BUILD_GROUP))
