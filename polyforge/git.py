"""The single git runner (GitPython's command layer), and the tree operations built on it.

Every git call goes through `Git.run`. It pins the environment so that results are
reproducible whatever the user's configuration: no global or system config, no hooks,
no pager, no colour.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")  # a missing git is reported by us, not at import
import git as gitpython  # noqa: E402
from git.exc import GitCommandError, GitCommandNotFound  # noqa: E402

from .errors import BadInput, EnvironmentProblem, PolyforgeError  # noqa: E402

_PINNED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "LC_ALL": "C",
    "GIT_AUTHOR_NAME": "polyforge",
    "GIT_AUTHOR_EMAIL": "polyforge@localhost",
    "GIT_COMMITTER_NAME": "polyforge",
    "GIT_COMMITTER_EMAIL": "polyforge@localhost",
    # Fixed dates keep commit ids of the vendored repo reproducible across machines.
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}

_CONFIG = ["-c", "core.hooksPath=/dev/null", "-c", "core.autocrlf=false", "-c", "core.fsmonitor=false",
           "-c", "core.quotepath=false", "-c", "color.ui=false", "-c", "advice.detachedHead=false",
           "-c", "gc.auto=0", "-c", "core.compression=1", "-c", "init.defaultBranch=main"]

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


class GitFailed(PolyforgeError):
    """A git command exited non-zero; `stderr` keeps its own words."""

    def __init__(self, args: Sequence[str], status: int, stderr: str):
        first = next((ln for ln in stderr.splitlines() if ln.strip()), f"exit {status}")
        super().__init__(f"git {args[0] if args else ''} failed: {first.strip()}")
        self.args_ = list(args)
        self.status = status
        self.stderr = stderr


@dataclass
class Git:
    """Runs git in `cwd`; `index` selects an alternative index file (GIT_INDEX_FILE)."""

    cwd: Path
    index: Path | None = None

    def run(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None,
            check: bool = True, strip: bool = True) -> str:
        return self.run_full(*args, input=input, env=env, check=check, strip=strip)[1]

    def run_full(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None,
                 check: bool = True, strip: bool = False) -> tuple[int, str, str]:
        full_env = {**_PINNED_ENV, **(env or {})}
        if self.index is not None:
            full_env["GIT_INDEX_FILE"] = str(self.index)
        runner = gitpython.Git(str(self.cwd))
        istream = None
        try:
            if input is not None:
                istream = tempfile.TemporaryFile()
                istream.write(input)
                istream.seek(0)
            status, out, err = runner.execute(
                ["git", *_CONFIG, *args], istream=istream, with_extended_output=True,
                with_exceptions=False, env=full_env, strip_newline_in_stdout=strip,
                stdout_as_string=True,
            )
        except GitCommandNotFound:
            raise EnvironmentProblem("git not found on PATH", hint="install git (apt-get install git)") from None
        except GitCommandError as exc:  # pragma: no cover - with_exceptions=False
            status, out, err = exc.status, "", str(exc.stderr)
        finally:
            if istream is not None:
                istream.close()
        if check and status != 0:
            raise GitFailed(args, status, err)
        return status, out, err

    def run_bytes(self, *args: str) -> bytes:
        """stdout as bytes, for binary output such as git archive."""
        full_env = {**_PINNED_ENV, **({"GIT_INDEX_FILE": str(self.index)} if self.index else {})}
        try:
            status, out, err = gitpython.Git(str(self.cwd)).execute(
                ["git", *_CONFIG, *args], with_extended_output=True, with_exceptions=False,
                env=full_env, strip_newline_in_stdout=False, stdout_as_string=False)
        except GitCommandNotFound:
            raise EnvironmentProblem("git not found on PATH", hint="install git (apt-get install git)") from None
        if status != 0:
            raise GitFailed(args, status, err.decode(errors="replace") if isinstance(err, bytes) else err)
        return out

    def with_index(self, index: Path | None) -> "Git":
        return Git(self.cwd, index)

    # -- objects and trees ------------------------------------------------------------
    def rev_parse(self, rev: str) -> str:
        return self.run("rev-parse", "--verify", "--quiet", rev)

    def try_rev_parse(self, rev: str) -> str | None:
        status, out, _ = self.run_full("rev-parse", "--verify", "--quiet", rev, check=False)
        return out.strip() if status == 0 else None

    def tree_of(self, rev: str) -> str:
        return self.rev_parse(f"{rev}^{{tree}}")

    def write_tree(self) -> str:
        return self.run("write-tree")

    def read_tree(self, tree: str) -> None:
        self.run("read-tree", tree)

    def commit_tree(self, tree: str, message: str, parent: str | None = None) -> str:
        args = ["commit-tree", tree, "-m", message]
        if parent:
            args += ["-p", parent]
        return self.run(*args)

    def diff_names(self, tree_a: str, tree_b: str) -> list[tuple[str, str]]:
        """(status, path) for every path that differs between two trees; renames off."""
        out = self.run("diff-tree", "-r", "--no-renames", "--name-status", "-z", tree_a, tree_b, strip=False)
        fields = out.split("\0")
        pairs = []
        for i in range(0, len(fields) - 1, 2):
            pairs.append((fields[i], fields[i + 1]))
        return pairs

    def ls_tree_modes(self, tree: str, paths: Sequence[str]) -> dict[str, str]:
        if not paths:
            return {}
        out = self.run("ls-tree", "-z", tree, "--", *paths, strip=False)
        modes = {}
        for entry in filter(None, out.split("\0")):
            meta, path = entry.split("\t", 1)
            modes[path] = meta.split()[0]
        return modes


@contextmanager
def scratch_index(repo: Git, tree: str | None = None) -> Iterator[Git]:
    """A throw-away index inside the repository's git dir, optionally loaded with `tree`."""
    git_dir = Path(repo.run("rev-parse", "--absolute-git-dir"))
    handle, name = tempfile.mkstemp(prefix="polyforge-index-", dir=git_dir)
    os.close(handle)
    os.unlink(name)  # git wants to create the index itself
    scratch = repo.with_index(Path(name))
    try:
        if tree is not None:
            scratch.read_tree(tree)
        yield scratch
    finally:
        Path(name).unlink(missing_ok=True)


