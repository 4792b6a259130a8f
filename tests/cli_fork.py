"""`python -m polyforge ARGS` in a new process, without paying Python's start-up and polyforge's
imports for each one: the process is forked from a server that imported them once
(multiprocessing's forkserver, preloaded with polyforge's modules). Where a test runs thousands of
commands (the hostile corpus), that start-up was most of their time.

The child is a process of its own, as a subprocess would be: its own session (killable as a
group), working folder, environment, stdin (/dev/null), stdout and stderr (files), and it runs
polyforge's __main__ the way `-m` does (runpy), so exit codes, usage lines and tracebacks are the
CLI's own. What it does not redo is what happens at import time, in the server's environment:
gitpython looks for git there, so a command whose environment would find another git (or none)
starts a new interpreter instead."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pkgutil
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import polyforge

# What the server imports before it forks: every polyforge module (the commands' lazy imports
# too; not __main__, which runs the CLI) and what typer imports when it parses the first option.
# By name, from the installed packages: the server does not take the tests' sys.path along.
PRELOAD = ["typer._adapters"] + [m.name for m in pkgutil.walk_packages(polyforge.__path__, "polyforge.")
                                 if m.name != "polyforge.__main__"]

# What the server's imports found depends on: where gitpython looks for git. A command whose
# environment differs there runs in a new interpreter.
_IMPORT_ENV = {name: os.environ.get(name) for name in ("PATH", "GIT_PYTHON_GIT_EXECUTABLE")}

_context: multiprocessing.context.BaseContext | None = None
_context_lock = threading.Lock()
_processes_lock = threading.Lock()


def _forkserver() -> multiprocessing.context.BaseContext:
    global _context
    with _context_lock:
        if _context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(PRELOAD)
            # rich's console decides on colours when polyforge is imported: started on a terminal
            # (pytest -s), the server would have its children write escape codes into their files
            saved = [os.dup(1), os.dup(2)]
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, 1)
                os.dup2(null, 2)
                multiprocessing.forkserver.ensure_running()
            finally:
                for fd, copy in ((1, saved[0]), (2, saved[1])):
                    os.dup2(copy, fd)
                    os.close(copy)
                os.close(null)
            _context = context
    return _context


def _child(argv: tuple[str, ...], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["-m", *argv]  # runpy puts the module's path first, as `python -m` does
    runpy.run_module("polyforge", run_name="__main__", alter_sys=True)


def run(argv: tuple[str, ...], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    """`python -m polyforge ARGV` in cwd with exactly env: (exit code, stdout, stderr); code None:
    still running after timeout s, its process group killed. Forked from the server where env
    agrees with the server's imports (_IMPORT_ENV), a new interpreter else."""
    if any(env.get(name) != value for name, value in _IMPORT_ENV.items()):
        return _run_interpreter(argv, cwd, env, timeout)
    with tempfile.TemporaryDirectory(prefix="cli-fork-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        process = _forkserver().Process(target=_child, args=(tuple(argv), str(cwd), dict(env), out, err))
        # multiprocessing's Process is not thread-safe: start() polls every other child, and where
        # it and that child's own join() both read the exit code, the second reads EOF (255). So
        # start and join under one lock, and the waiting outside it, on the sentinel.
        with _processes_lock:
            process.start()
        finished = bool(multiprocessing.connection.wait([process.sentinel], timeout))
        if not finished:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                process.kill()
        with _processes_lock:
            process.join()
            code = process.exitcode if finished else None
            process.close()
        texts = [Path(p).read_text(errors="replace") if os.path.exists(p) else "" for p in (out, err)]
    return code, texts[0], texts[1]


def _run_interpreter(argv: tuple[str, ...], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "polyforge", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err
