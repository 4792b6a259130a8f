"""Review of one replayed patch: what a reviewer should look at after `polyforge rebase`.

A 3-way merge that applies cleanly is not a correct one: it may have put a hunk at a
look-alike place, merged into a function upstream rewrote, or kept a name upstream renamed.
`review_patch` compares a patch's old version (old_pre -> old_post, on the old upstream)
with its replayed one (new_pre -> new_post, on the new upstream) and upstream's own change
(old_base -> new_base), and returns findings, each one line a human reads:

  far-hunk                   a hunk landed more than FAR_LINES from where the edits above it
                             carry it (a move those edits explain is routine: not reported)
  ambiguous-context          a hunk's pre-image occurs more than once in its file (and did
                             not, or the hunk is not where it was carried)
  function-changed-upstream  upstream changed the function (or the lines) the hunk edits,
                             or renamed, deleted or added a file the patch touches
  name-gone                  the patch uses a name upstream had and no longer has
  interdiff                  the patch's own change (its -/+ lines) differs from the old one

Findings are hints, not verdicts: replaying a patch onto the tree it came from gives none,
and so does a clean replay that upstream's edits only shifted. Every diff comes from git, with
the options of the patch files
(`patchfile.DIFF_OPTIONS`), so hunk positions and function names are git's own.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass, field

from polyforge.chain.patchfile import DIFF_OPTIONS, generate_diff
from polyforge.git import Git, GitFailed

KINDS = ("far-hunk", "ambiguous-context", "function-changed-upstream", "name-gone", "interdiff")

FAR_LINES = 100  # a hunk moved further than this (lines) is worth a look
# A pre-image with fewer non-blank lines than this (a hunk at the very top or end of a file)
# recurs by chance (`}` and `#endif` lines), so its repeats say nothing about the merge.
MIN_PRE_IMAGE_LINES = 3
INTERDIFF_LINES = 20  # diff lines an interdiff finding shows
# C/C++ identifiers, as `git grep -w` delimits words: shorter ones are too common to mean anything
IDENTIFIER = re.compile(r"(?<![A-Za-z0-9_])[A-Za-z_][A-Za-z0-9_]{3,}")
# git's default funcname heuristic also picks these lines, which enclose whole files
# (`extern "C" {`, `namespace x {`, `template <...>`, `public:`): they name no function
_GENERIC_FUNC = re.compile(r"^(extern\b|namespace\b|template\b|[A-Za-z_]\w*\s*:\s*$)")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_QUOTED = re.compile(r'^"((?:[^"\\]|\\.)*)"')
_MODE_LINES = ("new file mode ", "deleted file mode ", "old mode ", "new mode ")
_LITERAL = {"GIT_LITERAL_PATHSPECS": "1"}  # a path is a path, not a glob
# prose, not code: a sentence upstream reworded is no vanished name
_PROSE = (".md", ".rst", ".adoc", ".html", ".htm")  # not .txt: CMakeLists.txt is code
_GREP_CHUNK = 2000  # names per `git grep` pattern: one alternation, so one pass over the tree


@dataclass(frozen=True)
class Finding:
    kind: str  # one of KINDS
    path: str | None
    detail: str  # one line a human reads (an interdiff adds its diff lines below it)

    def as_dict(self) -> dict:
        return asdict(self)


# -- diffs as data --------------------------------------------------------------------------
@dataclass
class _Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    func: str  # git's funcname: the text after the second @@
    lines: list[str] = field(default_factory=list)  # body lines, each with its tag

    @property
    def pre_image(self) -> list[str]:
        return [line[1:] for line in self.lines if line[:1] in (" ", "-")]

    @property
    def changed(self) -> list[str]:
        return [line for line in self.lines if line[:1] in ("-", "+")]


@dataclass
class _FileDiff:
    path: str
    kind: str = "modified"  # or "added", "deleted"
    modes: list[str] = field(default_factory=list)  # new file mode / old mode ... lines
    hunks: list[_Hunk] = field(default_factory=list)

    def own_change(self) -> list[str]:
        """The change itself: mode lines and -/+ lines (and their no-newline markers), with no
        context, line numbers or blob ids, which all move when upstream does."""
        own = list(self.modes)
        for hunk in self.hunks:
            for i, line in enumerate(hunk.lines):
                if line[:1] in ("-", "+") or (line[:1] == "\\" and i and hunk.lines[i - 1][:1] in ("-", "+")):
                    own.append(line)
        return own


def _unquote(token: str) -> str:
    """A path as git writes it when it must quote it (C escapes, octal bytes)."""
    raw = token[1:-1].encode("utf-8", "surrogateescape").decode("unicode_escape")
    return raw.encode("latin-1").decode("utf-8", "surrogateescape")


def _diff_path(line: str) -> str:
    """The path of a `diff --git a/P b/P` line (renames are off, so both names are one)."""
    rest = line[len("diff --git "):]
    quoted = _QUOTED.match(rest)
    if quoted:
        return _unquote(quoted.group(0))[2:]
    return rest[2:2 + (len(rest) - 5) // 2]


def _parse(diff: str) -> dict[str, _FileDiff]:
    """Files of a git diff by path, with their hunks."""
    files: dict[str, _FileDiff] = {}
    current: _FileDiff | None = None
    lines = diff.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith("diff --git "):
            path = _diff_path(line)
            current = files.setdefault(path, _FileDiff(path))
        elif current is None:
            continue
        elif line.startswith(_MODE_LINES):
            current.modes.append(line)
            if line.startswith("new file mode "):
                current.kind = "added"
            elif line.startswith("deleted file mode "):
                current.kind = "deleted"
        elif (match := _HUNK.match(line)):
            old_start, old_count, new_start, new_count = (int(n) if n is not None else 1 for n in match.groups()[:4])
            hunk = _Hunk(old_start, old_count, new_start, new_count, match.group(5).strip())
            old_left, new_left = old_count, new_count
            # the counts say where a hunk ends: a body line may itself look like a header
            while i < len(lines) and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
                body = lines[i]
                tag = body[:1]
                if tag in (" ", ""):
                    old_left, new_left = old_left - 1, new_left - 1
                    body = body or " "
                elif tag == "-":
                    old_left -= 1
                elif tag == "+":
                    new_left -= 1
                hunk.lines.append(body)
                i += 1
            current.hunks.append(hunk)
    return files


def _tree_diff(repo: Git, old: str, new: str, paths: list[str], context: int = 3) -> dict[str, _FileDiff]:
    """git's diff of two trees for `paths` (binary files come back without hunks)."""
    if not paths:
        return {}
    options = [opt if opt != "-U3" else f"-U{context}" for opt in DIFF_OPTIONS]
    return _parse(repo.run("diff-tree", "-r", *options, old, new, "--", *paths, env=_LITERAL, strip=False))


