"""Shared pieces for the build, gate and pipeline tests: a tiny CMake "llama.cpp" that the
real cmake and ninja from the venv build in seconds, fake llama binaries as scripts, and a real
redis-server for the remote compiler cache."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import textwrap
import time
from pathlib import Path

from conftest import Proj, make_upstream, write_pin
from polyforge.build import remote_cache

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
    for n_prompt, n_gen in [(int(p), 0) for p in arg("-p").split(",")] + [(0, int(arg("-n")))]:
        if n_prompt == 0 and n_gen == 0:
            continue
        rows.append({"type_k": arg("-ctk"), "type_v": arg("-ctv"), "n_prompt": n_prompt, "n_gen": n_gen,
                     "n_depth": depth, "avg_ts": speed * (4 if n_prompt else 1) / (1 + depth / 1000),
                     "stddev_ts": 1.5, "samples_ts": [1.0] * int(arg("-r")), "model_size": 2_000_000_000})
print(json.dumps(rows, indent=2))
"""


# a fake llama-batched-bench: the agents tests drive it. It prints what the real tool prints
# (tools/batched-bench/batched-bench.cpp): a markdown table on stdout by default, one JSON line per
# (pp, tg, pl) with --output-format jsonl; it skips what its context (the last -c, padded as
# llama.cpp pads it) cannot hold, and loses its last result line, as the real one can at exit (its
# logger thread is not joined). Speeds: decode SPEED[-ctk] t/s per agent, divided by 1 + P/1000,
# halved without -pps (each agent reads its own prefix); q4_0 also loses B% (a ratio that varies
# with B); prompt 10 x SPEED t/s.
FAKE_BATCHED_BENCH = """\
import sys
args = sys.argv[1:]
def arg(flag, default=None):
    return args[len(args) - 1 - args[::-1].index(flag) + 1] if flag in args else default
ints = lambda flag: [int(x) for x in arg(flag).split(",")]
with open(__file__ + ".calls", "a") as f:
    f.write(" ".join(args) + "\\n")
SPEED = {"f16": 100.0, "q8_0": 90.0, "q4_0": 80.0}
# FAKE_BB_DRIFT=1.0,0.5,...: the machine's speed at the 1st, 2nd, ... call (decode t/s times that)
import os
drift = [float(x) for x in os.environ.get("FAKE_BB_DRIFT", "1").split(",")]
call = sum(1 for _ in open(__file__ + ".calls")) - 1
if arg("-ctk") not in SPEED:
    print(f"error while handling argument \\"-ctk\\": Unsupported cache type: {arg('-ctk')}", file=sys.stderr)
    sys.exit(1)
shared, unified, jsonl = "-pps" in args, "-kvu" in args, arg("--output-format", "md") == "jsonl"
pad = lambda n: -(-n // 256) * 256
n_kv_max = pad(int(arg("-c", "0")) or 4096)  # 0: the model's trained context
if not unified:  # a KV stream per sequence, each n_ctx / n_seq_max (padded)
    n_kv_max = pad(n_kv_max // max(ints("-npl"))) * max(ints("-npl"))
fa = {"on": 1, "off": 0, "auto": -1}[arg("-fa", "auto")]
ngl = int(arg("-ngl", "-1"))
print("llama_context: n_ctx = %d" % n_kv_max, file=sys.stderr)
if not jsonl:
    print()
    print("llama_batched_bench: n_kv_max = %d, n_batch = 2048, n_ubatch = 512, flash_attn = %d, is_pp_shared = %d, "
          "is_tg_separate = 0, n_gpu_layers = %d, n_threads = 8, n_threads_batch = 8" % (n_kv_max, fa, shared, ngl))
    print()
    print("|%6s | %6s | %4s | %6s | %8s | %8s | %8s | %8s | %8s | %8s |"
          % ("PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s"))
    print("|%6s-|-%6s-|-%4s-|-%6s-|-%8s-|-%8s-|-%8s-|-%8s-|-%8s-|-%8s-|"
          % ("------", "------", "----", "------", *["--------"] * 6))
out = []
for pp in ints("-npp"):
    for tg in ints("-ntg"):
        for pl in ints("-npl"):
            n_kv = ((pp if unified else pl * pp) + pl * tg) if shared else pl * (pp + tg)
            if n_kv > n_kv_max:
                continue
            speed_tg = SPEED[arg("-ctk")] * pl / (1 + pp / 1000) / (1 if shared else 2)
            if arg("-ctk") == "q4_0":
                speed_tg /= 1 + pl / 100
            speed_tg *= drift[call % len(drift)]
            speed_pp = 10 * SPEED[arg("-ctk")]
            t_pp = (pp if shared else pl * pp) / speed_pp
            t_tg = pl * tg / speed_tg
            t = t_pp + t_tg
            speed = ((pp if shared else pl * pp) + pl * tg) / t
            if jsonl:
                out.append('{"n_kv_max": %d, "n_batch": %d, "n_ubatch": %d, "flash_attn": %d, "is_pp_shared": %d, '
                           '"n_gpu_layers": %d, "n_threads": %u, "n_threads_batch": %u, '
                           '"pp": %d, "tg": %d, "pl": %d, "n_kv": %d, "t_pp": %f, "speed_pp": %f, "t_tg": %f, '
                           '"speed_tg": %f, "t": %f, "speed": %f}'
                           % (n_kv_max, 2048, 512, fa, shared, ngl, 8, 8, pp, tg, pl, n_kv, t_pp, speed_pp, t_tg,
                              speed_tg, t, speed))
            else:
                out.append("|%6d | %6d | %4d | %6d | %8.3f | %8.2f | %8.3f | %8.2f | %8.3f | %8.2f |"
                           % (pp, tg, pl, n_kv, t_pp, speed_pp, t_tg, speed_tg, t, speed))
print("\\n".join(out[:-1]))  # the last line (and the blank one after it) lost at exit
print("llama_perf_context_print:        load time =      12.34 ms", file=sys.stderr)
"""


def write_gguf_header(path, kv: dict) -> None:
    """A GGUF header with the given metadata (ints as u32, lists as arrays of u32, strings) and no tensors."""
    import struct
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)))
    s = lambda t: struct.pack("<Q", len(t.encode())) + t.encode()  # noqa: E731
    for key, value in kv.items():
        out += s(key)
        if isinstance(value, str):
            out += struct.pack("<I", 8) + s(value)
        elif isinstance(value, list) and value and isinstance(value[0], str):
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(s(v) for v in value)
        elif isinstance(value, list):
            out += struct.pack("<IIQ", 9, 4, len(value)) + b"".join(struct.pack("<I", v) for v in value)
        else:
            out += struct.pack("<II", 4, value)
    path.write_bytes(bytes(out))


LLAMA_META = {"general.architecture": "llama", "llama.block_count": 16, "llama.embedding_length": 2048,
              "llama.attention.head_count": 16, "llama.attention.head_count_kv": 8,
              "tokenizer.ggml.tokens": ["tok"] * 2000}  # longer than MAX_ARRAY: skipped, kept as its length


# -- a real redis-server for the remote compiler cache ----------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path_factory):
    """A running, empty redis-server; stopped after the test. .ci/run installs redis-server."""
    server = shutil.which("redis-server")
    assert server is not None, "redis-server is not installed (apt-get install redis-server)"
    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while remote_cache.probe(remote_cache.parse(url, "test", credentials_allowed=True)) is not None:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def closed_url() -> str:
    return f"redis://127.0.0.1:{free_port()}"  # nothing listens there
