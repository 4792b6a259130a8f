"""polyforge build: the key, the plan, and real (tiny) cmake+ninja builds in tmp dirs."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from buildkit import CMAKE_FILES, TINY_TARGETS, tiny_project
from conftest import assert_clean_error, capture, run_cli
from polyforge.build import builder as build_lib
from polyforge.build import toolchain
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed
from polyforge.hashing import sha256_file


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    return tiny_project(tmp_path, monkeypatch)


def _plan(proj, **kwargs):
    chain = proj.chain()
    targets = kwargs.pop("targets", TINY_TARGETS)
    return build_lib.plan(chain, build_lib.BuildOptions.make(targets=targets, **kwargs))


# -- options and key -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, fragment", [
    ({"arch": "90"}, "--arch needs --cuda"),
    ({"cuda": True, "arch": "ninety"}, "not a CUDA architecture"),
    ({"defines": ["NOEQUALS"]}, "expected KEY=VALUE"),
    ({"build_type": "Fast"}, "--type Fast"),
    ({"jobs": 0}, "--jobs"),
])
def test_bad_options(kwargs, fragment):
    with pytest.raises(BadInput, match=fragment):
        build_lib.BuildOptions.make(**kwargs)


def test_arch_spellings_normalise():
    """sm_/compute_ prefixes go; CMake's -real/-virtual suffix stays: 90-real builds no PTX, 90 builds both."""
    options = build_lib.BuildOptions.make(cuda=True, arch="sm_90,120a;86-real,compute_89-virtual")
    assert options.archs == ("90", "120a", "86-real", "89-virtual")


def test_key_is_stable_and_tracks_every_input(tiny, monkeypatch):
    first = _plan(tiny)
    again = _plan(tiny)
    assert first.key == again.key and first.build_dir == again.build_dir
    assert first.build_dir.parent == tiny.root / "build" and first.key.startswith("cpu-")
    # options
    assert _plan(tiny, build_type="Debug").key != first.key
    assert _plan(tiny, defines=["LLAMA_FOO=1"]).key != first.key
    # targets are not part of the key: building more targets reuses the directory
    assert _plan(tiny, targets=["ggml"]).key == first.key
    # a live edit keeps the key (ninja rebuilds it incrementally) but changes the live tree id
    tiny.write("tools/cli.c", CMAKE_FILES["tools/cli.c"] + "/* edit */\n")
    edited = _plan(tiny)
    assert edited.key == first.key and edited.live_tree != first.live_tree
    # a patch changes the key, and the chain digest records its name and sha256
    capture(tiny, "0001-edit-cli", {})
    patched = _plan(tiny)
    assert patched.key != first.key
    assert [c["name"] for c in patched.inputs["chain"]] == ["0001-edit-cli.patch"]
    # the toolchain is part of the key
    real = toolchain.describe
    monkeypatch.setattr(toolchain, "describe", lambda cuda, cublas=None: {**real(cuda, cublas), "cxx_version": "g++ 99.0"})
    assert _plan(tiny).key != patched.key


def test_ccache_namespace_is_the_toolchain_only(tiny, monkeypatch):
    monkeypatch.setattr(toolchain, "find_ccache", lambda: "/usr/bin/ccache")
    tools = {"cc": "/usr/bin/gcc", "cxx_version": "g++ 12"}
    env = build_lib.ccache_env(tiny.root, tools)
    assert env["CCACHE_BASEDIR"] == str(tiny.root)
    assert env == build_lib.ccache_env(tiny.root, dict(tools))
    assert env["CCACHE_NAMESPACE"] != build_lib.ccache_env(tiny.root, {**tools, "cxx_version": "g++ 13"})["CCACHE_NAMESPACE"]
    monkeypatch.setattr(toolchain, "find_ccache", lambda: None)
    assert build_lib.ccache_env(tiny.root, tools) == {}


def test_plan_is_offline_and_shared(tiny):
    args = _plan(tiny).cache_args
    for flag in ("-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DBUILD_SHARED_LIBS=ON",
                 "-DFETCHCONTENT_FULLY_DISCONNECTED=ON", "-DGGML_CUDA=OFF"):
        assert flag in args