def added_lines(repo: Git, pre: str, post: str) -> dict[str, list[str]]:
    """Per file, the lines a change from tree `pre` to tree `post` adds (its own change's '+' side)."""
    paths = [path for _, path in repo.diff_names(pre, post)]
    return {path: [line[1:] for hunk in diff.hunks for line in hunk.lines if line[:1] == "+"]
            for path, diff in _tree_diff(repo, pre, post, paths).items()}


def _files_in(repo: Git, tree: str, paths: list[str]) -> set[str]:
    if not paths:
        return set()
    out = repo.run("ls-tree", "-r", "-z", "--name-only", tree, "--", *paths, env=_LITERAL, strip=False)
    return set(filter(None, out.split("\0")))


def _read_lines(repo: Git, tree: str, paths: list[str]) -> dict[str, list[str]]:
    """Each file's lines in `tree` (one `cat-file --batch` for all of them)."""
    if not paths:
        return {}
    request = "".join(f"{tree}:{path}\n" for path in paths).encode("utf-8", "surrogateescape")
    # the sizes are in bytes: read the answer as bytes (git's output is decoded losslessly)
    out = repo.run("cat-file", "--batch", input=request, strip=False).encode("utf-8", "surrogateescape")
    texts: dict[str, list[str]] = {}
    at = 0
    for path in paths:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        at = end + 1
        if len(header) != 3:  # "<name> missing"
            continue
        size = int(header[2])
        text = out[at:at + size].decode("utf-8", "surrogateescape")
        at += size + 1
        if header[1] == b"blob":
            texts[path] = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
    return texts


