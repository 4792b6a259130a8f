"""scripts/device_job.sh: a background job started, polled to its end and packed; a poll on a machine without the
job (not the one that started it) fails at once; bad names refused."""

from __future__ import annotations

import subprocess
import tarfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_job.sh"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "DEVICE_JOB_ROOT": str(tmp_path / "jobs"), "OUT": str(out)}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_job_runs_in_background_and_is_packed(tmp_path: Path) -> None:
    # a command with a quoted argument, writing the job's summary
    started = _run(tmp_path, "start", "j1", "bash", "-c", 'echo "a b" > "$0"/summary.txt; exit 4',
                   str(tmp_path / "jobs" / "j1"))
    assert started.returncode == 0, started.stderr
    polled = _run(tmp_path, "poll", "j1", "30")
    assert polled.returncode == 0, polled.stdout + polled.stderr
    assert "a b" in polled.stdout and "DONE j1" in polled.stdout
    with tarfile.open(tmp_path / "out" / "j1.tar.xz") as tar:
        assert {"j1/summary.txt", "j1/run.log", "j1/done"} <= set(tar.getnames())


def test_poll_of_a_running_job_returns_at_its_limit(tmp_path: Path) -> None:
    assert _run(tmp_path, "start", "slow", "sleep", "5").returncode == 0
    t0 = time.monotonic()
    polled = _run(tmp_path, "poll", "slow", "0")
    assert polled.returncode == 1 and "RUNNING slow" in polled.stdout
    assert time.monotonic() - t0 < 15
    again = _run(tmp_path, "start", "slow", "true")
    assert again.returncode == 2 and "already running" in again.stderr


def test_poll_without_the_job_fails_at_once(tmp_path: Path) -> None:
    polled = _run(tmp_path, "poll", "gone", "600")
    assert polled.returncode == 3
    assert "no job gone" in polled.stderr
    assert not (tmp_path / "out" / "gone.tar.xz").exists()


def test_bad_arguments_refused(tmp_path: Path) -> None:
    assert _run(tmp_path, "start", "a/b", "true").returncode == 2
    assert _run(tmp_path, "poll", "j", "soon").returncode == 2
    assert _run(tmp_path, "stop", "j").returncode == 2
