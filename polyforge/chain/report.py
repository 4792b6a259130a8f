"""`polyforge chain report`: where a chain reads as a history instead of a set of concerns.

Computed from the patch texts alone: every line a patch adds is attributed to it, and the
hunks of each later patch are replayed on those attributions, so a removed line names the
patch that added it (or the baseline). From that:

  touches      per file, the patches that change it (each one a possible conflict in a rebase)
  rewrites     pairs (earlier, later) where the later patch removes lines the earlier one added
  vanished     (patch, file) where none of the lines the patch added survive the chain
  folds        the contiguous runs whose folding would leave no rewritten line between patches

A line is "trivial" when it holds no letter or digit (a lone brace, a blank line): such lines
move with any edit and say nothing about overlapping concerns, so they are counted apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from polyforge.chain.patchfile import Patch

if TYPE_CHECKING:
    from polyforge.chain.engine import Chain

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_MEANINGFUL = re.compile(r"[A-Za-z0-9]")
BASELINE = -1  # the attribution of a line the chain did not add


def trivial(line: str) -> bool:
    return not _MEANINGFUL.search(line)


@dataclass
class Rewrite:
    """Lines `later` removes that `earlier` added."""

    earlier: str
    later: str
    lines: int = 0
    trivial_lines: int = 0
    files: dict[str, int] = field(default_factory=dict)  # file -> non-trivial lines

    def as_dict(self) -> dict:
        return {"earlier": self.earlier, "later": self.later, "lines": self.lines,
                "trivial_lines": self.trivial_lines, "files": dict(sorted(self.files.items()))}


@dataclass
class Fold:
    """A contiguous run of the chain whose folding removes the rewrites inside it."""

    first: str
    last: str
    patches: list[str]
    rewrites: int  # pairs it removes
    unrelated: list[str]  # patches of the run that rewrite nothing in it and touch none of its files

    def as_dict(self) -> dict:
        return {"first": self.first, "last": self.last, "patches": self.patches,
                "rewrites": self.rewrites, "unrelated": self.unrelated}


@dataclass
class ChainReport:
    patches: list[str]
    touches: dict[str, list[str]]  # file -> patches, in chain order
    rewrites: list[Rewrite]
    vanished: list[tuple[str, str]]  # (patch, file)
    folds: list[Fold]
    changed_lines: int  # added plus removed, over the whole chain

    @property
    def rewritten_lines(self) -> int:
        return sum(r.lines for r in self.rewrites)

    def most_touched(self, limit: int | None = None) -> list[tuple[str, list[str]]]:
        rows = sorted(self.touches.items(), key=lambda item: (-len(item[1]), item[0]))
        return rows if limit is None else rows[:limit]

    def as_dict(self) -> dict:
        return {
            "patches": self.patches,
            "changed_lines": self.changed_lines,
            "rewrites": [r.as_dict() for r in self.rewrites],
            "rewritten_lines": self.rewritten_lines,
            "touches": {path: names for path, names in self.most_touched()},
            "vanished": [{"patch": p, "file": f} for p, f in self.vanished],
            "folds": [f.as_dict() for f in self.folds],
        }


def _sections(diff: str):
    """(path, hunks) per file of a canonical diff; a hunk is (old_start, [lines of the hunk])."""
    path = None
    hunks: list[tuple[int, list[str]]] = []
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            if path is not None:
                yield path, hunks
            path, hunks = None, []
        elif line.startswith(("--- a/", "+++ b/")) and not hunks:
            path = line[6:]  # a deleted file names itself on '---' only, an added one on '+++' only
        elif line.startswith("@@ "):
            match = _HUNK.match(line)
            assert match, line  # the patch was validated by patchfile.parse
            hunks.append((int(match.group(1)), []))
        elif hunks and line[:1] in (" ", "-", "+"):
            hunks[-1][1].append(line)
    if path is not None:
        yield path, hunks


def of_chain(chain: "Chain") -> ChainReport:
    """The report of a project's chain, once it is known to apply exactly from the baseline (the
    attribution of lines assumes every hunk lands where it says)."""
    patches = chain.patches()
    if patches:
        chain.steps_from_baseline(patches, "cannot report")
    return build(patches)


def build(patches: list[Patch]) -> ChainReport:
    """The report of `patches`, applied in the given order."""
    names = [p.name for p in patches]
    origins: dict[str, list[int]] = {}  # file -> attribution per line, baseline lines beyond the end implied
    touches: dict[str, list[str]] = {}
    rewrites: dict[tuple[int, int], Rewrite] = {}
    added_where: dict[tuple[int, str], int] = {}
    changed = 0
    for index, patch in enumerate(patches):
        for path, hunks in _sections(patch.diff):
            touches.setdefault(path, []).append(patch.name)
            lines = origins.setdefault(path, [])
            shift = 0  # new-minus-old lines so far in this file: later hunks' old numbers move by it
            for old_start, body in hunks:
                old_count = sum(1 for ln in body if ln[:1] in (" ", "-"))
                # an empty old side names the line after which the hunk inserts
                at = old_start - 1 + shift if old_count else old_start + shift
                for line in body:
                    tag, text = line[:1], line[1:]
                    if at > len(lines):
                        lines.extend([BASELINE] * (at - len(lines)))
                    if tag == " ":
                        at += 1
                    elif tag == "-":
                        changed += 1
                        origin = lines.pop(at) if at < len(lines) else BASELINE
                        shift -= 1
                        if origin != BASELINE and origin != index:
                            pair = rewrites.setdefault((origin, index), Rewrite(names[origin], patch.name))
                            if trivial(text):
                                pair.trivial_lines += 1
                            else:
                                pair.lines += 1
                                pair.files[path] = pair.files.get(path, 0) + 1
                    else:
                        changed += 1
                        lines.insert(at, index)
                        added_where[(index, path)] = added_where.get((index, path), 0) + 1
                        at += 1
                        shift += 1
    surviving = {(origin, path) for path, lines in origins.items() for origin in set(lines) if origin != BASELINE}
    vanished = [(names[i], path) for (i, path) in added_where if (i, path) not in surviving]
    real = [r for _, r in sorted(rewrites.items()) if r.lines]
    trivial_only = [r for _, r in sorted(rewrites.items()) if not r.lines]
    return ChainReport(patches=names, touches=touches, rewrites=real + trivial_only,
                       vanished=sorted(vanished, key=lambda pf: (names.index(pf[0]), pf[1])),
                       folds=_folds(patches, [k for k, r in sorted(rewrites.items()) if r.lines], touches),
                       changed_lines=changed)


def _folds(patches: list[Patch], pairs: list[tuple[int, int]], touches: dict[str, list[str]]) -> list[Fold]:
    """The smallest contiguous runs covering every rewriting pair (overlapping runs merged), each
    with the patches inside it that are unrelated to the rest (candidates to move out first)."""
    runs: list[list[int]] = []
    for first, last in sorted(pairs):
        if runs and first <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], last)
        else:
            runs.append([first, last])
    folds = []
    for first, last in runs:
        members = set(range(first, last + 1))
        involved = {i for pair in pairs if set(pair) <= members for i in pair}
        files_of = {i: {path for path, names in touches.items() if patches[i].name in names} for i in members}
        involved_files = set().union(*(files_of[i] for i in involved))
        unrelated = [patches[i].name for i in sorted(members - involved) if not files_of[i] & involved_files]
        folds.append(Fold(patches[first].name, patches[last].name, [patches[i].name for i in sorted(members)],
                          sum(1 for pair in pairs if set(pair) <= members), unrelated))
    return folds