def _shift(hunks: list[_Hunk], line: int, *, from_new: bool = False) -> int:
    """Lines that a -U0 diff's hunks wholly above `line` add (subtract: from_new), i.e. how far
    the line moves from the diff's old side to its new side (or back)."""
    moved = 0
    for hunk in hunks:
        start, count = (hunk.new_start, hunk.new_count) if from_new else (hunk.old_start, hunk.old_count)
        # a hunk of count 0 sits after its start line; else it covers start..start+count-1
        if start + max(count, 1) <= line:
            moved += hunk.new_count - hunk.old_count
    return -moved if from_new else moved


# -- the checks -------------------------------------------------------------------------------
def _pairs(old: list[_Hunk], new: list[_Hunk]) -> list[tuple[int, _Hunk, _Hunk]]:
    """(new hunk's number, old hunk, new hunk): by order when the counts match, else the most
    alike changed lines first (a ratio of at least one half)."""
    if len(old) == len(new):
        return [(n, o, h) for n, (o, h) in enumerate(zip(old, new), 1)]
    scored = sorted(((difflib.SequenceMatcher(None, o.changed, h.changed, autojunk=False).ratio(), i, j)
                     for i, o in enumerate(old) for j, h in enumerate(new)), reverse=True)
    used_old: set[int] = set()
    used_new: set[int] = set()
    pairs = []
    for ratio, i, j in scored:
        if ratio >= 0.5 and i not in used_old and j not in used_new:
            used_old.add(i)
            used_new.add(j)
            pairs.append((j + 1, old[i], new[j]))
    return sorted(pairs, key=lambda pair: pair[0])


@dataclass(frozen=True)
class _Placement:
    """A hunk of the replayed patch with its counterpart in the old patch."""

    number: int  # the new hunk's number in its file, from 1
    old: _Hunk
    new: _Hunk
    carried: int  # where the diff of the two pre-images carries the old hunk's first line


def _placements(repo: Git, old: dict[str, _FileDiff], new: dict[str, _FileDiff],
                old_pre: str, new_pre: str) -> dict[str, list[_Placement]]:
    """Paired hunks of each file both versions of the patch modify. The diff old_pre -> new_pre
    (upstream's edits and the earlier patches') carries an old hunk to where a faithful merge
    puts it; the rest of a move is the merge's doing."""
    paths = sorted(p for p in new if p in old and old[p].kind == new[p].kind == "modified")
    pre_diff = _tree_diff(repo, old_pre, new_pre, paths, context=0)
    placements = {}
    for path in paths:
        edits = pre_diff[path].hunks if path in pre_diff else []
        placements[path] = [_Placement(number, o, h, o.old_start + _shift(edits, o.old_start))
                            for number, o, h in _pairs(old[path].hunks, new[path].hunks)]
    return placements


def _far_hunks(placements: dict[str, list[_Placement]]) -> list[Finding]:
    """A hunk that lands more than FAR_LINES from where the diff of the two pre-images carries
    it (the detail says how much of the move the edits above it explain)."""
    findings = []
    for path, pairs in placements.items():
        for pair in pairs:
            was, now = pair.old.old_start, pair.new.old_start
            moved, explained = now - was, pair.carried - was
            if abs(now - pair.carried) > FAR_LINES:
                because = f"; edits above it explain {explained:+d}" if explained else ""
                findings.append(Finding("far-hunk", path, f"hunk {pair.number} of {path} moved {moved:+d} lines "
                                                          f"(old line {was}, new line {now}{because})"))
    return findings


