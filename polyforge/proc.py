"""The one subprocess runner for non-git tools (cmake, ninja, llama.cpp binaries)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .errors import EnvironmentProblem, TimedOut


@dataclass(frozen=True)
class Completed:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def which(tool: str) -> str | None:
    return shutil.which(tool)


def require_tool(tool: str, hint: str) -> str:
    path = which(tool)
    if path is None:
        raise EnvironmentProblem(f"{tool} not found on PATH", hint=hint)
    return path


def run(
    args: Sequence[str | os.PathLike],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float | None = None,
) -> Completed:
    """Run a command to completion and capture its text output; never raises on exit status.

    Raises TimedOut past `timeout` (the child is killed), EnvironmentProblem when the program
    is not found.
    """
    argv = [os.fspath(a) for a in args]
    full_env = None if env is None else {**os.environ, **env}
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=full_env, input=input, text=True,
            capture_output=True, timeout=timeout, check=False,
        )
    except FileNotFoundError as exc:
        raise EnvironmentProblem(f"cannot run {argv[0]}: not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise TimedOut(f"{argv[0]} did not finish within {timeout:.0f} s") from exc
    return Completed(argv, done.returncode, done.stdout, done.stderr)


# -- streaming and background processes (cmake/ninja builds, llama-server) -------------------
def stream(
    args: Sequence[str | os.PathLike],
    *,
    log_path: Path,
    on_line: "Callable[[str], None] | None" = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    append: bool = False,
    tty: bool = False,
) -> int:
    """Run a command, merging stdout and stderr line by line into log_path and on_line.

    Returns the exit status; never raises on it. The child runs in its own process group,
    which is killed if we are interrupted, so no compiler is left behind. With tty=True the
    child writes to a pseudo-terminal (TERM=dumb), so tools that block-buffer a pipe
    (ninja) report each line as it happens, without terminal escapes.
    """
    import signal

    argv = [os.fspath(a) for a in args]
    full_env = None if env is None else {**os.environ, **env}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a" if append else "w", encoding="utf-8", errors="replace") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        reader_fd = None
        try:
            if tty:
                import pty
                reader_fd, writer_fd = pty.openpty()
                full_env = {**(full_env or os.environ), "TERM": "dumb"}
                try:
                    child = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=writer_fd, stderr=writer_fd,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
                finally:
                    os.close(writer_fd)
                stream_in = open(reader_fd, "rb", buffering=0, closefd=True)
            else:
                child = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, start_new_session=True)
                assert child.stdout is not None
                stream_in = child.stdout
        except FileNotFoundError as exc:
            if reader_fd is not None:
                os.close(reader_fd)
            raise EnvironmentProblem(f"cannot run {argv[0]}: not found") from exc
        try:
            with stream_in:
                pending = b""
                while True:
                    try:
                        chunk = os.read(stream_in.fileno(), 65536)
                    except OSError:  # EIO: the pty's last writer is gone
                        chunk = b""
                    if not chunk:
                        break
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for raw in lines:
                        line = raw.decode("utf-8", "replace").rstrip("\r")
                        log.write(line + "\n")
                        if on_line is not None:
                            on_line(line)
                if pending:
                    line = pending.decode("utf-8", "replace").rstrip("\r")
                    log.write(line + "\n")
                    if on_line is not None:
                        on_line(line)
            return child.wait()
        except BaseException:
            _kill_group(child, signal.SIGTERM)
            raise
        finally:
            if child.poll() is None:
                _kill_group(child, signal.SIGKILL)


def _kill_group(child: "subprocess.Popen", sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        return
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        import signal
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        child.wait()


def _die_with_parent(parent: int) -> "Callable[[], None] | None":
    """A preexec_fn (Linux) that has the kernel kill the child when the process that started it dies, also by
    SIGKILL, which runs no cleanup: a gate program killed at its timeout must not leave its server running."""
    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG; survives exec
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
    return arm


class Background:
    """A long-running child (a server) in its own process group, output to a log file.

    Use as a context manager: the whole group is stopped on exit, also on errors. On Linux the
    child is also killed when the process that started it dies, however it dies.
    """

    def __init__(self, args: Sequence[str | os.PathLike], *, log_path: Path, cwd: Path | None = None,
                 env: Mapping[str, str] | None = None):
        self.argv = [os.fspath(a) for a in args]
        self.log_path = log_path
        self.cwd = cwd
        self.env = None if env is None else {**os.environ, **env}
        self.child: subprocess.Popen | None = None

    def __enter__(self) -> "Background":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "w", encoding="utf-8", errors="replace")
        try:
            self.child = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
        except FileNotFoundError as exc:
            raise EnvironmentProblem(f"cannot run {self.argv[0]}: not found") from exc
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.child is not None
        return self.child.pid

    def exit_status(self) -> int | None:
        """None while it runs."""
        return None if self.child is None else self.child.poll()

    def wait(self, timeout: float) -> int | None:
        """Its exit status if it exits within timeout (a server expected to refuse its input),
        else None."""
        assert self.child is not None
        try:
            return self.child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 10.0) -> None:
        import signal
        if self.child is None:
            return
        if self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signal.SIGTERM)
                self.child.wait(timeout=grace)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                _kill_group(self.child, signal.SIGKILL)
        else:  # the leader exited; make sure nothing it started lingers
            try:
                os.killpg(self.child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def __exit__(self, *exc) -> None:
        self.stop()
