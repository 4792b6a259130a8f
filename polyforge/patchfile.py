"""Patch files: strict reading (structure, paths, line endings) and the canonical writer.

A patch is `git format-patch` shaped: a mail header (From/Date/Subject), a description with
trailers such as `Upstream-Status:`, a `---` line, then a git diff. The canonical form is
what `capture`/`refresh` write: LF only, files sorted, full blob ids, three lines of
context, no renames, no timestamps, no binary hunks; so the same trees always give the
same bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from .errors import BadInput
from .git import Git
from .hashing import sha256_bytes

MAGIC_FROM = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"
PATCH_NAME = re.compile(r"^(\d{4})-([a-z0-9][a-z0-9.-]*)\.patch$")
UPSTREAM_STATUSES = ("Pending", "Submitted", "Backport", "Accepted", "Inappropriate", "Denied")

DIFF_OPTIONS = ("-p", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--full-index",
                "-U3", "--diff-algorithm=myers", "--src-prefix=a/", "--dst-prefix=b/")

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_HEADER_LINE_PREFIXES = ("diff --git ", "index ", "--- ", "+++ ", "new file mode ", "deleted file mode ",
                         "old mode ", "new mode ", "similarity index ", "dissimilarity index ",
                         "rename from ", "rename to ", "copy from ", "copy to ")


@dataclass(frozen=True)
class Header:
    author: str
    date: str
    subject: str
    body: str  # description and trailers, no trailing newline

    def render(self) -> str:
        lines = [MAGIC_FROM, f"From: {self.author}", f"Date: {self.date}", f"Subject: [PATCH] {self.subject}", ""]
        if self.body:
            lines += [self.body, ""]
        return "\n".join(lines) + "---\n"

    def trailer(self, key: str) -> str | None:
        for line in reversed(self.body.splitlines()):
            if line.startswith(f"{key}: "):
                return line[len(key) + 2:].strip()
        return None


@dataclass(frozen=True)
class FileChange:
    path: str
    kind: str  # "modified", "added", "deleted", "mode"


@dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    data: bytes
    header: Header
    diff: str
    changes: tuple[FileChange, ...] = field(default_factory=tuple)

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.data)

    @property
    def number(self) -> str:
        return self.name[:4]

    @property
    def slug(self) -> str:
        return self.name[5:-len(".patch")]

    def paths(self) -> list[str]:
        return [c.path for c in self.changes]


def today_date() -> str:
    """The capture date, day precision, so a patch's bytes do not carry a wall-clock time."""
    now = datetime.now(timezone.utc)
    return now.strftime("%a, %d %b %Y 00:00:00 +0000")


def check_name(name: str) -> str:
    """Accept NNNN-slug or NNNN-slug.patch; return the file name."""
    file_name = name if name.endswith(".patch") else f"{name}.patch"
    if not PATCH_NAME.match(file_name):
        raise BadInput(f"bad patch name '{name}': want NNNN-slug (four digits, lowercase slug), e.g. 0075-my-fix")
    return file_name


def _unquote(path: str) -> str:
    if path.startswith('"') and path.endswith('"'):
        body = path[1:-1]
        return body.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode("utf-8")
    return path


def _check_path(raw: str, where: str) -> str:
    path = _unquote(raw)
    pure = PurePosixPath(path)
    if path.startswith("/") or pure.is_absolute():
        raise BadInput(f"{where}: absolute path {path!r} points outside the tree")
    if ".." in pure.parts or "." in pure.parts or not pure.parts:
        raise BadInput(f"{where}: path {path!r} escapes the tree")
    if pure.parts[0] == ".git":
        raise BadInput(f"{where}: path {path!r} touches git metadata")
    return path


def _strip_prefix(raw: str, prefix: str, where: str) -> str:
    path = _unquote(raw)
    if not path.startswith(prefix):
        raise BadInput(f"{where}: expected a '{prefix}' path, got {raw!r}")
    return _check_path(path[len(prefix):], where)