def test_x86_builds_leave_out_amx(tiny, monkeypatch):
    assert build_lib.cpu_compile_flags({}, "x86_64") == "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    assert build_lib.cpu_compile_flags({}, "aarch64") == ""
    assert build_lib.cpu_compile_flags({"CMAKE_CXX_FLAGS": "-O1"}, "x86_64") == ""  # the user's flags win
    monkeypatch.setattr(build_lib, "cpu_compile_flags", lambda defines: "-mno-amx-int8")
    plan = _plan(tiny)
    assert "-DCMAKE_CXX_FLAGS=-mno-amx-int8" in plan.cache_args and "-DCMAKE_C_FLAGS=-mno-amx-int8" in plan.cache_args
    assert plan.inputs["options"]["cpu_flags"] == "-mno-amx-int8"


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 compiler flags")
def test_amx_flags_beat_an_amx_march():
    """ggml compiles its AMX kernels when __AMX_INT8__ is defined; -march=native on an AMX host
    defines it, and our flags must undo that whatever their order."""
    cxx = shutil.which("c++") or shutil.which("g++")
    assert cxx, "a C++ compiler is needed for the build tests"
    def macros(*flags):
        return subprocess.run([cxx, *flags, "-dM", "-E", "-x", "c++", "/dev/null"], capture_output=True,
                              text=True, check=True).stdout
    assert "__AMX_INT8__" in macros("-march=sapphirerapids")
    flags = build_lib.cpu_compile_flags({}, "x86_64").split()
    assert "__AMX_INT8__" not in macros(*flags, "-march=sapphirerapids")
    assert "__AMX_TILE__" not in macros("-march=sapphirerapids", *flags)


# -- CUDA planning -------------------------------------------------------------------------
@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: "/usr/bin/true")
    monkeypatch.setattr(toolchain, "find_cublas", lambda nvcc: "/usr/lib/libcublas.so")


def test_fa_quants_follow_the_tree(tiny, fake_cuda):
    """Pairs of the chain's own types are left out only while the patch bringing them is
    unapplied; a pair the tree cannot build is an error, never a silently missing kernel."""
    from conftest import capture
    (tiny.root / "gates" / "build.yaml").write_text("cuda:\n  fa_quants: [q8_0-q4_0, turbo3-turbo3, q8_0-turbo4]\n")
    with pytest.raises(BadInput, match="turbo3-turbo3, q8_0-turbo4: the tree's ggml/cmake/common.cmake does not know turbo3, turbo4"):
        _plan(tiny, cuda=True, arch="90")
    common = tiny.read("ggml/cmake/common.cmake")
    capture(tiny, "0001-turbo-types", {"ggml/cmake/common.cmake": common.replace("bf16 f16)", "bf16 f16 turbo2 turbo3 turbo4)")})
    tiny.chain().unapply()
    plan = _plan(tiny, cuda=True, arch="90")
    assert "-DGGML_CUDA_FA_QUANTS=q8_0-q4_0" in plan.cache_args
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in plan.cache_args
    assert any("turbo3-turbo3" in n and "q8_0-turbo4" in n and "unapplied" in n for n in plan.notes)
    tiny.chain().apply()  # the tree knows the turbo types: the pairs are kept
    plan = _plan(tiny, cuda=True, arch="90")
    assert "-DGGML_CUDA_FA_QUANTS=q8_0-q4_0,turbo3-turbo3,q8_0-turbo4" in plan.cache_args
    # an explicit -D wins and is part of the key
    explicit = _plan(tiny, cuda=True, arch="90", defines=["GGML_CUDA_FA_QUANTS=all"])
    assert "-DGGML_CUDA_FA_QUANTS=all" in explicit.cache_args and explicit.key != plan.key
    assert _plan(tiny, cuda=True, arch="90,120").key != plan.key


def test_fa_quants_unit():
    pairs = ["q8_0-q4_0", "turbo3-turbo3"]
    assert build_lib.fa_quants(pairs, ("q8_0", "q4_0", "f16"), frozenset({"turbo3"})) == ("q8_0-q4_0", ["turbo3-turbo3"])
    assert build_lib.fa_quants(["turbo3-turbo3"], ("f16",), frozenset({"turbo3"})) == ("f16-f16", ["turbo3-turbo3"])
    assert build_lib.fa_quants(pairs, ("q8_0", "q4_0", "turbo3")) == ("q8_0-q4_0,turbo3-turbo3", [])
    with pytest.raises(BadInput, match="does not know turbo3"):
        build_lib.fa_quants(pairs, ("q8_0", "q4_0", "f16"))
    with pytest.raises(VerificationFailed, match="FA_TYPES"):
        build_lib.fa_quants(pairs, None)


