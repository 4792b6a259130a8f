"""The hostile-input corpus: broken and unsafe patches, chain.locks, pins, patch
names and arguments, each run through the real CLI (a process of its own: tests/cli_fork.py) in a
scratch project.

Every scratch project starts the same: the synthetic upstream of conftest, the chain 0001-a and
0002-b applied, and one user edit (an uncaptured change to docs/build.md) in the live tree. A
case then drops its hostile input in (a file of tests/data/hostile/, or a setup function) and
runs commands. Each command runs in its own copy of that project (so one command's damage cannot
hide another's) and must:

  - exit with the case's class (0 ok, 1 verification failure, 2 bad input, 3 environment);
  - print no Traceback;
  - print exactly one `error:` line on stderr (status and verify-patches, whose exit 1 is a
    report, may print none) holding one of the case's fragments;
  - leave the vendored tree (contents and modes, .git excluded; the user edit included), the
    vendored repository's HEAD and refs, patches/ (chain.lock too), vendor/pin.yaml and vendor/
    exactly as they were;
  - leave no journal, no index.lock or other git lock, no polyforge-index-* scratch index and no
    .tmp file behind (one planted by the case must be left as it was).

The snapshot is taken after the hostile input is in place, so the hostile file itself must not
be rewritten either. `unapply` meets the user edit before anything it could refuse, so a
dirty-tree refusal (exit 2, "live edits") counts as a right answer for it. The corpus files are
plain bytes (tests/data/hostile/README.md); the table (tests/data/hostile/cases.yaml for the
corpus, OTHER_CASES below for the rest) says what each must get.

Nothing here is xfail: a failing case is a hole in the library.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import yaml

import cli_fork
from conftest import UPSTREAM_FILES, Proj, capture, make_upstream, write_pin

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile"
USER_EDIT = ("docs/build.md", "How to build.\nA local note nobody captured yet.\n")
WORKERS = max(2, min(8, 2 * (os.cpu_count() or 1)))
RUN_TIMEOUT = 60.0

# -- the commands ------------------------------------------------------------------------------
CAPTURE_ARGS = ("capture", "0005-hostile-capture", "-m", "hostile: capture\n\nCaptured over a hostile chain.")
COMMANDS: dict[str, tuple[str, ...]] = {
    "status": ("status",),
    "apply": ("apply",),
    "verify-patches": ("verify-patches",),
    "lock": ("lock",),
    "unapply": ("unapply",),
    "capture": CAPTURE_ARGS,
    "refresh": ("refresh",),
    "vendor-status": ("vendor", "status"),
    "fold": ("fold", "0001..0002", "--into", "0001-ab", "-m", "hostile: fold\n\nFolded over a hostile chain."),
    "move": ("move", "0002", "--after", "base"),
    "rename": ("rename", "0002", "0002-renamed"),
    "report": ("chain", "report"),
}
ALL = ("status", "apply", "verify-patches", "lock", "unapply", "capture", "refresh", "fold", "move", "rename", "report")
# chain report reads the patches alone: a broken chain.lock or journal is not its input
NO_LOCK = tuple(c for c in ALL if c not in ("lock", "report"))
NO_REPORT = tuple(c for c in ALL if c != "report")
# a patch that may be accepted as valid: lock and refresh would then rightly take it into the chain
MAYBE_VALID = ("status", "apply", "verify-patches", "unapply", "capture")
REPORTS = ("status", "verify-patches")  # their exit 1 is a report, not necessarily an error line

# a valid patch, not yet in chain.lock: every command but lock reports that drift (exit 1, never
# a bad-input 2); test_valid_corpus_patch proves lock takes it (exit 0) and the chain then applies
LOCK_DRIFT = ("chain.lock",)
# well-formed patches that do not apply exactly: drift (not in chain.lock) or the failure itself
NOT_APPLYING = ("does not apply", "chain.lock", "offset", "would break")


@dataclass(frozen=True)
class Case:
    id: str
    code: int | tuple[int, ...]
    frag: tuple[str, ...]
    commands: tuple = ALL  # keys of COMMANDS, or argv tuples ("{root}", "{case}" are filled in)
    over: dict = field(default_factory=dict)  # command key -> (code, frag)
    setup: Callable | None = None  # setup(root: Path, case_dir: Path, stack: list) -> None
    corpus: bool = False  # drop tests/data/hostile/<id>.patch into patches/
    template: str = "plain"  # or "symlinks": an upstream holding `linked -> src`, `outside -> ../..`
    env: dict = field(default_factory=dict)
    timeout: float = RUN_TIMEOUT


def P(id: str, code, frag, commands=ALL, **kw) -> Case:
    return Case(id, code, tuple(frag), tuple(commands), corpus=True, **kw)


def refused(id: str, *frag: str) -> Case:
    """The commonest corpus row: every command refuses the patch as bad input (exit 2)."""
    return P(id, 2, frag)


# -- the corpus table (one row per tests/data/hostile/*.patch): tests/data/hostile/cases.yaml ----
# the named sets a row may use (its header says how)
FRAG_SETS = {"NOT_APPLYING": NOT_APPLYING, "LOCK_DRIFT": LOCK_DRIFT}
COMMAND_SETS = {"ALL": ALL, "NO_LOCK": NO_LOCK, "MAYBE_VALID": MAYBE_VALID}
ROW_KEYS = {"id", "refused", "code", "frag", "frag_also", "commands", "template"}


def _row(row: dict) -> Case:
    assert set(row) <= ROW_KEYS and "id" in row, f"cases.yaml: unknown keys or no id in {row}"
    if "refused" in row:
        assert set(row) == {"id", "refused"}, f"cases.yaml: a refused row takes nothing else: {row}"
        return refused(row["id"], *row["refused"])
    frag = row["frag"]
    frag = FRAG_SETS[frag] if isinstance(frag, str) else tuple(frag)
    frag += tuple(row.get("frag_also", ()))
    commands = row.get("commands", "ALL")
    commands = COMMAND_SETS[commands] if isinstance(commands, str) else commands
    code = row["code"]
    code = tuple(code) if isinstance(code, list) else code
    return P(row["id"], code, frag, commands, **({"template": row["template"]} if "template" in row else {}))


PATCH_CASES = [_row(row) for row in yaml.safe_load((CORPUS / "cases.yaml").read_text(encoding="utf-8"))]
LOCKED_FIRST = {"0601-duplicate-upstream-status", "0602-date-with-time"}
VALID = ("0202-crlf-in-hunk-body",)  # corpus patches that are legitimate content (test_valid_corpus_patch)

# -- cases that are not a patch file ----------------------------------------------------------
VALID_PATCH = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: hostile <hostile@localhost>
Date: Sun, 29 Nov 2026 00:00:00 +0000
Subject: [PATCH] a valid patch under a hostile name

Upstream-Status: Pending
---
diff --git a/ggml/src/ggml.c b/ggml/src/ggml.c
index 5f012ace3772994bdce9225ec29b5753127c9ce9..d4b66e7e9cef50a415773212e8d63b2b476208c1 100644
--- a/ggml/src/ggml.c
+++ b/ggml/src/ggml.c
@@ -8,7 +8,7 @@
 // line 7
 // line 8
 // line 9
-// line 10
+// line 10, patched
 // line 11
 // line 12
 // line 13
"""