def prune_tree(repo: Git, tree: str, prune: tuple[str, ...], keep: set[str] | frozenset[str] = frozenset()) -> str:
    """`tree` less the top-level folders in `prune`, except the files named in `keep`."""
    with scratch_index(repo, tree) as index:
        if prune:
            listed = index.run("ls-files", "-z", "--", *(f":(literal){p}" for p in prune), strip=False)
            drop = [path for path in listed.split("\0") if path and path not in keep]
            if drop:
                index.run("update-index", "--force-remove", "-z", "--stdin", input="".join(f"{p}\0" for p in drop).encode())
        return index.write_tree()


def git_version() -> str | None:
    try:
        return Git(Path.cwd()).run("--version")
    except EnvironmentProblem:
        return None


def user_identity(cwd: Path) -> str:
    """'Name <email>' of the user, as git itself would record an author in `cwd` (GIT_AUTHOR_*,
    then the repository's, global and system user.name/user.email): the pinned environment of
    Git.run is bypassed on purpose, since it hides the user's configuration."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_CONFIG")}
    try:
        done = subprocess.run(["git", "var", "GIT_AUTHOR_IDENT"], cwd=cwd, env=env, capture_output=True, text=True)
    except FileNotFoundError:
        raise EnvironmentProblem("git not found on PATH", hint="install git (apt-get install git)") from None
    ident = done.stdout.strip()
    name, _, rest = ident.partition(" <")
    email, closing, _ = rest.partition(">")
    if done.returncode != 0 or not name.strip() or not closing or not email:
        raise BadInput("git knows no author identity (user.name and user.email)",
                       hint="git config --global user.name 'Your Name'; git config --global user.email you@example.com; or pass --author")
    return f"{name.strip()} <{email}>"
