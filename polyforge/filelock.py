"""A file lock (fcntl flock) that names its holder when busy: exclusive for commands that write,
shared for commands that only read.

An exclusive holder records "pid start-time" in the file and clears it on release; a holder
killed with the lock held (kill -9) leaves that record behind, and the next holder reports
it as `dead_holder`, so it knows what a dead run may have left half-done.

Readers and writers: a reader holds the lock shared, so no writer can move the tree under
it; a writer waits for readers (they only read, briefly) rather than failing, and a reader
waits briefly for a writer and then says "busy" rather than answering from a tree in motion.
Readers never write the file, so a writer that finds the lock taken and a live holder named
knows that holder is a writer and fails at once, as before.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path

from .errors import EnvironmentProblem

# How long a writer waits for readers, and a reader for a writer, before giving up. A writer
# waits for readers as long as they read: a reader that died has lost its flock already, and
# a long one (a rebase dry run, upstream check) is still working for its user.
WRITER_WAITS_FOR_READERS_S: float | None = None
READER_WAITS_FOR_WRITER_S = 10.0
_POLL_S = 0.02


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else fields[19]  # a zombie has finished: no start time


def _identity() -> str:
    pid = os.getpid()
    return f"{pid} {_start_time(pid) or ''}".strip()


def _alive(record: str) -> bool:
    """Whether the process a record names still runs (the same process, not a reused pid)."""
    parts = record.split()
    if not parts or not parts[0].isdigit():
        return False
    pid = int(parts[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    if Path("/proc").is_dir():
        started = _start_time(pid)
        if started is None or (len(parts) > 1 and parts[1] != started):
            return False
    return True


def owner_tag() -> str:
    """This process as a file-name part ("pid_start"): a folder named with it can be told to
    be a dead run's leftover (owner_alive)."""
    return _identity().replace(" ", "_")


def owner_alive(tag: str) -> bool:
    return _alive(tag.replace("_", " "))


def open_by_a_process(path: Path) -> bool | None:
    """Whether any process we can see has `path` open (Linux /proc); None where we cannot tell."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    target = os.path.realpath(path)
    for fd_dir in proc.glob("[0-9]*/fd"):
        try:
            entries = list(fd_dir.iterdir())
        except OSError:
            continue  # gone, or another user's
        for entry in entries:
            try:
                if os.readlink(entry) == target:
                    return True
            except OSError:
                continue
    return False


class FileLock:
    def __init__(self, path: Path, what: str, *, blocking: bool = False, shared: bool = False,
                 wait_s: float | None = None):
        """wait_s: how long to wait for the other kind of holder (None: the defaults above)."""
        self.path = path
        self.what = what
        self.blocking = blocking
        self.shared = shared
        self.wait_s = wait_s if wait_s is not None else (
            READER_WAITS_FOR_WRITER_S if shared else WRITER_WAITS_FOR_READERS_S)
        self.dead_holder: int | None = None
        self._fd: int | None = None

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if self.shared and self.path.is_file():
                try:
                    return os.open(self.path, os.O_RDONLY)  # a reader needs no write access
                except OSError:
                    pass
            raise EnvironmentProblem(f"cannot open the {self.what} lock {self.path}: {exc.strerror}",
                                     hint="the folder must be writable by this user") from None

    def __enter__(self) -> "FileLock":
        fd = self._open()
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        deadline = time.monotonic() + (self.wait_s if self.wait_s is not None else float("inf"))
        while True:
            try:
                fcntl.flock(fd, mode if self.blocking else mode | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)  # e.g. a file system without locks
                    raise EnvironmentProblem(f"cannot lock {self.path}: {exc.strerror}") from None
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
                writer = holder and _alive(holder)
                if not self.shared and writer:
                    os.close(fd)
                    raise EnvironmentProblem(
                        f"another polyforge run holds the {self.what} lock (pid {holder.split()[0]}, {self.path})",
                        hint="wait for it to finish") from None
                if time.monotonic() >= deadline:
                    os.close(fd)
                    if self.shared:
                        raise EnvironmentProblem(
                            f"busy: another polyforge run (pid {holder.split()[0] if holder else 'unknown'}) is "
                            f"changing the {self.what} ({self.path})", hint="run this again when it is done") from None
                    raise EnvironmentProblem(
                        f"read-only polyforge runs held the {self.what} lock for {self.wait_s:.0f} s ({self.path})",
                        hint="a status run may be stuck; wait for it or stop it") from None
                time.sleep(_POLL_S)
        record = os.pread(fd, 64, 0).decode(errors="replace").strip()
        if record and not _alive(record):
            self.dead_holder = int(record.split()[0]) if record.split()[0].isdigit() else None
        if not self.shared:
            os.ftruncate(fd, 0)
            os.pwrite(fd, _identity().encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        assert self._fd is not None
        if not self.shared:
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