def _drop(name: str, data: bytes = VALID_PATCH.encode()):
    def setup(root: Path, case_dir: Path, stack: list) -> None:
        (root / "patches" / name).write_bytes(data)
    return setup


def _patch_dir(root: Path, case_dir: Path, stack: list) -> None:
    (root / "patches" / "0009-x.patch").mkdir()


def _patch_symlink_outside(root: Path, case_dir: Path, stack: list) -> None:
    outside = case_dir / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "evil.patch").write_text(VALID_PATCH)
    (root / "patches" / "0009-link.patch").symlink_to(outside / "evil.patch")


def _patch_symlink_dangling(root: Path, case_dir: Path, stack: list) -> None:
    (root / "patches" / "0009-dangling.patch").symlink_to(case_dir / "no-such-file.patch")


def _patch_fifo(root: Path, case_dir: Path, stack: list) -> None:
    os.mkfifo(root / "patches" / "0009-fifo.patch")


def _patches_is_a_file(root: Path, case_dir: Path, stack: list) -> None:
    shutil.rmtree(root / "patches")
    (root / "patches").write_text("not a folder\n")


def _chain_lock(data: bytes | str | None = None, edit: Callable[[dict], None] | None = None, mkdir: bool = False):
    def setup(root: Path, case_dir: Path, stack: list) -> None:
        path = root / "patches" / "chain.lock"
        if mkdir:
            path.unlink()
            path.mkdir()
            return
        if edit is not None:
            raw = json.loads(path.read_text())
            edit(raw)
            path.write_text(json.dumps(raw, indent=2) + "\n")
        else:
            path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def _pin(data: bytes | str | None = None, edit: Callable[[dict], None] | None = None):
    def setup(root: Path, case_dir: Path, stack: list) -> None:
        path = root / "vendor" / "pin.yaml"
        if edit is not None:
            raw = yaml.safe_load(path.read_text())
            edit(raw)
            path.write_text(yaml.safe_dump(raw, sort_keys=False))
        else:
            path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return setup


