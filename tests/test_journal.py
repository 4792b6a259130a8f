"""The write-ahead step journal: each step recorded before its action, the last one redone after
a kill, a step done never run again, and the kill hook at each boundary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from polyforge.errors import BadInput
from polyforge.journal import KILL_ENV, StepJournal

ROOT = Path(__file__).resolve().parent.parent


def test_steps_run_once_and_the_last_is_redone(tmp_path):
    path = tmp_path / "journal.json"
    ran: list[str] = []
    journal = StepJournal(path, "demo")
    journal.begin({"target": "b2"})
    journal.step("a", lambda: ran.append("a"))
    journal.record("b")  # recorded, then the run dies before b's action
    again = StepJournal(path, "demo")
    assert again.state == {"target": "b2"} and [s["step"] for s in again.steps] == ["a", "b"]
    again.step("a", lambda: ran.append("a again"))  # done and followed by b: not run
    again.step("b", lambda: ran.append("b"))  # the last: redone
    again.step("c", lambda: ran.append("c"))
    assert ran == ["a", "b", "c"] and again.last() == "c"


def test_a_journal_of_another_kind_or_unreadable_is_refused(tmp_path):
    path = tmp_path / "journal.json"
    StepJournal(path, "fold").begin({})
    with pytest.raises(BadInput, match="not a rebase journal"):
        StepJournal(path, "rebase").read()
    path.write_text("{ half")
    with pytest.raises(BadInput, match="unreadable"):
        StepJournal(path, "fold").read()


@pytest.mark.parametrize("kill_at, recorded", [(1, None), (2, ["a"]), (3, ["a"]), (4, ["a", "b"])])
def test_the_kill_hook_stops_at_the_nth_boundary(tmp_path, kill_at, recorded):
    """Two boundaries a record: before it is written and after."""
    path = tmp_path / "journal.json"
    code = ("import sys; from pathlib import Path; from polyforge.journal import StepJournal\n"
            f"j = StepJournal(Path({str(path)!r}), 'demo'); j.begin({{}})\n"
            "j.record('a'); j.record('b'); j.record('c')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, KILL_ENV: str(kill_at)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, done.stderr
    steps = json.loads(path.read_text())["steps"]
    assert [s["step"] for s in steps] == (recorded or [])
