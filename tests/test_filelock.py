"""The project lock: writers exclusive, readers shared, a dead holder recognised."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from polyforge.errors import EnvironmentProblem
from polyforge.filelock import FileLock, open_by_a_process

ROOT = Path(__file__).resolve().parent.parent


def _release_later(lock: FileLock, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), lock.__exit__(None, None, None)))
    thread.start()
    return thread


def test_a_second_writer_fails_at_once_naming_the_first(tmp_path):
    path = tmp_path / ".lock"
    with FileLock(path, "vendored tree"):
        started = time.monotonic()
        holds = f"another polyforge run holds the vendored tree lock \\(pid {os.getpid()},"
        with pytest.raises(EnvironmentProblem, match=holds):
            FileLock(path, "vendored tree").__enter__()
        assert time.monotonic() - started < 1, "a writer must not wait for another writer"


def test_readers_share_the_lock(tmp_path):
    path = tmp_path / ".lock"
    with FileLock(path, "vendored tree", shared=True), FileLock(path, "vendored tree", shared=True):
        assert path.read_text() == "", "readers leave no record"


def test_a_reader_waits_briefly_for_a_writer_then_says_busy(tmp_path):
    path = tmp_path / ".lock"
    with FileLock(path, "vendored tree"):
        started = time.monotonic()
        with pytest.raises(EnvironmentProblem, match=f"busy.*pid {os.getpid()}") as caught:
            FileLock(path, "vendored tree", shared=True, wait_s=0.3).__enter__()
        assert time.monotonic() - started >= 0.3
        assert caught.value.exit_code == 3 and "\n" not in caught.value.message


def test_a_reader_gets_in_when_the_writer_leaves(tmp_path):
    path = tmp_path / ".lock"
    writer = FileLock(path, "vendored tree").__enter__()
    started = time.monotonic()
    thread = _release_later(writer, 0.2)
    with FileLock(path, "vendored tree", shared=True, wait_s=10):
        assert time.monotonic() - started >= 0.2, "the reader got in while the writer held the lock"
    thread.join()


def test_a_writer_waits_for_readers_instead_of_failing(tmp_path):
    path = tmp_path / ".lock"
    reader = FileLock(path, "vendored tree", shared=True).__enter__()
    thread = _release_later(reader, 0.3)
    with FileLock(path, "vendored tree") as writer:
        assert path.read_text().split()[0] == str(os.getpid()) and writer.dead_holder is None
    thread.join()


def test_a_writer_waits_for_long_readers_however_long(tmp_path, monkeypatch):
    """Readers that read for minutes (two rebase dry runs) do not make a writer give up: the
    clock jumps an hour while they hold the lock, and the writer still gets in after them."""
    import polyforge.filelock as filelock
    path = tmp_path / ".lock"
    readers = [FileLock(path, "vendored tree", shared=True).__enter__() for _ in range(2)]
    threads = [_release_later(reader, 0.3 + 0.1 * i) for i, reader in enumerate(readers)]
    real = time.monotonic
    started = real()
    monkeypatch.setattr(filelock.time, "monotonic", lambda: real() + (3600 if real() - started > 0.05 else 0))
    with FileLock(path, "vendored tree"):
        assert real() - started >= 0.35
    for thread in threads:
        thread.join()


def test_a_writer_gives_up_on_a_reader_that_never_leaves(tmp_path):
    path = tmp_path / ".lock"
    with FileLock(path, "vendored tree", shared=True):
        with pytest.raises(EnvironmentProblem, match="read"):
            FileLock(path, "vendored tree", wait_s=0.3).__enter__()


def _die_holding(path: Path) -> int:
    """A process that takes the lock and is killed with it held (kill -9 leaves its record)."""
    code = ("import os, signal, sys; from pathlib import Path; from polyforge.filelock import FileLock\n"
            f"lock = FileLock(Path({str(path)!r}), 'vendored tree').__enter__()\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=60)
    assert child.returncode == -signal.SIGKILL
    return int(path.read_text().split()[0])


def test_a_holder_that_died_is_named_by_the_next_one(tmp_path):
    path = tmp_path / ".lock"
    dead = _die_holding(path)
    with FileLock(path, "vendored tree", shared=True) as reader:
        assert reader.dead_holder == dead
    with FileLock(path, "vendored tree") as writer:
        assert writer.dead_holder == dead
    with FileLock(path, "vendored tree") as writer:
        assert writer.dead_holder is None, "a clean release leaves no record"


def test_a_lock_file_that_cannot_be_opened_is_one_line(tmp_path):
    path = tmp_path / ".lock"
    path.mkdir()  # works as root too, unlike chmod
    with pytest.raises(EnvironmentProblem, match="cannot open the vendored tree lock") as caught:
        FileLock(path, "vendored tree").__enter__()
    assert caught.value.exit_code == 3


def test_an_unwritable_lock_file(tmp_path, monkeypatch):
    path = tmp_path / ".lock"
    path.touch()
    path.chmod(0o444)
    if os.geteuid() == 0:  # root writes through any mode: refuse write access as the kernel does for others
        real_open = os.open

        def open_read_only_for_writers(file, flags, *args):
            if Path(file) == path and flags & (os.O_WRONLY | os.O_RDWR):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
            return real_open(file, flags, *args)

        monkeypatch.setattr(os, "open", open_read_only_for_writers)
    with pytest.raises(EnvironmentProblem, match="cannot open the vendored tree lock"):
        FileLock(path, "vendored tree").__enter__()
    with FileLock(path, "vendored tree", shared=True) as reader:  # a reader makes do with read access
        assert reader.dead_holder is None


def test_open_by_a_process(tmp_path):
    path = tmp_path / "index.lock"
    path.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", f"f = open({str(path)!r}); import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while not open_by_a_process(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert open_by_a_process(path) is True
    finally:
        holder.kill()
        holder.wait()
    assert open_by_a_process(path) is False
