"""A write-ahead journal for a command that moves several things in turn (rebase; any later
command that rewrites the chain in steps can use it the same way).

The journal is one JSON file, replaced whole at every record (a temporary file and a rename),
so a kill leaves either the list of steps before a record or the list after it:

    {"version": 1, "op": "rebase", "state": {...}, "steps": [{"step": "swap", ...}, ...]}

`state` is what the operation fixed when it began. Each step is recorded *before* its action
runs, with what is needed to redo or undo it, and each action is idempotent. So after a kill,
the last step recorded is the only one that may be half done: going forward redoes it, going
back undoes every step recorded. The caller owns the meaning of its steps; this module only
keeps them in order and makes each record whole.

For the tests that prove a caller right: POLYFORGE_KILL_AT_STEP=N makes the process SIGKILL
itself at the N-th step boundary it crosses. There are two boundaries per record: just before
it is written (the previous step's action is done) and just after (this step is recorded, its
action not begun).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any, Callable

from .errors import BadInput
from .textfile import write_text_atomic

KILL_ENV = "POLYFORGE_KILL_AT_STEP"
VERSION = 1
_crossed = 0  # boundaries crossed by this process


def boundary() -> None:
    """A step boundary: the one place the kill hook is read."""
    global _crossed
    _crossed += 1
    wanted = os.environ.get(KILL_ENV, "")
    if wanted.isdigit() and int(wanted) == _crossed:
        os.kill(os.getpid(), signal.SIGKILL)


class StepJournal:
    def __init__(self, path: Path, op: str):
        self.path = path
        self.op = op
        self._data: dict | None = None

    def exists(self) -> bool:
        return self.path.exists()

    def begin(self, state: dict) -> None:
        """Start the journal: nothing recorded yet but what the operation fixed at its start."""
        self._data = {"version": VERSION, "op": self.op, "state": state, "steps": []}
        self._write()

    def read(self) -> dict:
        """The whole journal (cached after the first read or write)."""
        if self._data is None:
            try:
                raw = json.loads(self.path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise
            except (OSError, ValueError) as exc:
                raise BadInput(f"{self.path} is unreadable ({exc})",
                               hint="nothing can be redone from it; restore it, or put the project back by hand") from None
            if not (isinstance(raw, dict) and raw.get("version") == VERSION and raw.get("op") == self.op
                    and isinstance(raw.get("state"), dict) and isinstance(raw.get("steps"), list)):
                raise BadInput(f"{self.path} is not a {self.op} journal this polyforge writes",
                               hint="finish or abort it with the polyforge that started it")
            self._data = raw
        return self._data

    @property
    def state(self) -> dict:
        return self.read()["state"]

    @property
    def steps(self) -> list[dict]:
        return self.read()["steps"]

    def last(self) -> str | None:
        """The name of the last step recorded: the one that may be half done."""
        steps = self.steps
        return steps[-1]["step"] if steps else None

    def has(self, step: str) -> bool:
        return any(s["step"] == step for s in self.steps)

    def record(self, step: str, **data: Any) -> dict:
        """Record a step before its action runs."""
        boundary()
        entry = {"step": step, **data}
        self.read()["steps"].append(entry)
        self._write()
        boundary()
        return entry

    def step(self, name: str, action: Callable[[], object]) -> None:
        """A step that happens once: recorded unless it is already, and its action run when it is
        the last step (just recorded, or recorded by a run killed before the action finished).
        A step recorded earlier and followed by others is done: nothing runs."""
        if not self.has(name):
            self.record(name)
        if self.last() == name:
            action()

    def _write(self) -> None:
        assert self._data is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # key order kept as given: a caller may render from what it reads back
        write_text_atomic(self.path, json.dumps(self._data, indent=1) + "\n")
