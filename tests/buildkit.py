"""Shared pieces for the build, gate and pipeline tests: a tiny CMake "llama.cpp" that the
real cmake and ninja from the venv build in seconds, and fake llama binaries as scripts."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from conftest import Proj, make_upstream, write_pin

CMAKE_FILES = {
    "CMakeLists.txt": textwrap.dedent("""\
        cmake_minimum_required(VERSION 3.14)
        project(tiny C)
        set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
        set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
        option(GGML_CUDA "cuda" OFF)
        add_library(ggml SHARED ggml/ggml.c)
        add_library(llama SHARED src/llama.c)
        target_link_libraries(llama PRIVATE ggml)
        set_target_properties(llama PROPERTIES VERSION 0.5.0 SOVERSION 0)
        add_executable(llama-cli tools/cli.c)
        target_link_libraries(llama-cli PRIVATE llama)
        add_executable(test-thing tests/thing.c)
        """),
    "ggml/ggml.c": "int ggml_answer(void) { return 42; }\n",
    "src/llama.c": "int ggml_answer(void);\nint llama_answer(void) { return ggml_answer(); }\n",
    "tools/cli.c": "#include <stdio.h>\nint llama_answer(void);\nint main(void) { printf(\"%d\\n\", llama_answer()); return 0; }\n",
    "tests/thing.c": "int main(void) { return 0; }\n",
    "ggml/cmake/common.cmake": "function(ggml_cuda_fattn_vec_instances DIR OUT)\n"
                               "    set(FA_TYPES q4_0 q4_1 q5_0 q5_1 q8_0 bf16 f16)\nendfunction()\n",
    "README.md": "tiny\n",
}
TINY_TARGETS = ["ggml", "llama", "llama-cli"]


def tiny_project(tmp_path: Path, monkeypatch, files: dict[str, str] | None = None) -> Proj:
    """A project whose vendored tree is the tiny CMake project, fetched and locked."""
    from polyforge.upstream import vendor

    up = make_upstream(tmp_path, files or CMAKE_FILES)
    root = tmp_path / "project"
    write_pin(root, up)
    (root / "patches").mkdir()
    (root / "gates").mkdir()
    (root / "gates" / "build.yaml").write_text("cuda:\n  fa_quants: [q8_0-q4_0]\n")
    monkeypatch.setenv("POLYFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("POLYFORGE_ROOT", raising=False)
    monkeypatch.chdir(root)
    proj = Proj(root, up)
    chain = proj.chain()
    vendor.fetch(chain)
    chain.relock()
    return proj


def write_script(path: Path, body: str) -> Path:
    """An executable Python script (a fake llama binary) at path."""
    import sys

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def fake_build(root: Path, key: str, binaries: dict[str, str], cuda: bool = False) -> Path:
    """A finished build directory with a manifest and the given fake binaries."""
    build_dir = root / "build" / key
    for name, body in binaries.items():
        write_script(build_dir / "bin" / name, body)
    manifest = {"key": key, "build_dir": str(build_dir), "inputs": {"options": {"cuda": cuda}, "chain": []},
                "live_tree": "0" * 40, "artifacts": [], "targets": sorted(binaries)}
    (build_dir / "manifest.json").write_text(json.dumps(manifest))
    return build_dir


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def real_build():
    """The real CPU build of the vendored tree (slow tests): `polyforge up --no-gates`
    (fetch, apply, verify-patches, build of the default targets), reused by key."""
    from conftest import ROOT

    done = run_pf("up", "--no-gates", "--json", cwd=ROOT, timeout=5400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    build_step = next(s for s in result["steps"] if s["step"] == "build")
    from polyforge.build.builder import read_manifest
    manifest = read_manifest(ROOT / "build" / build_step["key"])
    assert manifest is not None
    return manifest


def run_pf(*args: str, cwd: Path, timeout: float = 1800, env: dict | None = None):
    """The CLI as a subprocess, like conftest.run_cli, with a timeout fit for real builds."""
    import os
    import subprocess
    import sys

    full_env = {**os.environ, **(env or {})}
    full_env.pop("COLUMNS", None)
    return subprocess.run([sys.executable, "-m", "polyforge", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# a fake llama-bench: the bench tests and the pipeline's run_bench test drive it
FAKE_BENCH = """\
import json, sys
args = sys.argv[1:]
arg = lambda f: args[args.index(f) + 1]
with open(__file__ + ".calls", "a") as f:
    f.write(" ".join(args) + "\\n")
speed = {"f16": 100.0, "q8_0": 90.0, "q4_0": 80.0}[arg("-ctk")]
if "-fa" in args and arg("-fa") == "1":
    speed *= 1.5
print("load_backend: loaded CPU backend", file=sys.stderr)
rows = []
for depth in map(int, arg("-d").split(",")):
    for n_prompt, n_gen in ((int(arg("-p")), 0), (0, int(arg("-n")))):
        if n_prompt == 0 and n_gen == 0:
            continue
        rows.append({"type_k": arg("-ctk"), "type_v": arg("-ctv"), "n_prompt": n_prompt, "n_gen": n_gen,
                     "n_depth": depth, "avg_ts": speed * (4 if n_prompt else 1) / (1 + depth / 1000),
                     "stddev_ts": 1.5, "samples_ts": [1.0] * int(arg("-r")), "model_size": 2_000_000_000})
print(json.dumps(rows, indent=2))
"""