def parse_diff(diff: str, where: str) -> tuple[FileChange, ...]:
    """Validate a git diff's structure and paths; return the files it changes."""
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    changes: list[FileChange] = []
    i = 0
    if not lines or not lines[0].startswith("diff --git "):
        raise BadInput(f"{where}: no 'diff --git' section (corrupt or empty patch)")
    while i < len(lines):
        line = lines[i]
        at = f"{where} line {i + 1}"
        if not line.startswith("diff --git "):
            raise BadInput(f"{at}: unexpected text {line[:60]!r} (corrupt patch)")
        m = re.match(r'^diff --git (\S+|"[^"]*") (\S+|"[^"]*")$', line)
        if not m:
            raise BadInput(f"{at}: cannot read file names in {line[:80]!r}")
        old = _strip_prefix(m.group(1), "a/", at)
        new = _strip_prefix(m.group(2), "b/", at)
        kind = "modified"
        i += 1
        while i < len(lines) and not lines[i].startswith(("diff --git ", "@@ ")):
            meta = lines[i]
            at = f"{where} line {i + 1}"
            if meta.startswith("GIT binary patch") or meta.startswith("Binary files "):
                raise BadInput(f"{at}: binary hunk for {new}; patches must be text")
            if not meta.startswith(_HEADER_LINE_PREFIXES):
                raise BadInput(f"{at}: unexpected header line {meta[:60]!r} (corrupt patch)")
            if meta.startswith(("rename ", "copy ", "similarity", "dissimilarity")):
                raise BadInput(f"{at}: renames and copies are not supported; write them as delete + add")
            if meta.startswith("new file mode "):
                kind = "added"
                mode = meta.split()[-1]
            elif meta.startswith("deleted file mode "):
                kind = "deleted"
                mode = ""
            elif meta.startswith("new mode "):
                kind = "mode" if kind == "modified" else kind
                mode = meta.split()[-1]
            else:
                mode = ""
            if mode == "120000":
                raise BadInput(f"{at}: {new} would become a symlink; patches may not create symlinks")
            if meta.startswith("--- ") and meta != "--- /dev/null":
                _strip_prefix(meta[4:], "a/", at)
            if meta.startswith("+++ ") and meta != "+++ /dev/null":
                _strip_prefix(meta[4:], "b/", at)
            i += 1
        if old != new:
            raise BadInput(f"{where}: {old} -> {new}: renames are not supported; write them as delete + add")
        while i < len(lines) and lines[i].startswith("@@ "):
            hunk = _HUNK.match(lines[i])
            if not hunk:
                raise BadInput(f"{where} line {i + 1}: malformed hunk header {lines[i][:60]!r}")
            old_left = int(hunk.group(2) or "1")
            new_left = int(hunk.group(4) or "1")
            start = i + 1
            i += 1
            while old_left > 0 or new_left > 0:
                if i >= len(lines):
                    raise BadInput(f"{where}: truncated patch: the hunk at line {start} of {new} ends early")
                body = lines[i]
                tag = body[:1]
                if tag == " " or body == "":
                    old_left -= 1
                    new_left -= 1
                elif tag == "-":
                    old_left -= 1
                elif tag == "+":
                    new_left -= 1
                elif tag == "\\":
                    pass
                else:
                    raise BadInput(f"{where} line {i + 1}: corrupt hunk line {body[:60]!r} in {new}")
                if old_left < 0 or new_left < 0:
                    raise BadInput(f"{where} line {i + 1}: hunk longer than its header says in {new} (corrupt patch)")
                i += 1
            if i < len(lines) and lines[i].startswith("\\"):
                i += 1
        changes.append(FileChange(new, kind))
    return tuple(changes)


def parse(data: bytes, name: str, path: Path) -> Patch:
    where = name
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{where}: not UTF-8 text (byte {exc.start}); binary content is not supported") from None
    if not text:
        raise BadInput(f"{where}: empty file")
    for number, line in enumerate(text.split("\n"), 1):
        if line.endswith("\r") and (number < 8 or line.startswith(("diff --git", "@@", "---", "+++", "index "))):
            raise BadInput(f"{where} line {number}: CRLF line endings; patches must use LF (check core.autocrlf)")
    if not text.endswith("\n"):
        raise BadInput(f"{where}: truncated patch (no final newline)")
    diff_at = text.find("\ndiff --git ")
    if text.startswith("diff --git "):
        diff_at = -1
    elif diff_at < 0:
        raise BadInput(f"{where}: no 'diff --git' section (corrupt or empty patch)")
    head, diff = ("", text) if diff_at < 0 else (text[:diff_at + 1], text[diff_at + 1:])
    header = _parse_header(head, where)
    changes = parse_diff(diff, where)
    return Patch(name=name, path=path, data=data, header=header, diff=diff, changes=changes)


def _parse_header(head: str, where: str) -> Header:
    if not head:
        return Header(author="", date="", subject="", body="")
    lines = head.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    # the last '---' line before the diff separates the description from the diff
    try:
        sep = len(lines) - 1 - lines[::-1].index("---")
    except ValueError:
        sep = len(lines)
    meta: dict[str, str] = {}
    i = 0
    if i < len(lines) and lines[i].startswith("From ") and not lines[i].startswith("From: "):
        i += 1
    while i < sep and lines[i]:
        key, colon, value = lines[i].partition(": ")
        if not colon:
            raise BadInput(f"{where} line {i + 1}: malformed header line {lines[i][:60]!r}")
        meta[key] = value
        i += 1
    subject = meta.get("Subject", "")
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    body = "\n".join(lines[i + 1:sep]).strip("\n")
    return Header(author=meta.get("From", ""), date=meta.get("Date", ""), subject=subject, body=body)


def read(path: Path) -> Patch:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    return parse(data, path.name, path)


def generate_diff(git: Git, old_tree: str, new_tree: str) -> str:
    """The canonical diff between two trees; rejects binary changes."""
    diff = git.run("diff-tree", *DIFF_OPTIONS, old_tree, new_tree, strip=False)
    for line in diff.split("\n"):
        if line.startswith("Binary files ") or line.startswith("GIT binary patch"):
            raise BadInput(f"binary change ({line.strip()}); patches must be text")
    return diff


def render(header: Header, diff: str) -> bytes:
    return (header.render() + diff).encode("utf-8")


def canonical(patch: Patch, git: Git, old_tree: str, new_tree: str, header: Header | None = None) -> bytes:
    """The bytes `refresh` would write for `patch` given the trees it goes between (and a new header)."""
    header = header or patch.header
    if not header.subject:
        header = replace(header, subject=patch.slug.replace("-", " "))
    return render(header, generate_diff(git, old_tree, new_tree))
