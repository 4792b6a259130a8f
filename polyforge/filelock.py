"""An exclusive, non-blocking file lock (fcntl) that names its holder when busy."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from .errors import EnvironmentProblem


class FileLock:
    def __init__(self, path: Path, what: str, *, blocking: bool = False):
        self.path = path
        self.what = what
        self.blocking = blocking
        self._fd: int | None = None

    def __enter__(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if self.blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise EnvironmentProblem(
                    f"another polyforge run holds the {self.what} lock (pid {holder}, {self.path})",
                    hint="wait for it to finish",
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        assert self._fd is not None
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