def _hold_lock(root: Path, case_dir: Path, stack: list) -> None:
    from polyforge.filelock import FileLock
    held = FileLock(root / "vendor" / ".lock", "vendored tree")
    held.__enter__()
    stack.append(lambda: held.__exit__(None, None, None))


def _stale_index_lock(root: Path, case_dir: Path, stack: list) -> None:
    (root / "vendor" / "llama.cpp" / ".git" / "index.lock").write_bytes(b"")


def _journal(text: str | Callable[[Path], str]):
    def setup(root: Path, case_dir: Path, stack: list) -> None:
        tree = root / "vendor" / "llama.cpp"
        body = text(tree) if callable(text) else text
        (tree / ".git" / "polyforge" / "journal.json").write_text(body)
    return setup


def _bogus_journal(tree: Path) -> str:
    head_tree = _git(tree, "rev-parse", "HEAD^{tree}")
    return json.dumps({"op": "apply", "from_commit": "f" * 40, "to_tree": head_tree})


def _latin1_message(root: Path, case_dir: Path, stack: list) -> None:
    (case_dir / "msg-latin1.txt").write_bytes(b"hostile: latin-1\n\nCaf\xe9 au lait.\n")


def _folder(name: str, files: dict[str, str]):
    """A source folder beside the project (in the case folder)."""
    def setup(root: Path, case_dir: Path, stack: list) -> None:
        (case_dir / name).mkdir(exist_ok=True)
        for rel, text in files.items():
            (case_dir / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (case_dir / name / rel).write_text(text)
    return setup


def _rebase_folder(root: Path, case_dir: Path, stack: list) -> None:
    """vendor/rebase/ with something in it but no journal: nothing polyforge can resume or undo."""
    (root / "vendor" / "rebase" / "previous").mkdir(parents=True)


def S(id: str, code, frag, commands=ALL, **kw) -> Case:
    return Case(id, code, tuple(frag), tuple(commands), **kw)


def C(id: str, argv: tuple, code, frag, **kw) -> Case:
    return Case(id, code, tuple(frag), (argv,), **kw)


BAD_NAME = ("bad patch name",)
LOCK_FRAG = ("chain.lock",)
PIN_FRAG = ("pin.yaml",)
PIN_COMMANDS = ALL + ("vendor-status",)
QUOTED_DIFF_MESSAGE = ("hostile: quoted\n\nA quoted diff:\n\n--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n"
                       "-# tiny upstream\n+# pwned upstream\n")

OTHER_CASES = [
    # patch names and what sits in patches/
    S("name-no-number", 2, BAD_NAME + ("foo.patch",), setup=_drop("foo.patch")),
    S("name-underscore", 2, BAD_NAME, setup=_drop("0001_x.patch")),
    S("name-uppercase", 2, BAD_NAME, setup=_drop("0001-UPPER.patch")),
    S("name-unicode-digits", 2, BAD_NAME, setup=_drop("\u0660\u0660\u0660\u0669-x.patch")),
    S("name-directory", 2, ("0009-x.patch",), setup=_patch_dir),
    S("name-symlink-outside", 2, ("symlink",), setup=_patch_symlink_outside),
    S("name-symlink-dangling", 2, ("0009-dangling.patch",), setup=_patch_symlink_dangling),
    S("name-fifo", 2, ("0009-fifo.patch", "not a regular file", "fifo"), ("status", "apply"), setup=_patch_fifo,
      timeout=5.0),
    S("patches-is-a-file", (1, 2), ("patches",), setup=_patches_is_a_file),
    # chain.lock
    S("lock-not-json", 2, LOCK_FRAG, NO_LOCK, setup=_chain_lock("{ this is not json\n")),
    S("lock-top-level-list", 2, LOCK_FRAG, NO_LOCK, setup=_chain_lock("[]\n")),
    S("lock-null", 2, LOCK_FRAG, NO_LOCK, setup=_chain_lock("null\n")),
    S("lock-wrong-types", 2, LOCK_FRAG, NO_LOCK, setup=_chain_lock(
        '{"version": 1, "base_tree": 123, "pack_base_tree": [], "patches": [{"name": 5, "sha256": null, "tree": {}}]}\n')),
    S("lock-patches-not-a-list", 2, LOCK_FRAG, NO_LOCK,
      setup=_chain_lock(edit=lambda raw: raw.__setitem__("patches", "0001-a.patch"))),
    S("lock-version-string", 2, LOCK_FRAG, NO_LOCK, setup=_chain_lock(edit=lambda raw: raw.__setitem__("version", "1"))),
    S("lock-deep-nesting", 2, LOCK_FRAG, NO_LOCK, setup=_chain_lock("[" * 100000 + "]" * 100000 + "\n")),
    S("lock-not-utf8", 2, LOCK_FRAG, NO_LOCK, setup=_chain_lock(b'{"version": 1, "base_tree": "\xff\xfe"}\n')),
    S("lock-is-a-directory", 2, LOCK_FRAG, NO_LOCK, setup=_chain_lock(mkdir=True)),
    # vendor/pin.yaml
    S("pin-not-yaml", 2, PIN_FRAG, PIN_COMMANDS, setup=_pin("upstream: [unclosed\n")),
    S("pin-not-a-mapping", 2, PIN_FRAG, PIN_COMMANDS, setup=_pin("- just\n- a list\n")),
    S("pin-empty", 2, PIN_FRAG, PIN_COMMANDS, setup=_pin("")),
    S("pin-upstream-a-list", 2, PIN_FRAG, PIN_COMMANDS, setup=_pin(edit=lambda raw: raw.__setitem__("upstream", [1, 2]))),
    S("pin-tree-an-int", 2, PIN_FRAG, PIN_COMMANDS, setup=_pin(edit=lambda raw: raw["upstream"].__setitem__("tree", 12345))),
    S("pin-sources-a-string", 2, PIN_FRAG, PIN_COMMANDS, setup=_pin(edit=lambda raw: raw.__setitem__("sources", "local"))),
    S("pin-source-name-an-int", 2, PIN_FRAG, PIN_COMMANDS,
      setup=_pin(edit=lambda raw: raw["sources"][0].__setitem__("name", 5))),
    S("pin-prune-a-string", 2, PIN_FRAG, PIN_COMMANDS, setup=_pin(edit=lambda raw: raw["pack"].__setitem__("prune", "docs"))),
    S("pin-python-tag", 2, PIN_FRAG, PIN_COMMANDS,
      setup=_pin("upstream: !!python/object/apply:os.system ['touch /tmp/polyforge-hostile-pin']\n")),
    S("pin-not-utf8", 2, PIN_FRAG, PIN_COMMANDS, setup=_pin(b"upstream:\n  project: caf\xe9\n")),
    S("pin-unknown-top-key", 2, PIN_FRAG + ("unknown key", "extra"), PIN_COMMANDS,
      setup=_pin(edit=lambda raw: raw.__setitem__("extra", 1))),
    S("pin-unknown-upstream-key", 2, PIN_FRAG + ("upstream.relase",), PIN_COMMANDS,
      setup=_pin(edit=lambda raw: raw["upstream"].__setitem__("relase", "b0002"))),
    S("pin-misspelt-prune", 2, PIN_FRAG + ("pack.prnue",), PIN_COMMANDS,
      setup=_pin(edit=lambda raw: raw["pack"].__setitem__("prnue", raw["pack"].pop("prune")))),
    # a pin without a commit is valid: the commands that only read it answer, no traceback
    S("pin-without-commit", 0, (), ("status", "vendor-status"),
      setup=_pin(edit=lambda raw: raw["upstream"].pop("commit"))),
    # the environment
    S("env-lock-held", 3, ("pid",), ("apply", "verify-patches", "lock", "unapply", "capture", "refresh"),
      setup=_hold_lock),
    S("env-git-missing", 3, ("git not found",), env={"PATH": "/nonexistent"}),
    S("env-stale-index-lock", 3, ("index.lock",), ("status", "capture", "refresh"),
      over={"status": ((0, 1, 3), ("index.lock",))}, setup=_stale_index_lock),
    S("env-journal-not-json", (2, 3), ("journal",), NO_REPORT, setup=_journal("{ not json\n")),
    S("env-journal-bogus-commit", (1, 2, 3), ("journal", "ffffffffffff"), NO_REPORT, setup=_journal(_bogus_journal),
      over={"status": ((0, 1, 2, 3), ("journal", "interrupted"))}),
    # command-line arguments
    C("cli-capture-bad-name", ("capture", "0005_Bad", "-m", "x"), 2, BAD_NAME),
    C("cli-capture-name-traversal", ("capture", "../../0005-x", "-m", "x"), 2, BAD_NAME),
    C("cli-capture-name-unicode-digits", ("capture", "\u0660\u0660\u0660\u0665-x", "-m", "x"), 2, BAD_NAME),
    C("cli-capture-existing-name", ("capture", "0002-b", "-m", "x"), 2, ("exists",)),
    C("cli-capture-below-applied", ("capture", "0001-z", "-m", "x"), 2, ("sort",)),
    C("cli-capture-F-nonexistent", ("capture", "0005-x", "-F", "/nonexistent/msg.txt"), 2, ("/nonexistent/msg.txt",)),
    C("cli-capture-F-folder", ("capture", "0005-x", "-F", "{root}/patches"), 2, ("directory", "folder", "not a file")),
    C("cli-capture-F-latin1", ("capture", "0005-x", "-F", "{case}/msg-latin1.txt"), 2, ("UTF-8", "utf-8"),
      setup=_latin1_message),
    C("cli-capture-status-empty", ("capture", "0005-x", "-m", "x", "--upstream-status", ""), 2, ("upstream-status",)),
    C("cli-capture-status-blank", ("capture", "0005-x", "-m", "x", "--upstream-status", "   "), 2, ("upstream-status",)),
    C("cli-capture-status-bogus", ("capture", "0005-x", "-m", "x", "--upstream-status", "Bogus"), 2, ("upstream-status",)),
    C("cli-capture-status-newline", ("capture", "0005-x", "-m", "x", "--upstream-status",
                                     "Pending\nSigned-off-by: mallory <m@example.invalid>"), 2, ("upstream-status",)),
    C("cli-capture-message-blank", ("capture", "0005-x", "-m", "   "), 2, ("message",)),
    C("cli-capture-message-quoted-diff", ("capture", "0005-x", "-m", QUOTED_DIFF_MESSAGE), 2,
      ("README.md", "quoted diff", "description", "message")),
    C("cli-capture-message-git-diff", ("capture", "0005-x", "-m", "hostile\n\ndiff --git a/README.md b/README.md\n"), 2,
      ("message", "diff --git", "corrupt", "unexpected")),
    C("cli-capture-message-separator", ("capture", "0005-x", "-m", "hostile\n\n---\nnot the diff"), 2, ("---", "message")),
    C("cli-refresh-message-blank", ("refresh", "-m", "   "), 2, ("message",)),
    C("cli-refresh-F-nonexistent", ("refresh", "-F", "/nonexistent/msg.txt"), 2, ("/nonexistent/msg.txt",)),
    C("cli-refresh-check-with-message", ("refresh", "--check", "-m", "x"), 2, ("--check",)),
    # (missing folders live under the case folder: a library that creates them must not create them in /)
    C("cli-verify-junit-missing-dir", ("verify-patches", "--junit", "{case}/nonexistent/dir/x.xml"), 2, ("nonexistent/dir",)),
    C("cli-verify-junit-folder", ("verify-patches", "--junit", "{root}/patches"), 2, ("directory", "folder", "patches")),
    C("cli-apply-to-9999", ("apply", "--to", "9999"), 2, ("9999",)),
    C("cli-apply-to-empty", ("apply", "--to", ""), 2, ("--to",)),
    C("cli-apply-to-base-when-applied", ("apply", "--to", "base"), 2, ("applied",)),
    C("cli-unapply-to-garbage", ("unapply", "--to", "garbage"), 2, ("garbage",)),
    C("cli-unapply-to-9999", ("unapply", "--to", "9999"), 2, ("9999",)),
    C("cli-vendor-pack-under-a-file", ("vendor", "pack", "{root}/vendor/pin.yaml/x.tar.xz"), 2, ("pin.yaml",)),
    C("cli-vendor-pack-missing-dir", ("vendor", "pack", "{case}/nonexistent/dir/x.tar.xz"), 2, ("nonexistent/dir",)),
    # rebase: no rebase to resume, sources that are not llama.cpp, a rebase killed before it recorded anything
    C("cli-rebase-continue-none", ("rebase", "--continue"), 2, ("no rebase is in progress",)),
    C("cli-rebase-abort-none", ("rebase", "--abort"), 2, ("no rebase is in progress",)),
    C("cli-rebase-onto-empty", ("rebase", "--onto", "{case}/empty", "--dry-run"), 2, ("does not look like a llama.cpp",),
      setup=_folder("empty", {})),
    C("cli-rebase-onto-unrelated", ("rebase", "--onto", "{case}/unrelated", "--dry-run"), 2,
      ("does not look like a llama.cpp",), setup=_folder("unrelated", {"src/main.rs": "fn main() {}\n"})),
    C("cli-upstream-check-empty", ("upstream", "check", "{case}/empty"), 2, ("does not look like a llama.cpp",),
      setup=_folder("empty", {})),
    C("cli-rebase-continue-no-journal", ("rebase", "--continue"), 2, ("has no journal",), setup=_rebase_folder),
    C("cli-rebase-abort-no-journal", ("rebase", "--abort"), 2, ("has no journal",), setup=_rebase_folder),
]

CASES = PATCH_CASES + OTHER_CASES


# -- templates: built once per session, copied per command --------------------------------------
def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _build_template(base: Path, links: dict[str, str]) -> Path:
    """The project every case starts from: fetched, 0001-a and 0002-b applied, one user edit."""
    from polyforge.upstream import vendor
    upstream = make_upstream(base, links=links)
    root = base / "project"
    write_pin(root, upstream)
    (root / "patches").mkdir()
    proj = Proj(root, upstream)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POLYFORGE_CACHE", str(base / "cache"))
        mp.delenv("POLYFORGE_ROOT", raising=False)
        chain = proj.chain()
        vendor.fetch(chain)
        chain.relock()
        capture(proj, "0001-a", {"src/llama.h": "#pragma once\nint f0(void);\nint f1(void);\n"})
        capture(proj, "0002-b", {"src/llama.cpp": proj.read("src/llama.cpp").replace("return 7;", "return 70;")})
    proj.write(*USER_EDIT)
    return root


@pytest.fixture(scope="session")
def templates(tmp_path_factory):
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            links = {} if kind == "plain" else {"linked": "src", "outside": "../.."}
            built[kind] = _build_template(tmp_path_factory.mktemp(f"hostile-{kind}"), links)
        return built[kind]
    return get


# -- snapshots ------------------------------------------------------------------------------
def _entry(path: Path):
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if stat.S_ISDIR(st.st_mode):
        return ("dir", stat.S_IMODE(st.st_mode))
    if stat.S_ISREG(st.st_mode):
        return ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
    return ("special", stat.S_IFMT(st.st_mode))


def _walk(top: Path, skip_git: bool = False) -> dict[str, tuple]:
    if not os.path.lexists(top):
        return {}
    if not top.is_dir() or top.is_symlink():
        return {".": _entry(top)}
    out = {}
    for folder, dirs, files in os.walk(top):
        rel_folder = os.path.relpath(folder, top)
        if skip_git and rel_folder == ".":
            dirs[:] = [d for d in dirs if d != ".git"]
        for name in dirs + files:
            path = Path(folder) / name
            out[os.path.normpath(os.path.join(rel_folder, name))] = _entry(path)
    return out


LEFTOVER_GLOBS = (".git/polyforge/journal.json", ".git/polyforge/*.tmp", ".git/polyforge/*.lock",
                  ".git/*.lock", ".git/refs/**/*.lock", ".git/polyforge-index-*")


@dataclass
class State:
    tree: dict
    git: str
    patches: dict
    pin: dict
    vendor: list
    leftovers: dict


def _state(root: Path) -> State:
    tree = root / "vendor" / "llama.cpp"
    git = "\n".join([(tree / ".git" / "HEAD").read_text().strip(),
                     _git(tree, "for-each-ref", "--format=%(refname) %(objectname)")])
    leftovers = {}
    for pattern in LEFTOVER_GLOBS:
        for path in tree.glob(pattern):
            leftovers[str(path.relative_to(tree))] = _entry(path)
    for path in (root / "patches").glob("*.tmp") if (root / "patches").is_dir() else ():
        leftovers[str(path.relative_to(root))] = _entry(path)
    vendor = sorted(p.name for p in (root / "vendor").iterdir() if p.name != ".lock")
    return State(_walk(tree, skip_git=True), git, _walk(root / "patches"), _walk(root / "vendor" / "pin.yaml"),
                 vendor, leftovers)


def _differences(before: dict, after: dict) -> list[str]:
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return [f"{k} ({'added' if k not in before else 'removed' if k not in after else 'changed'})" for k in changed]


def _compare(before: State, after: State) -> list[str]:
    problems = []
    if after.tree.get(USER_EDIT[0]) != before.tree.get(USER_EDIT[0]):
        problems.append(f"the user edit in {USER_EDIT[0]} was lost or changed")
    diff = _differences(before.tree, after.tree)
    if diff:
        problems.append(f"live tree changed: {', '.join(diff[:5])}")
    if after.git != before.git:
        problems.append("vendored repository HEAD/refs moved (a new commit)")
    diff = _differences(before.patches, after.patches)
    if diff:
        problems.append(f"patches/ changed: {', '.join(diff[:5])}")
    if after.pin != before.pin:
        problems.append("vendor/pin.yaml changed")
    if after.vendor != before.vendor:
        problems.append(f"vendor/ changed: {sorted(set(after.vendor) ^ set(before.vendor))}")
    left = [k for k, v in after.leftovers.items() if before.leftovers.get(k) != v]
    gone = [k for k in before.leftovers if k not in after.leftovers]
    if left:
        problems.append(f"left behind: {', '.join(sorted(left))}")
    if gone:
        problems.append(f"removed a file it did not own: {', '.join(sorted(gone))}")
    return problems


# -- running -------------------------------------------------------------------------------------
@dataclass
class Run:
    key: str
    label: str
    argv: tuple[str, ...]
    codes: tuple[int, ...]
    frag: tuple[str, ...]
    root: Path
    problems: list[str] = field(default_factory=list)


def _cli(argv: tuple[str, ...], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    """conftest.run_cli, with a short timeout (a hang is a finding, not a stall) that kills the group."""
    full_env = {**os.environ, **env}
    full_env.pop("COLUMNS", None)
    full_env.pop("POLYFORGE_ROOT", None)
    return cli_fork.run(argv, cwd, full_env, timeout)


def _check(run: Run, env: dict[str, str], timeout: float) -> None:
    before = _state(run.root)
    code, out, err = _cli(run.argv, run.root, env, timeout)
    if code is None:
        run.problems.append(f"hung: killed after {timeout:.0f} s")
    else:
        if code not in run.codes:
            first = next((ln for ln in err.splitlines() if ln.startswith("error:")), err.strip().splitlines()[-1:] or "")
            run.problems.append(f"exit {code}, want {'/'.join(map(str, run.codes))}: {str(first)[:200]}")
        if "Traceback" in err or "Traceback" in out:
            last = [ln for ln in err.splitlines() if ln.strip()][-1:] or [""]
            run.problems.append(f"traceback: {last[0][:200]}")
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        if code == 0:
            if errors:
                run.problems.append(f"exit 0 with an error line: {errors[0][:200]}")
        elif not (run.key in REPORTS and code == 1 and len(errors) <= 1) and len(errors) != 1:
            run.problems.append(f"{len(errors)} error: lines on stderr, want 1")
        if code != 0 and run.frag and not any(f in err.replace("\n", " ") for f in run.frag):
            run.problems.append(f"stderr names none of {list(run.frag)}: {(errors or [err.strip()[-200:]])[0][:200]}")
    run.problems.extend(_compare(before, _state(run.root)))


def _prepare(case: Case, template: Path, case_dir: Path, stack: list) -> Path:
    root = case_dir / "project"
    subprocess.run(["cp", "-a", str(template), str(root)], check=True)
    if case.corpus:
        shutil.copyfile(CORPUS / f"{case.id}.patch", root / "patches" / f"{case.id}.patch")
        if case.id in LOCKED_FIRST:
            from polyforge.chain.engine import Chain
            from polyforge.project import Project
            Chain(Project(root)).relock()
    if case.setup is not None:
        case.setup(root, case_dir, stack)
    return root


def _runs_for(case: Case, template: Path, tmp_path: Path, stack: list) -> list[Run]:
    runs = []
    for i, command in enumerate(case.commands):
        case_dir = tmp_path / f"run{i}"
        case_dir.mkdir()
        root = _prepare(case, template, case_dir, stack)
        if isinstance(command, str):
            key, argv, label = command, COMMANDS[command], command
        else:
            argv = tuple(a.replace("{root}", str(root)).replace("{case}", str(case_dir)) for a in command)
            key, label = argv[0], " ".join(repr(a) if not a or " " in a or "\n" in a else a for a in command)[:80]
        code, frag = case.over.get(key, (case.code, case.frag))
        codes = code if isinstance(code, tuple) else (code,)
        if command == "unapply":
            # unapply meets the user edit before anything else it could refuse, and needs no
            # unapplied patch: a dirty-tree refusal (exit 2, naming the live edits) is a right
            # answer too, wherever bad input (2) is, and for the well-formed corpus patches
            if case.corpus:
                codes = tuple(sorted(set(codes) | {2}))
            if 2 in codes:
                frag = tuple(frag) + ("live edits",)
        runs.append(Run(key, label, argv, codes, tuple(frag), root))
    return runs


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile(case: Case, templates, tmp_path):
    template = templates(case.template)
    env = {"POLYFORGE_CACHE": str(template.parent / "cache"), **case.env}
    stack: list = []
    try:
        runs = _runs_for(case, template, tmp_path, stack)
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(lambda run: _check(run, env, case.timeout), runs))
    finally:
        for undo in reversed(stack):
            undo()
    failures = [f"[{r.label}] {p}" for r in runs for p in r.problems]
    assert not failures, f"{case.id}:\n  " + "\n  ".join(failures)


def test_corpus_and_table_agree():
    """Every corpus file has a row and every row a file, so the corpus cannot rot silently."""
    files = {p.stem for p in CORPUS.glob("*.patch")}
    rows = {c.id for c in PATCH_CASES}
    assert files == rows, (sorted(files - rows), sorted(rows - files))
    assert len({c.id for c in CASES}) == len(CASES)
    assert all(set(c.commands) <= set(COMMANDS) for c in CASES if all(isinstance(x, str) for x in c.commands))


def test_template_is_sound(templates, tmp_path):
    """The control: the scratch project itself is fine, so a refusal in a case is about its hostile input."""
    template = templates("plain")
    root = tmp_path / "project"
    subprocess.run(["cp", "-a", str(template), str(root)], check=True)
    env = {"POLYFORGE_CACHE": str(template.parent / "cache")}
    code, out, err = _cli(("status", "--json"), root, env, RUN_TIMEOUT)
    info = json.loads(out)
    assert code == 0, err
    assert info["applied"] == ["0001-a.patch", "0002-b.patch"] and info["lock_drift"] == []
    assert info["live_edits"] == [{"status": "M", "path": USER_EDIT[0]}]
    # and a valid patch on top is taken by lock (the harness does not refuse everything)
    (root / "patches" / "0009-valid.patch").write_text(VALID_PATCH)
    code, out, err = _cli(("lock",), root, env, RUN_TIMEOUT)
    assert code == 0, err
    assert "0009-valid.patch" in (root / "patches" / "chain.lock").read_text()


@pytest.mark.parametrize("name", VALID)
def test_valid_corpus_patch(name, templates, tmp_path):
    """A corpus patch the table calls valid really is: lock takes it (exit 0, no drift left), and
    the chain with it then applies and unapplies (the user edit put back first)."""
    template = templates("plain")
    root = tmp_path / "project"
    subprocess.run(["cp", "-a", str(template), str(root)], check=True)
    shutil.copyfile(CORPUS / f"{name}.patch", root / "patches" / f"{name}.patch")
    (root / "vendor" / "llama.cpp" / USER_EDIT[0]).write_text(UPSTREAM_FILES[USER_EDIT[0]])
    env = {"POLYFORGE_CACHE": str(template.parent / "cache")}

    def cli(*argv: str) -> str:
        code, out, err = _cli(argv, root, env, RUN_TIMEOUT)
        assert code == 0 and "Traceback" not in err and "error:" not in err, (argv, code, err)
        return out
    cli("lock")
    assert f"{name}.patch" in (root / "patches" / "chain.lock").read_text()
    assert json.loads(cli("status", "--json"))["lock_drift"] == []
    cli("apply")
    assert json.loads(cli("status", "--json"))["applied"][-1] == f"{name}.patch"
    if name == "0202-crlf-in-hunk-body":
        assert b"// line 10, patched\r\n// line 11\n" in (root / "vendor/llama.cpp/ggml/src/ggml.c").read_bytes()
    cli("unapply")
    assert json.loads(cli("status", "--json"))["applied"] == []
    # (verify-patches would find it not canonical: corpus files are hand-written and never rewritten;
    # a captured CRLF line round-trips canonically: test_patchfile.py)
