"""The cmake/ninja wrapper and the streaming/background runners in polyforge.proc."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from buildkit import write_script
from polyforge import proc
from polyforge.build import cmake
from polyforge.errors import EnvironmentProblem

GCC_LOG = """\
[12/230] Building CXX object src/CMakeFiles/llama.dir/llama-model.cpp.o
FAILED: src/CMakeFiles/llama.dir/llama-model.cpp.o
/usr/bin/c++ -O3 -c /work/vendor/llama.cpp/src/llama-model.cpp
In file included from /work/vendor/llama.cpp/src/llama-model.cpp:3:
/work/vendor/llama.cpp/src/llama-model.h: In function 'int f()':
/work/vendor/llama.cpp/src/llama-model.h:41:12: error: 'foo' was not declared in this scope
/work/vendor/llama.cpp/src/llama-model.h:55:1: error: second error
ninja: build stopped: subcommand failed.
"""
NVCC_LOG = """\
[3/9] Building CUDA object ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/fattn.cu.o
/work/vendor/llama.cpp/ggml/src/ggml-cuda/fattn.cu(123): error: identifier "turbo_t" is undefined
1 error detected in the compilation of "fattn.cu".
"""
CMAKE_LOG = """\
-- The C compiler identification is GNU 12.2.0
CMake Error at ggml/cmake/common.cmake:88 (message):
  GGML_CUDA_FA_QUANTS: unknown type "turbo3" in "turbo3-turbo3"
"""
BUFFERED = {"PYTHONUNBUFFERED": ""}  # stdio buffering as a C tool has it
LINK_LOG = "/usr/bin/ld: tools/cli.c.o: in function `main':\ncli.c:(.text+0x5): undefined reference to `llama_answer'\n"


def test_first_error_gcc_points_at_the_first_error():
    found = cmake.first_error(GCC_LOG)
    assert found.file.endswith("src/llama-model.h") and found.line == 41
    assert "'foo' was not declared" in found.message
    assert str(found).startswith("/work/vendor/llama.cpp/src/llama-model.h:41: ")


def test_first_error_nvcc_cmake_linker():
    nv = cmake.first_error(NVCC_LOG)
    assert nv.file.endswith("fattn.cu") and nv.line == 123 and "turbo_t" in nv.message
    cm = cmake.first_error(CMAKE_LOG)
    assert cm.file == "ggml/cmake/common.cmake" and cm.line == 88
    ld = cmake.first_error(LINK_LOG)
    assert "undefined reference to `llama_answer'" in ld.message
    assert cmake.first_error("all fine\n[1/1] Linking C executable bin/x\n") is None
    assert cmake.first_error("FAILED: something odd\n").message == "FAILED: something odd"


def test_progress_parses_ninja_status():
    seen = []
    progress = cmake.Progress(lambda d, t, w: seen.append((d, t, w)))
    for line in ("[1/3] Building C object a.o", "warning: x", "[3/3] Linking C shared library bin/libggml.so"):
        progress(line)
    assert seen == [(1, 3, "Building C object a.o"), (3, 3, "Linking C shared library bin/libggml.so")]
    assert (progress.done, progress.total) == (3, 3)


def test_tools_come_from_the_python_packages(monkeypatch):
    monkeypatch.delenv("POLYFORGE_CMAKE", raising=False)
    monkeypatch.delenv("POLYFORGE_NINJA", raising=False)
    cmake_path, ninja_path = cmake.find_cmake(), cmake.find_ninja()
    prefix = Path(sys.prefix).resolve()
    for path in (cmake_path, ninja_path):
        assert prefix in path.resolve().parents, path
        assert not str(path).startswith("/usr/bin")
    assert cmake.tool_version(cmake_path).startswith("cmake version")
    assert cmake.tool_version("/nonexistent/tool") is None


def _child_waiting_for(flag: Path, path: Path, *, flush_first_line: bool, polls: int) -> Path:
    """A child that prints "[1/2] first", then waits (polls x 50 ms) for `flag` to exist: then it
    prints "[2/2] second" and exits 0; if it never appears, exits 7."""
    return write_script(path, f"""\
        import os, sys, time
        print("[1/2] first"{", flush=True" if flush_first_line else ""})
        for _ in range({polls}):
            if os.path.exists({str(flag)!r}):
                print("[2/2] second")
                sys.exit(0)
            time.sleep(0.05)
        sys.exit(7)
        """)


def test_stream_delivers_lines_while_the_child_runs(tmp_path):
    """The child waits for a file that only the line callback creates: it can finish only
    if each line arrives before the child exits (a pipe that ninja block-buffers would not)."""
    flag = tmp_path / "seen"
    script = _child_waiting_for(flag, tmp_path / "child.py", flush_first_line=True, polls=100)
    lines = []

    def on_line(line):
        lines.append(line)
        flag.touch()

    log = tmp_path / "log.txt"
    assert proc.stream([script], log_path=log, on_line=on_line) == 0
    assert lines == ["[1/2] first", "[2/2] second"]
    assert log.read_text().splitlines()[1:] == lines


def test_stream_tty_unbuffers_a_buffering_child(tmp_path):
    """stdio block-buffers a pipe; on the pty (tty=True) the first line comes at once."""
    flag = tmp_path / "seen"
    # no flush: the first line is buffered on a pipe, line-buffered on a tty
    script = _child_waiting_for(flag, tmp_path / "child.py", flush_first_line=False, polls=60)
    assert proc.stream([script], log_path=tmp_path / "a.log", on_line=lambda l: flag.touch(), tty=True, env=BUFFERED) == 0
    flag.unlink()
    assert proc.stream([script], log_path=tmp_path / "b.log", on_line=lambda l: flag.touch(), tty=False, env=BUFFERED) == 7


def test_stream_returns_status_and_missing_tool(tmp_path):
    script = write_script(tmp_path / "fail.py", "import sys\nprint('boom', file=sys.stderr)\nsys.exit(5)\n")
    log = tmp_path / "x.log"
    assert proc.stream([script], log_path=log) == 5
    assert "boom" in log.read_text()
    with pytest.raises(EnvironmentProblem, match="not found"):
        proc.stream([tmp_path / "missing"], log_path=log)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill 0; read its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_background_stops_the_whole_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = write_script(tmp_path / "server.py", f"""\
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
        """)
    with proc.Background([script], log_path=tmp_path / "bg.log") as bg:
        for _ in range(100):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.05)
        leader, grandchild = bg.pid, int(pid_file.read_text())
        assert bg.exit_status() is None and _alive(grandchild)
    assert not _alive(leader)
    for _ in range(40):
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    assert not _alive(grandchild)