def _occurrences(lines: list[str], block: list[str]) -> list[int]:
    """1-based line numbers where `block` occurs in `lines` (overlapping ones too)."""
    first, size = block[0], len(block)
    return [i + 1 for i, line in enumerate(lines) if line == first and lines[i:i + size] == block]


def _ambiguous(new: dict[str, _FileDiff], pre_lines: dict[str, list[str]], old_pre_lines: dict[str, list[str]],
               placements: dict[str, list[_Placement]]) -> list[Finding]:
    """A hunk whose pre-image (context and removed lines) occurs more than once in new_pre's
    file: a merge that placed it by its context may have picked the wrong one.

    Not reported when nothing changed about it: the old hunk's pre-image had as many
    look-alikes in old_pre, and the new hunk sits exactly where the pre-images' diff carries
    the old one (a patch that edits each of three identical blocks, replayed faithfully)."""
    findings = []
    for path, diff in sorted(new.items()):
        if path not in pre_lines:
            continue
        settled = {pair.number: pair for pair in placements.get(path, [])}
        for number, hunk in enumerate(diff.hunks, 1):
            block = hunk.pre_image
            if sum(1 for line in block if line.strip()) < MIN_PRE_IMAGE_LINES:
                continue
            at = _occurrences(pre_lines[path], block)
            if len(at) < 2:
                continue
            pair = settled.get(number)
            if (pair and pair.carried == hunk.old_start and path in old_pre_lines
                    and len(_occurrences(old_pre_lines[path], pair.old.pre_image)) >= len(at)):
                continue
            where = ", ".join(map(str, at[:5])) + (", ..." if len(at) > 5 else "")
            findings.append(Finding("ambiguous-context", path, (
                f"hunk {number} of {path}: its {len(block)}-line pre-image occurs {len(at)} times "
                f"(lines {where}; the patch is at {hunk.old_start}); the merge may have picked a look-alike place")))
    return findings


def _upstream_changes(repo: Git, old: dict[str, _FileDiff], new: dict[str, _FileDiff], old_base: str,
                      new_base: str, new_pre: str) -> list[Finding]:
    """Where upstream's own change meets the patch.

    A hunk of the replayed patch is reported when upstream changed the same function (the
    same git funcname in a hunk header of upstream's diff of that file) or lines within the
    hunk's range, context included. Ranges compare in new_base's lines: the patch's hunk is
    carried from new_pre back to new_base over the diff of the two (the earlier patches), a
    line inside an earlier patch's own hunk staying approximate. Files: upstream deleted or
    renamed a file the old patch changed, or now has a file the old patch added.
    """
    paths = sorted(set(old) | set(new))
    in_old, in_new = _files_in(repo, old_base, paths), _files_in(repo, new_base, paths)
    findings = []
    gone = [p for p in paths if p in old and old[p].kind != "added" and p in in_old and p not in in_new]
    renamed = _renames(repo, old_base, new_base) if gone else {}
    for path in gone:
        if path in renamed:
            detail = f"{path}: upstream renamed it to {renamed[path]}; the patch changed it, check where that change went"
        else:
            detail = f"{path}: upstream deleted it; the patch changed it, check where that change went"
        findings.append(Finding("function-changed-upstream", path, detail))
    for path in paths:
        if path in old and old[path].kind == "added" and path not in in_old and path in in_new:
            findings.append(Finding("function-changed-upstream", path,
                                    f"{path}: the patch adds it, but upstream now has it too; check the merge"))

    touched = [p for p in sorted(new) if new[p].kind == "modified" and p in in_old and p in in_new]
    upstream = _tree_diff(repo, old_base, new_base, touched)
    touched = [p for p in touched if p in upstream and upstream[p].hunks]
    earlier = _tree_diff(repo, new_base, new_pre, touched, context=0)
    for path in touched:
        theirs = upstream[path].hunks
        funcs = {h.func for h in theirs if h.func and not _GENERIC_FUNC.match(h.func)}
        carried = earlier[path].hunks if path in earlier else []
        seen: set[str] = set()
        for hunk in new[path].hunks:
            first = hunk.old_start + _shift(carried, hunk.old_start, from_new=True)
            last = first + max(hunk.old_count, 1) - 1
            overlap = next((h for h in theirs
                            if h.new_start <= last and first <= h.new_start + max(h.new_count, 1) - 1), None)
            named = hunk.func if hunk.func and not _GENERIC_FUNC.match(hunk.func) else ""
            if named and (named in funcs or overlap):
                detail = f"{path}: {named} changed upstream too; check the merge"
            elif overlap:
                detail = (f"{path}: lines {first}-{last} changed upstream too (upstream's hunk at line "
                          f"{overlap.new_start}); check the merge")
            else:
                continue
            if detail not in seen:
                seen.add(detail)
                findings.append(Finding("function-changed-upstream", path, detail))
    return findings


