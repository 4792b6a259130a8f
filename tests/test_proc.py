"""polyforge/proc.py: the subprocess runner's guarantees that other modules rely on."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from polyforge import proc
from polyforge.errors import TimedOut

REPO = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie is dead, only not yet reaped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_background_child_dies_with_a_killed_parent(tmp_path: Path):
    """A gate program killed at its timeout (SIGKILL: no cleanup runs) must not leave its server running."""
    pid_file = tmp_path / "server.pid"
    program = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from polyforge import proc
        server = proc.Background([sys.executable, "-c", "import time; time.sleep(300)"],
                                 log_path=Path({str(tmp_path / 'server.log')!r})).__enter__()
        Path({str(pid_file)!r}).write_text(str(server.pid))
        time.sleep(300)
    """)
    with pytest.raises(TimedOut):
        proc.run([sys.executable, "-c", program], timeout=3)
    server_pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(server_pid)
    if alive:
        os.kill(server_pid, 9)
    assert not alive, "the server outlived the program that started it"


def test_background_stop_ends_the_child(tmp_path: Path):
    with proc.Background([sys.executable, "-c", "import time; time.sleep(300)"], log_path=tmp_path / "log") as child:
        pid = child.pid
        assert _alive(pid) and child.exit_status() is None
    assert not _alive(pid)
