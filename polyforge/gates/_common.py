"""Helpers the gate kinds share: params.model, running a binary with a log, output tails."""

from __future__ import annotations

import re
from pathlib import Path

from .. import proc, schema
from ..errors import BadInput, EnvironmentProblem, TimedOut, VerificationFailed

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


def need_model(params: dict, where: str, models: tuple[str, ...]) -> str:
    """params.model, which the gate must also list under 'models' (so it is fetched)."""
    model = schema.need(params, "model", str, where, section="params")
    if model not in models:
        raise BadInput(f"{where}: params.model {model} must be listed under 'models'")
    return model


def run_logged(argv: list, log_path: Path, timeout: float, cwd: Path | None = None,
               env: dict | None = None) -> proc.Completed:
    """Run a binary to completion, keep its output in log_path; a timeout is a failure."""
    try:
        done = proc.run(argv, cwd=cwd, env=env, timeout=timeout)
    except TimedOut as exc:  # a gate that hangs fails; a missing tool (EnvironmentProblem) is the machine's
        log_path.write_text(f"$ {' '.join(map(str, argv))}\n{exc}\n")
        raise VerificationFailed(f"{Path(str(argv[0])).name} {exc} (log: {log_path})") from None
    except EnvironmentProblem as exc:
        log_path.write_text(f"$ {' '.join(map(str, argv))}\n{exc}\n")
        raise
    log_path.write_text(f"$ {' '.join(done.args)}\n[exit {done.returncode}]\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    return done
