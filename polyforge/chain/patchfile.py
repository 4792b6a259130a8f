"""Patch files: strict reading (structure, paths, line endings) and the canonical writer.

A patch is `git format-patch` shaped: a mail header (From/Date/Subject), a description with
trailers such as `Upstream-Status:`, a `---` line, then a git diff. The canonical form is
what `capture`/`refresh` write: LF only, files sorted, full blob ids, three lines of
context, no renames, no timestamps, no binary hunks; so the same trees always give the
same bytes.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from pathlib import Path

from polyforge.errors import BadInput
from polyforge.git import Git
from polyforge.hashing import sha256_bytes
from polyforge.tree_identity import excluded_by

MAGIC_FROM = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001"
PATCH_NAME = re.compile(r"^([0-9]{4})-([a-z0-9][a-z0-9.-]*)\.patch$")  # not \d: it matches any script's digits
UPSTREAM_STATUSES = ("Pending", "Submitted", "Backport", "Accepted", "Inappropriate", "Denied")
# Trailer keys a patch carries at most once: the newest value wins. Others may repeat with
# different values (Signed-off-by); an exact duplicate line collapses, as git's trailers do.
SINGLE_TRAILERS = ("Upstream-Status",)
# git stores only these two for a file; it drops other bits silently (setuid, 666, 777)
FILE_MODES = ("100644", "100755")
HEADER_KEYS = ("From", "Date", "Subject")
NAME_MAX_BYTES, PATH_MAX_BYTES = 255, 4095  # Linux's limits for one name and a whole path
_DAY_FORMAT = "%a, %d %b %Y 00:00:00 +0000"

DIFF_OPTIONS = ("-p", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--full-index",
                "-U3", "--diff-algorithm=myers", "--src-prefix=a/", "--dst-prefix=b/")

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_HUNK_NUMBER_MAX = 2**31 - 1  # git reads line numbers into an int
_INDEX = re.compile(r"^index [0-9a-f]{7,64}\.\.[0-9a-f]{7,64}(?: (\d{6}))?$")
_TRAILER = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*): (\S.*)$")
_AUTHOR = re.compile(r"^[^<>]*[^<>\s] <[^<>\s]+>$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # any but tab
_QUOTED = r'"(?:[^"\\]|\\.)*"'
_DIFF_NAMES = re.compile(rf'^diff --git ({_QUOTED}|[^"\s]\S*) ({_QUOTED}|[^"\s]\S*)$')
_C_ESCAPES = {ord("a"): 7, ord("b"): 8, ord("t"): 9, ord("n"): 10, ord("v"): 11, ord("f"): 12, ord("r"): 13,
              ord("\\"): 92, ord('"'): 34}
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

    def description(self) -> str:
        return split_trailers(self.body)[0]

    def trailers(self) -> list[str]:
        return split_trailers(self.body)[1]

    def trailer(self, key: str) -> str | None:
        """The value of the last `key` trailer."""
        values = [value for k, value in map(_trailer_parts, self.trailers()) if k.lower() == key.lower()]
        return values[-1].strip() if values else None

    def canonical(self) -> "Header":
        """The date at day precision, one trailer of each kind in one trailer paragraph (what
        capture and refresh write)."""
        description, trailers = split_trailers(self.body)
        return replace(self, date=_day_precision(self.date), body=compose_body(description, merge_trailers(trailers)))


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
    return datetime.now(timezone.utc).strftime(_DAY_FORMAT)


def _day_precision(date: str) -> str:
    """A header date as its day (in its own time zone); '' stays ''."""
    if not date:
        return date
    return parsedate_to_datetime(date).strftime(_DAY_FORMAT)


# -- descriptions and trailers ----------------------------------------------------------------
def _trailer_parts(line: str) -> tuple[str, str]:
    match = _TRAILER.match(line)
    assert match, line
    return match.group(1), match.group(2)


def _blank(line: str) -> bool:
    return not line.strip()


def _trim_blank_lines(lines: list[str]) -> list[str]:
    while lines and _blank(lines[0]):
        lines = lines[1:]
    while lines and _blank(lines[-1]):
        lines = lines[:-1]
    return lines


def split_trailers(body: str) -> tuple[str, list[str]]:
    """(description, trailer lines) of a description-and-trailers text.

    As git reads a message, the trailers are its last paragraph when every line of it is
    `Key: value`. Paragraphs of only single trailers (Upstream-Status) right above it belong
    to it too: older polyforge appended Upstream-Status as a paragraph of its own, again on
    every refresh -m, and reading them as trailers is what lets refresh collapse them.
    """
    lines = _trim_blank_lines(body.split("\n"))
    start = len(lines)
    first = True
    while start:
        end = start
        while end and _blank(lines[end - 1]):
            end -= 1
        top = end
        while top and not _blank(lines[top - 1]):
            top -= 1
        paragraph = lines[top:end]
        if not paragraph or not all(_TRAILER.match(line) for line in paragraph):
            break
        if not first and not all(_trailer_parts(line)[0].lower() in (k.lower() for k in SINGLE_TRAILERS)
                                 for line in paragraph):
            break
        start, first = top, False
    trailers = [line for line in lines[start:] if not _blank(line)]
    return "\n".join(_trim_blank_lines(lines[:start])), trailers


def merge_trailers(*groups: list[str]) -> list[str]:
    """Trailer lines of older groups first: one line per (key, value), and one of each single
    key, whose newest value takes the place of its first."""
    merged: list[str] = []
    seen: set[tuple[str, str]] = set()
    for line in (line for group in groups for line in group):
        key, value = _trailer_parts(line)
        single = next((k for k in SINGLE_TRAILERS if k.lower() == key.lower()), None)
        if single is not None:
            line = f"{single}: {value}"
            at = next((i for i, old in enumerate(merged) if _trailer_parts(old)[0] == single), None)
            if at is None:
                merged.append(line)
            else:
                merged[at] = line
        elif (key.lower(), value) not in seen:
            seen.add((key.lower(), value))
            merged.append(line)
    return merged


def compose_body(description: str, trailers: list[str]) -> str:
    return "\n\n".join(part for part in (description, "\n".join(trailers)) if part)


def check_upstream_status(value: str, where: str) -> str:
    words = value.split()
    if not words or words[0] not in UPSTREAM_STATUSES or _CONTROL.search(value) or value != value.strip():
        raise BadInput(f"{where} {value!r}: want one of {', '.join(UPSTREAM_STATUSES)} (Inappropriate [why])")
    return value


def check_author(author: str, where: str) -> str:
    if _CONTROL.search(author) or not _AUTHOR.match(author):
        raise BadInput(f"{where} {author!r}: want 'Name <email>' on one line")
    return author


def _diff_line_in_description(lines: list[str], first_line: int, where: str) -> None:
    """Refuse lines that git would read as part of a diff, or as the end of the description.

    `git apply` applies a `---`/`+++`/`@@` hunk or a `diff --git` section wherever it stands in
    the file, and `git am` ends the description at a `---`, `diff -` or `Index:` line."""
    for number, line in enumerate(lines, first_line):
        if re.match(r"^---(\s*$| \S)", line):
            what = "the end of the description" if line.strip() == "---" else "the start of a diff"
        elif line.startswith(("diff -", "Index: ", "@@ -", "GIT binary patch")):
            what = "part of a diff"
        else:
            continue
        raise BadInput(f"{where} line {number}: git would read {line[:60]!r} as {what}",
                       hint="indent quoted diff lines (e.g. by four spaces)")


def read_message_file(path: Path, where: str = "-F") -> str:
    """A message file's text: UTF-8, a file."""
    if path.is_dir():
        raise BadInput(f"{where} {path}: is a folder, not a file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"{where} {path}: cannot read it: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{where} {path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def parse_message(message: str, where: str = "the message") -> tuple[str, str, list[str]]:
    """(subject, description, trailers) of a commit-style message: subject line, blank line,
    description, and a last paragraph of trailers."""
    text = message.replace("\r\n", "\n")
    bad = _CONTROL.search(text.replace("\n", " "))
    if bad:
        raise BadInput(f"{where}: control character {bad.group()!r} (line {text[:bad.start()].count(chr(10)) + 1})")
    lines = _trim_blank_lines(text.split("\n"))
    if not lines:
        raise BadInput(f"{where} is empty: give a subject line (or leave the option out)")
    offset = text.split("\n").index(lines[0])
    _diff_line_in_description(lines[1:], offset + 2, where)
    description, trailers = split_trailers("\n".join(lines[1:]))
    for key, value in map(_trailer_parts, trailers):
        if key.lower() in (k.lower() for k in SINGLE_TRAILERS):
            check_upstream_status(value, f"{where}: {key}:")
    return lines[0].strip(), description, trailers


# -- patch files ---------------------------------------------------------------------------
def check_name(name: str) -> str:
    """Accept NNNN-slug or NNNN-slug.patch; return the file name."""
    file_name = name if name.endswith(".patch") else f"{name}.patch"
    if not PATCH_NAME.match(file_name):
        raise BadInput(f"bad patch name '{name}': want NNNN-slug (four digits, lowercase slug), e.g. 0075-my-fix")
    return file_name


def _unquote(raw: str, where: str) -> str:
    """A path as git writes it: C-style quoted (octal escapes for bytes) when it must be."""
    if not raw.startswith('"'):
        return raw
    if len(raw) < 2 or not raw.endswith('"'):
        raise BadInput(f"{where}: unterminated quoted path {raw[:80]!r}")
    body = raw[1:-1].encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(body):
        byte = body[i]
        if byte == ord('"'):
            raise BadInput(f"{where}: unescaped quote in path {raw[:80]!r}")
        if byte != ord("\\"):
            out.append(byte)
            i += 1
        elif body[i + 1:i + 2] and body[i + 1] in _C_ESCAPES:
            out.append(_C_ESCAPES[body[i + 1]])
            i += 2
        elif re.fullmatch(rb"[0-3][0-7][0-7]", body[i + 1:i + 4]):
            out.append(int(body[i + 1:i + 4], 8))
            i += 4
        else:
            raise BadInput(f"{where}: bad escape {body[i:i + 4].decode('utf-8', 'replace')!r} in quoted path {raw[:80]!r}")
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{where}: path {raw[:80]!r} is not UTF-8 once unquoted") from None


def _check_path(path: str, where: str) -> str:
    parts = path.split("/")  # not PurePosixPath: it drops '.' and empty components
    if _CONTROL.search(path) or "\t" in path:
        raise BadInput(f"{where}: control character in path {path!r}")
    if path.startswith("/"):
        raise BadInput(f"{where}: absolute path {path!r} points outside the tree")
    # longer names cannot be checked out (ENAMETOOLONG): a patch with one could never be applied live
    if len(path.encode()) > PATH_MAX_BYTES or any(len(part.encode()) > NAME_MAX_BYTES for part in parts):
        raise BadInput(f"{where}: path {path[:60]!r}... is too long (a name may have {NAME_MAX_BYTES} bytes, "
                       f"a path {PATH_MAX_BYTES})")
    if any(part in ("", ".", "..") for part in parts):
        raise BadInput(f"{where}: path {path!r} escapes the tree")
    # git refuses a .git component at any depth, in any case ('.GIT', '.git.' on NTFS and HFS+)
    if any(part.lower().rstrip(". ") == ".git" for part in parts):
        raise BadInput(f"{where}: path {path!r} touches git metadata")
    excluded = excluded_by(path)
    if excluded:
        # the tree identity ignores these folders: a patch there could never be unapplied
        raise BadInput(f"{where}: {path} is under {excluded}, which is excluded from the tree's identity (build outputs)")
    return path


def _strip_prefix(raw: str, prefix: str, where: str) -> str:
    path = _unquote(raw, where)
    if not path.startswith(prefix):
        raise BadInput(f"{where}: expected a '{prefix}' path, got {raw[:80]!r}")
    return _check_path(path[len(prefix):], where)


def _diff_names(line: str, where: str) -> tuple[str, str]:
    """The a/ and b/ paths of a `diff --git` line; an unquoted name may hold spaces when both are equal."""
    match = _DIFF_NAMES.match(line)
    if match:
        return _strip_prefix(match.group(1), "a/", where), _strip_prefix(match.group(2), "b/", where)
    rest = line[len("diff --git "):]
    half = (len(rest) - 5) // 2
    name = rest[2:2 + half]
    if half > 0 and rest == f"a/{name} b/{name}":
        path = _check_path(name, where)
        return path, path
    raise BadInput(f"{where}: cannot read file names in {line[:80]!r}")


def _check_mode(mode: str, path: str, where: str) -> None:
    if mode == "120000":
        raise BadInput(f"{where}: {path} would be a symlink (mode 120000); patches may not create or change symlinks")
    if mode == "160000":
        raise BadInput(f"{where}: {path} would be a gitlink (mode 160000, a submodule); patches may not create or change gitlinks")
    if mode not in FILE_MODES:
        raise BadInput(f"{where}: mode {mode} for {path}: a patch may use only {' and '.join(FILE_MODES)}")


def _file_line(line: str, marker: str) -> str:
    """The name of a '---'/'+++' line; git ends a name that holds a space with a tab."""
    name = line[len(marker):]
    return name[:-1] if name.endswith("\t") and " " in name else name


def parse_diff(diff: str, where: str, first_line: int = 1) -> tuple[FileChange, ...]:
    """Validate a git diff's structure, paths and modes; return the files it changes.
    `first_line` is the diff's first line number in its file, for the messages."""
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    changes: list[FileChange] = []
    i = 0
    if not lines or not lines[0].startswith("diff --git "):
        raise BadInput(f"{where}: no 'diff --git' section (corrupt or empty patch)")
    while i < len(lines):
        line = lines[i]
        at = f"{where} line {i + first_line}"
        if not line.startswith("diff --git "):
            raise BadInput(f"{at}: unexpected text {line[:60]!r} (corrupt patch)")
        old, new = _diff_names(line, at)
        if old != new:
            raise BadInput(f"{at}: {old} -> {new}: renames are not supported; write them as delete + add")
        if any(c.path == new for c in changes):
            raise BadInput(f"{at}: {new} appears more than once in the patch")
        kind = "modified"
        old_name = new_name = None  # the '---' and '+++' lines' names
        i += 1
        while i < len(lines) and not lines[i].startswith(("diff --git ", "@@ ")):
            meta = lines[i]
            at = f"{where} line {i + first_line}"
            if meta.startswith("GIT binary patch") or meta.startswith("Binary files "):
                raise BadInput(f"{at}: binary hunk for {new}; patches must be text")
            if not meta.startswith(_HEADER_LINE_PREFIXES):
                raise BadInput(f"{at}: unexpected header line {meta[:60]!r} (corrupt patch)")
            if meta.startswith(("rename ", "copy ", "similarity", "dissimilarity")):
                raise BadInput(f"{at}: renames and copies are not supported; write them as delete + add")
            if meta.startswith(("new file mode ", "deleted file mode ", "old mode ", "new mode ")):
                _check_mode(meta.split()[-1], new, at)
                if meta.startswith("new file mode "):
                    kind = "added"
                elif meta.startswith("deleted file mode "):
                    kind = "deleted"
                elif meta.startswith("new mode ") and kind == "modified":
                    kind = "mode"
            elif meta.startswith("index "):
                index = _INDEX.match(meta)
                if not index:
                    raise BadInput(f"{at}: malformed index line {meta[:80]!r}")
                if index.group(1):
                    _check_mode(index.group(1), new, at)
            elif meta.startswith("--- "):
                old_name = _file_line(meta, "--- ")
                expected = "/dev/null" if kind == "added" else f"a/{old}"
                if old_name != "/dev/null" and kind != "added":
                    old_name = "a/" + _strip_prefix(old_name, "a/", at)
                if old_name != expected:
                    raise BadInput(f"{at}: {meta[:80]!r} does not match '--- {expected}' of its 'diff --git' line")
            elif meta.startswith("+++ "):
                new_name = _file_line(meta, "+++ ")
                expected = "/dev/null" if kind == "deleted" else f"b/{new}"
                if new_name != "/dev/null" and kind != "deleted":
                    new_name = "b/" + _strip_prefix(new_name, "b/", at)
                if old_name is None or new_name != expected:
                    raise BadInput(f"{at}: {meta[:80]!r} does not match '+++ {expected}' of its 'diff --git' line")
            i += 1
        if i < len(lines) and lines[i].startswith("@@ ") and new_name is None:
            raise BadInput(f"{where} line {i + first_line}: hunks for {new} without '---' and '+++' lines (corrupt patch)")
        if kind == "modified" and not (i < len(lines) and lines[i].startswith("@@ ")):
            raise BadInput(f"{where} line {i + first_line - 1}: the section for {new} changes nothing (corrupt patch)")
        old_end = 0  # the first old line the next hunk may touch
        while i < len(lines) and lines[i].startswith("@@ "):
            at = f"{where} line {i + first_line}"
            hunk = _HUNK.match(lines[i])
            if not hunk:
                raise BadInput(f"{at}: malformed hunk header {lines[i][:60]!r}")
            old_start, old_left, new_start, new_left = (int(n) if n is not None else 1 for n in hunk.groups())
            if max(old_start, old_left, new_start, new_left) > _HUNK_NUMBER_MAX:
                raise BadInput(f"{at}: absurd line number or count in {lines[i][:60]!r}")
            if (old_start == 0 and old_left) or (new_start == 0 and new_left):
                raise BadInput(f"{at}: hunk header {lines[i][:60]!r} starts at line 0 yet has lines")
            if not old_left and not new_left:
                raise BadInput(f"{at}: empty hunk {lines[i][:60]!r} (corrupt patch)")
            if old_start < old_end:
                raise BadInput(f"{at}: hunk in {new} overlaps the one before it or is out of order (corrupt patch)")
            old_end = old_start + max(old_left, 1)
            start = i + first_line
            i += 1
            after_line = False  # a '\\ No newline' marker follows a line of the hunk
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
                elif tag == "\\" and after_line:
                    pass
                else:
                    raise BadInput(f"{where} line {i + first_line}: corrupt hunk line {body[:60]!r} in {new}")
                if old_left < 0 or new_left < 0:
                    raise BadInput(f"{where} line {i + first_line}: hunk longer than its header says in {new} (corrupt patch)")
                after_line = tag != "\\"
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
    if "\0" in text:
        raise BadInput(f"{where} line {text[:text.index(chr(0))].count(chr(10)) + 1}: NUL byte; patches must be text")
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
    changes = parse_diff(diff, where, first_line=head.count("\n") + 1)
    return Patch(name=name, path=path, data=data, header=header, diff=diff, changes=changes)


def _parse_header(head: str, where: str) -> Header:
    if not head:
        return Header(author="", date="", subject="", body="")
    lines = head.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    # the last '---' line before the diff separates the description from the diff; nothing
    # else before the diff may read as a diff to git (it would apply it) or end the description
    try:
        sep = len(lines) - 1 - lines[::-1].index("---")
    except ValueError:
        sep = len(lines)
    _diff_line_in_description(lines[:sep], 1, where)
    _diff_line_in_description(lines[sep + 1:], sep + 2, where)
    meta: dict[str, str] = {}
    i = 0
    if i < len(lines) and lines[i].startswith("From ") and not lines[i].startswith("From: "):
        i += 1
    key = ""
    while i < sep and lines[i]:
        at = f"{where} line {i + 1}"
        if lines[i][:1] in (" ", "\t") and key:
            meta[key] += lines[i]  # a folded header line, unfolded as git am reads it
            i += 1
            continue
        key, colon, value = lines[i].partition(": ")
        if not colon:
            raise BadInput(f"{at}: malformed header line {lines[i][:60]!r}")
        if key not in HEADER_KEYS:
            raise BadInput(f"{at}: unknown header {key[:40]!r} (a patch header has {', '.join(HEADER_KEYS)})")
        if key in meta:
            raise BadInput(f"{at}: header {key} given twice")
        meta[key] = value
        i += 1
    if "From" in meta:
        check_author(meta["From"], f"{where}: From:")
    if "Date" in meta:
        try:
            parsedate_to_datetime(meta["Date"])
        except (TypeError, ValueError):
            raise BadInput(f"{where}: Date: {meta['Date'][:60]!r} is not an RFC 2822 date") from None
    subject = meta.get("Subject", "")
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    body = "\n".join(lines[i + 1:sep]).strip("\n")
    return Header(author=meta.get("From", ""), date=meta.get("Date", ""), subject=subject, body=body)


def read(path: Path) -> Patch:
    """A patch file: a regular file (not a symlink, which may point anywhere; not a FIFO, which blocks)."""
    try:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            raise BadInput(f"{path.name}: a symlink; a patch must be a regular file in patches/")
        if not stat.S_ISREG(mode):
            raise BadInput(f"{path.name}: not a regular file; a patch must be a regular file in patches/")
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
    header = (header or patch.header).canonical()
    if not header.subject:
        header = replace(header, subject=patch.slug.replace("-", " "))
    return render(header, generate_diff(git, old_tree, new_tree))