def test_real_repo_declares_the_chain_pairs():
    root = Path(__file__).resolve().parents[2]
    pairs = build_lib.load_fa_pairs(root / "gates")
    for pair in ("q8_0-q4_0", "turbo2-turbo2", "turbo3-turbo3", "turbo4-turbo4", "q8_0-turbo4", "q8_0-turbo3",
                 "q8_0-turbo2"):
        assert pair in pairs


def test_cuda_without_gpu_asks_for_arch(tiny, fake_cuda, monkeypatch):
    monkeypatch.setattr(toolchain, "local_gpu_archs", lambda: [])
    with pytest.raises(EnvironmentProblem, match="--cuda: no GPU") as info:
        _plan(tiny, cuda=True)
    assert "--arch" in info.value.hint
    monkeypatch.setattr(toolchain, "local_gpu_archs", lambda: ["90"])
    plan = _plan(tiny, cuda=True)
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in plan.cache_args and "native" not in " ".join(plan.cache_args)


def test_cuda_without_nvcc(tiny, monkeypatch):
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    with pytest.raises(EnvironmentProblem, match="nvcc"):
        _plan(tiny, cuda=True, arch="90")


def test_cuda_without_cublas(tiny, monkeypatch, tmp_path):
    toolkit = tmp_path / "cuda" / "bin"
    toolkit.mkdir(parents=True)
    (toolkit / "nvcc").write_text("#!/bin/sh\necho nvcc\n")
    (toolkit / "nvcc").chmod(0o755)
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: str(toolkit / "nvcc"))
    monkeypatch.setattr(toolchain.Path, "glob", lambda self, pattern: iter(()))  # no system cuBLAS either
    with pytest.raises(EnvironmentProblem, match="cuBLAS"):
        _plan(tiny, cuda=True, arch="90")