def _renames(repo: Git, old_base: str, new_base: str) -> dict[str, str]:
    """Upstream's renames, old path -> new path (git's rename detection over the whole tree)."""
    out = repo.run("diff-tree", "-r", "-M", "--diff-filter=R", "--name-status", "-z", old_base, new_base, strip=False)
    fields = out.split("\0")
    renames = {}
    i = 0
    while i + 2 < len(fields):
        renames[fields[i + 1]] = fields[i + 2]  # R<score>, old, new
        i += 3
    return renames


def _present(repo: Git, tree: str, names: set[str]) -> set[str]:
    """Which of `names` occur as whole words anywhere in `tree`.

    One `git grep -E -w -o` per tree, the names as one alternation: git's fixed-string
    matcher (-F with a pattern per line) takes minutes on llama.cpp, this one under a second."""
    found: set[str] = set()
    ordered = sorted(names)
    for start in range(0, len(ordered), _GREP_CHUNK):
        pattern = "(" + "|".join(ordered[start:start + _GREP_CHUNK]) + ")\n"
        status, out, err = repo.run_full("grep", "-I", "-E", "-w", "-o", "-h", "--no-color", "-f", "-", tree,
                                         input=pattern.encode(), check=False)
        if status not in (0, 1):  # 1: no match
            raise GitFailed(["grep"], status, err)
        found.update(out.split())
    return found & names


def _diff_names(repo: Git, old: str, new: str) -> tuple[set[str], set[str]]:
    """(names on removed lines, names on added lines) of the whole-tree diff old -> new."""
    removed: set[str] = set()
    added: set[str] = set()
    diff = _parse(repo.run("diff-tree", "-r", "-p", "-U0", "--no-renames", "--no-color", "--no-ext-diff",
                           "--no-textconv", old, new, strip=False))
    for file in diff.values():
        for hunk in file.hunks:
            for line in hunk.lines:
                if line[:1] in ("-", "+"):
                    (removed if line[0] == "-" else added).update(IDENTIFIER.findall(line, 1))
    return removed, added


_VANISHED: dict[tuple[str, str], frozenset[str]] = {}  # (old_base, new_base) -> names; tree ids name content


def _vanished(repo: Git, old_base: str, new_base: str) -> frozenset[str]:
    """Names upstream removed somewhere and added nowhere: every name of old_base that new_base
    lacks is one (each line that had it was removed, none that has it was added). One diff per
    pair of upstream trees, shared by every patch of a chain."""
    if (old_base, new_base) not in _VANISHED:
        removed, added = _diff_names(repo, old_base, new_base)
        _VANISHED[(old_base, new_base)] = frozenset(removed - added)
    return _VANISHED[(old_base, new_base)]


