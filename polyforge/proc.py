"""The one subprocess runner for non-git tools (cmake, ninja, llama.cpp binaries)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .errors import EnvironmentProblem


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
    """Run a command to completion and capture its text output; never raises on exit status."""
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
        raise EnvironmentProblem(f"{argv[0]} did not finish within {timeout:.0f} s") from exc
    return Completed(argv, done.returncode, done.stdout, done.stderr)
