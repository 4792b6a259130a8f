"""Helpers the gate kinds share: parameter checks and running a binary with a log."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .. import proc
from ..errors import BadInput, EnvironmentProblem, VerificationFailed

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# how much of a failed command's output a verdict carries: enough for a traceback's end
TAIL_LINES = 15
TAIL_WIDTH = 300


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def output_tail(text: str) -> list[str]:
    """The last non-blank lines of a command's output, each cut to TAIL_WIDTH characters."""
    lines = [line.rstrip() for line in strip_ansi(text).splitlines() if line.strip()][-TAIL_LINES:]
    return [line if len(line) <= TAIL_WIDTH else line[:TAIL_WIDTH - 3] + "..." for line in lines]


def need(params: dict, key: str, kind: type | tuple, where: str, default=None, required: bool = False):
    if key not in params:
        if required:
            raise BadInput(f"{where}: params.{key} is required")
        return default
    value = params[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, float, (int, float)):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadInput(f"{where}: params.{key} must be a {name}")
    return value


def need_model(params: dict, where: str, models: tuple[str, ...]) -> str:
    """params.model, which the gate must also list under 'models' (so it is fetched)."""
    model = need(params, "model", str, where, required=True)
    if model not in models:
        raise BadInput(f"{where}: params.model {model} must be listed under 'models'")
    return model


def only(params: dict, allowed: set[str], where: str) -> None:
    extra = set(params) - allowed
    if extra:
        raise BadInput(f"{where}: unknown params {', '.join(sorted(extra))} (allowed: {', '.join(sorted(allowed))})")


def str_list(params: dict, key: str, where: str) -> list[str]:
    value = params.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        raise BadInput(f"{where}: params.{key} must be a list of strings")
    return [str(v) for v in value]


def run_logged(argv: list, log_path: Path, timeout: float, cwd: Path | None = None,
               env: dict | None = None) -> proc.Completed:
    """Run a binary to completion, keep its output in log_path; a timeout is a failure."""
    try:
        done = proc.run(argv, cwd=cwd, env=env, timeout=timeout)
    except EnvironmentProblem as exc:  # not found, or timed out
        log_path.write_text(f"$ {' '.join(map(str, argv))}\n{exc}\n")
        if isinstance(exc.__cause__, subprocess.TimeoutExpired):  # a gate that hangs fails; a missing tool is the machine's
            raise VerificationFailed(f"{Path(str(argv[0])).name} {exc} (log: {log_path})") from None
        raise
    log_path.write_text(f"$ {' '.join(done.args)}\n[exit {done.returncode}]\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    return done