def _names_gone(repo: Git, new: dict[str, _FileDiff], pre_lines: dict[str, list[str]],
                old_base: str, new_base: str, new_pre: str) -> list[Finding]:
    """Names the replayed patch uses (its added and context lines, prose files left out) that
    upstream had and the tree the patch lands on lacks: in old_base, not in new_base, not in
    new_pre.

    "Not in new_pre" is what keeps names the chain itself defines quiet: an earlier patch's
    helper is in new_pre. A name this patch defines is not in old_base, unless upstream had
    it too and dropped it, which is worth a look anyway. The first patch of the chain that
    uses a vanished name is the one reported: later ones find it in new_pre, where that
    first patch put it. Cheapest first: upstream's removed-and-never-added names (which hold
    every name that vanished), the files the patch touches in new_pre, the earlier patches'
    added lines, then one grep of new_base for the few names left.
    """
    used: dict[str, str] = {}  # name -> first path that uses it
    for path, diff in sorted(new.items()):
        if path.lower().endswith(_PROSE):
            continue
        for hunk in diff.hunks:
            for line in hunk.lines:
                if line[:1] in ("+", " "):
                    for name in IDENTIFIER.findall(line, 1):
                        used.setdefault(name, path)
    names = set(used) & _vanished(repo, old_base, new_base)
    for lines in pre_lines.values():
        if names:
            names -= set(IDENTIFIER.findall("\n".join(lines)))
    if names:  # new_pre is new_base plus the earlier patches: what they add is in new_pre
        names -= _diff_names(repo, new_base, new_pre)[1]
    if names:
        names -= _present(repo, new_base, names)
    return [Finding("name-gone", used[name], f"{used[name]}: '{name}' is gone upstream (the old upstream has it, "
                                              f"the new one and the chain before this patch do not)")
            for name in sorted(names, key=lambda n: (used[n], n))]


def _interdiff(old: dict[str, _FileDiff], new: dict[str, _FileDiff]) -> list[Finding]:
    """One finding per file whose own change (see _FileDiff.own_change) differs between the
    old and the replayed patch, with the diff of the two."""
    findings = []
    for path in sorted(set(old) | set(new)):
        was = old[path].own_change() if path in old else []
        now = new[path].own_change() if path in new else []
        if was == now:
            continue
        if path not in new:
            summary = f"{path}: the replayed patch no longer changes it"
        elif path not in old:
            summary = f"{path}: the replayed patch now changes it too"
        else:
            summary = f"{path}: the replayed patch's own change differs from the old one"
        lines = list(difflib.unified_diff(was, now, "old", "new", n=1, lineterm=""))[2:]
        shown = lines[:INTERDIFF_LINES]
        if len(lines) > len(shown):
            shown.append(f"... {len(lines) - len(shown)} more lines")
        findings.append(Finding("interdiff", path, "\n".join([summary, *shown])))
    return findings


# -- the review ---------------------------------------------------------------------------------
def review_patch(repo: Git, *, old_base: str, new_base: str, old_pre: str, old_post: str,
                 new_pre: str, new_post: str) -> list[Finding]:
    """All trees are tree ids readable in `repo`. The patch's old version is old_pre->old_post
    (on the old upstream old_base plus the earlier patches); its replayed version is
    new_pre->new_post on the new upstream new_base. Findings come in KINDS order."""
    old = _parse(generate_diff(repo, old_pre, old_post))
    new = _parse(generate_diff(repo, new_pre, new_post))
    pre_lines = _read_lines(repo, new_pre, sorted(p for p, d in new.items() if d.kind != "added"))
    placements = _placements(repo, old, new, old_pre, new_pre)
    old_pre_lines = _read_lines(repo, old_pre, sorted(placements))
    return [*_far_hunks(placements),
            *_ambiguous(new, pre_lines, old_pre_lines, placements),
            *_upstream_changes(repo, old, new, old_base, new_base, new_pre),
            *_names_gone(repo, new, pre_lines, old_base, new_base, new_pre),
            *_interdiff(old, new)]