def test_missing_compiler(tiny, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(EnvironmentProblem, match="compiler"):
        _plan(tiny)


# -- real builds of the tiny project ---------------------------------------------------------
def test_build_manifest_reuse_and_incremental_live_edit(tiny):
    plan = _plan(tiny)
    lines = []
    first = build_lib.run(plan, on_progress=lambda d, t, w: lines.append((d, t)))
    assert first.configured
    assert lines and lines[-1][0] == lines[-1][1]  # ninja's [n/m] reached m
    manifest = json.loads((plan.build_dir / "manifest.json").read_text())
    names = {a["name"]: a for a in manifest["artifacts"]}
    assert {"libggml.so", "libllama.so.0.5.0", "llama-cli"} <= set(names) and "libllama.so" not in names
    assert names["libllama.so.0.5.0"]["links"] == ["libllama.so", "libllama.so.0"]
    assert names["llama-cli"]["kind"] == "binary" and names["libllama.so.0.5.0"]["kind"] == "library"
    for art in manifest["artifacts"]:
        path = plan.build_dir / art["path"]
        assert art["sha256"] == sha256_file(path) and art["size"] == path.stat().st_size
    assert manifest["inputs"]["baseline_tree"] == tiny.upstream.tree
    assert manifest["live_tree"] == plan.live_tree
    # unchanged key: no reconfigure, ninja has nothing to do
    again = build_lib.run(_plan(tiny))
    assert not again.configured
    assert "no work to do" in (plan.build_dir / "build.log").read_text()
    assert again.manifest.as_dict()["artifacts"] == manifest["artifacts"]
    # the file round-trips (read back now: the no-op build above rewrote it, built_at included)
    on_disk = json.loads((plan.build_dir / "manifest.json").read_text())
    assert build_lib.read_manifest(plan.build_dir).as_dict() == on_disk == again.manifest.as_dict()
    # a live edit rebuilds in the same directory and the manifest records the new live tree
    tiny.write("tools/cli.c", CMAKE_FILES["tools/cli.c"].replace("int main(void) {", "int main(void) { puts(\"x\");"))
    edited_plan = _plan(tiny)
    edited = build_lib.run(edited_plan)
    assert edited_plan.build_dir == plan.build_dir and not edited.configured
    new = {a.name: a for a in edited.manifest.artifacts}
    assert new["llama-cli"].sha256 != names["llama-cli"]["sha256"]
    assert new["libggml.so"].sha256 == names["libggml.so"]["sha256"]
    assert edited.manifest.live_tree != manifest["live_tree"]
    rows = build_lib.list_builds(tiny.root / "build")
    assert [r["key"] for r in rows] == [plan.key] and rows[0]["state"] == "built"
    assert build_lib.find_build(tiny.root / "build", plan.key[:8]).key == plan.key


def test_unknown_target(tiny):
    plan = _plan(tiny, targets=["llama-cli", "llama-nope"])
    with pytest.raises(BadInput, match="unknown build target.*llama-nope"):
        build_lib.run(plan)


def test_compile_error_names_file_line_and_log(tiny):
    tiny.write("src/llama.c", "int llama_answer(void) { return undeclared_thing; }\n")
    plan = _plan(tiny)
    with pytest.raises(build_lib.BuildFailed) as info:
        build_lib.run(plan)
    message = info.value.message
    assert "src/llama.c:1" in message and "undeclared_thing" in message
    assert str(plan.build_dir / "build.log") in message
    assert info.value.exit_code == 1


def test_configure_error_is_reported_and_not_sticky(tiny):
    good = (tiny.tree / "CMakeLists.txt").read_text()
    tiny.write("CMakeLists.txt", good + "message(FATAL_ERROR \"broken on purpose\")\n")
    plan = _plan(tiny)
    with pytest.raises(build_lib.BuildFailed, match="cmake configure failed.*CMakeLists.txt"):
        build_lib.run(plan)
    tiny.write("CMakeLists.txt", good)
    assert build_lib.run(_plan(tiny)).configured  # configured afresh, not half-reused


def test_cli_build_print_plan_list_and_errors(tiny):
    done = run_cli("build", "--print-plan", "--json", "--target", "llama-cli", cwd=tiny.root)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["targets"] == ["llama-cli"] and plan["configured"] is False
    done = run_cli("build", "--target", "llama-cli", cwd=tiny.root)
    assert done.returncode == 0, done.stderr
    assert "  [1/" in done.stderr and f"ok {plan['key']}" in done.stderr and "(configured)" in done.stderr
    done = run_cli("build", "--target", "llama-cli", "--json", cwd=tiny.root)
    assert done.returncode == 0, done.stderr
    built = json.loads(done.stdout)
    assert built["ok"] and built["key"] == plan["key"] and built["configured"] is False
    assert any(a["name"] == "llama-cli" for a in built["artifacts"])
    done = run_cli("build", "--list", "--json", cwd=tiny.root)
    assert [r["key"] for r in json.loads(done.stdout)] == [plan["key"]]
    assert_clean_error(run_cli("build", "--target", "nope", cwd=tiny.root), 2, "unknown build target")
    assert_clean_error(run_cli("build", "--arch", "90", cwd=tiny.root), 2, "--arch needs --cuda")


@pytest.mark.skipif(shutil.which("ccache") is None, reason="ccache is not installed (CI installs it)")
def test_a_new_key_hits_ccache(tiny, tmp_path, monkeypatch):
    """A fresh build directory (new key, same sources and flags) compiles from ccache:
    the namespace is the toolchain's, and BASEDIR makes the paths relative."""
    monkeypatch.setenv("CCACHE_DIR", str(tmp_path / "ccache"))
    first = _plan(tiny)
    build_lib.run(first)
    second = _plan(tiny, defines=["UNUSED_PROBE=1"])  # a new key; the 3 objects compile the same
    assert second.build_dir != first.build_dir
    done = subprocess.run(["ccache", "-z"], capture_output=True, text=True, env={**os.environ, **second.env})
    assert done.returncode == 0
    assert build_lib.run(second).configured
    stats = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True,
                           env={**os.environ, **second.env}).stdout
    counts = dict(line.split("\t") for line in stats.splitlines() if line.count("\t") == 1)
    assert int(counts["direct_cache_hit"]) == 3 and int(counts["cache_miss"]) == 0, counts
