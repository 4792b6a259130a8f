"""The cmake and ninja wrapper: the tools come from the PyPI packages `cmake` and `ninja`
(project dependencies), never from /usr/bin, so a fresh machine needs only a compiler.

Configure, build with ninja's [n/m] progress, keep the full log, and find the first
compiler error in it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from polyforge import proc
from polyforge.errors import EnvironmentProblem

_NINJA_STATUS = re.compile(r"^\[(\d+)/(\d+)\]\s*(.*)$")
# gcc/clang "file:line:col: error:", nvcc "file(line): error", linker "undefined reference"
_ERROR_PATTERNS = (
    re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+)(?::(?P<col>\d+))?:\s+(?:fatal\s+)?error:\s*(?P<msg>.*)$"),
    re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+)\):\s+(?:catastrophic\s+)?error:?\s*(?P<msg>.*)$"),
    re.compile(r"^(?P<file>[^\s:][^:]*):(?:\(.*\)|\d+):\s*(?P<msg>undefined reference to .*)$"),
)
_CMAKE_ERROR = re.compile(r"^CMake Error(?: at (?P<file>[^:]+):(?P<line>\d+))?.*$")


def _tool_in_package(module: str, attr: str, exe: str) -> Path | None:
    """The executable shipped by a PyPI package (cmake.CMAKE_BIN_DIR, ninja.BIN_DIR)."""
    try:
        mod = __import__(module)
    except ImportError:
        return None
    folder = getattr(mod, attr, None)
    if folder:
        candidate = Path(folder) / exe
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _find_tool(exe: str, module: str, attr: str) -> Path:
    """`exe` from its PyPI package (or POLYFORGE_<EXE>, for tests and odd setups)."""
    override = os.environ.get(f"POLYFORGE_{exe.upper()}")
    if override:
        return Path(override)
    found = _tool_in_package(module, attr, exe) or _next_to_python(exe)
    if found is None:
        raise EnvironmentProblem(f"{exe} not found in this Python environment",
                                 hint=f"pip install {module} (it is a polyforge dependency)")
    return found


def find_cmake() -> Path:
    return _find_tool("cmake", "cmake", "CMAKE_BIN_DIR")


def find_ninja() -> Path:
    return _find_tool("ninja", "ninja", "BIN_DIR")


def _next_to_python(exe: str) -> Path | None:
    candidate = Path(sys.executable).parent / exe
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


def tool_version(path: Path | str, *, lines: int = 1) -> str | None:
    """First line(s) of `tool --version`, or None if it cannot run."""
    try:
        done = proc.run([path, "--version"], timeout=60)
    except EnvironmentProblem:
        return None
    if done.returncode != 0:
        return None
    text = [ln.strip() for ln in (done.stdout or done.stderr).splitlines() if ln.strip()]
    if not text:
        return None
    return " | ".join(text[-lines:]) if lines > 1 else text[0]


@dataclass(frozen=True)
class CompilerError:
    file: str | None
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file else ""
        return f"{where}{self.message}"


def first_error(log_text: str) -> CompilerError | None:
    """The first compiler (or cmake, or linker) error in a build log."""
    fallback = None
    for raw in log_text.splitlines():
        line = raw.strip()
        for pattern in _ERROR_PATTERNS:
            m = pattern.match(line)
            if m:
                number = m.groupdict().get("line")
                return CompilerError(m.group("file"), int(number) if number and number.isdigit() else None,
                                     m.group("msg").strip())
        m = _CMAKE_ERROR.match(line)
        if m and fallback is None:
            fallback = CompilerError(m.group("file"), int(m.group("line")) if m.group("line") else None, line)
        elif fallback is None and line.startswith("FAILED: "):
            fallback = CompilerError(None, None, line)
    return fallback


class Progress:
    """Parses ninja status lines; `update(done, total, what)` is called for each."""

    def __init__(self, update: Callable[[int, int, str], None] | None = None):
        self.update = update
        self.done = 0
        self.total = 0

    def __call__(self, line: str) -> None:
        m = _NINJA_STATUS.match(line)
        if m:
            self.done, self.total = int(m.group(1)), int(m.group(2))
            if self.update is not None:
                self.update(self.done, self.total, m.group(3))


def configure(source: Path, build_dir: Path, cache_args: Sequence[str], *, log_path: Path,
              env: Mapping[str, str] | None = None, on_line: Callable[[str], None] | None = None) -> int:
    argv = [find_cmake(), "-S", source, "-B", build_dir, "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={find_ninja()}", *cache_args]
    return proc.stream(argv, log_path=log_path, env=env, on_line=on_line, append=True)


def build(build_dir: Path, targets: Sequence[str], *, jobs: int | None, log_path: Path,
          env: Mapping[str, str] | None = None, on_line: Callable[[str], None] | None = None) -> int:
    argv: list[str | os.PathLike] = [find_ninja(), "-C", build_dir]
    if jobs:
        argv += ["-j", str(jobs)]
    argv += list(targets)
    status_env = {"NINJA_STATUS": "[%f/%t] ", **(env or {})}
    return proc.stream(argv, log_path=log_path, env=status_env, on_line=on_line, append=True, tty=True)


def known_targets(build_dir: Path, env: Mapping[str, str] | None = None) -> set[str]:
    """Target names ninja knows in a configured build directory."""
    done = proc.run([find_ninja(), "-C", build_dir, "-t", "targets", "all"], env=env, timeout=120)
    names = set()
    for line in done.stdout.splitlines():
        name = line.split(":", 1)[0].strip()
        if name and "/" not in name and not name.endswith((".o", ".cmake")):
            names.add(name)
    return names
