"""scripts/cuda_host_build.sh on a stand-in tree: the driver stub exports the functions the tree's ggml-cuda calls,
under the driver's soname, and polyforge build gets the stub, the wheel's cuBLAS, the SASS-only arch and the targets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cuda_host_build.sh"

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("nm") and shutil.which("readelf")),
                                reason="needs gcc and binutils")


def _stand_in(root: Path) -> dict[str, str]:
    """A tree whose ggml-cuda calls three driver functions, a cuBLAS already unpacked, and a recording python."""
    cuda_src = root / "vendor/llama.cpp/ggml/src/ggml-cuda"
    cuda_src.mkdir(parents=True)
    (cuda_src / "vmm.cu").write_text(
        "CU_CHECK(cuMemCreate(&h, size, &prop, 0));\nCU_CHECK(cuMemMap(ptr, size, 0, h, 0));\n"
        "cudaMalloc(&p, n);  // the runtime API is not the driver's\n")
    (cuda_src / "common.cuh").write_text("cuGetErrorString (err, &msg);\n")
    deps = root / "deps"
    lib = deps / "cublas/nvidia/cu13/lib"
    lib.mkdir(parents=True)
    (lib / "libcublas.so.13").write_text("")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvcc").chmod(0o755)
    fake_python = bin_dir / "python"
    fake_python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {root}/build-args\necho \'{{"key": "cuda-x"}}\'\n')
    fake_python.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(fake_python),
            "CUDA_HOST_DEPS": str(deps), "TARGETS": "test-backend-ops llama-bench"}


def test_stub_follows_the_tree_and_build_gets_it(tmp_path: Path) -> None:
    env = _stand_in(tmp_path)
    result = subprocess.run(["bash", str(SCRIPT), "--quiet"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '{"key": "cuda-x"}'
    stub = tmp_path / "deps/custub/libcuda.so"
    exported = subprocess.run(["nm", "-D", "--defined-only", str(stub)], capture_output=True, text=True,
                              check=True).stdout
    names = sorted(line.split()[-1] for line in exported.splitlines() if line.split()[-1].startswith("cu"))
    assert names == ["cuGetErrorString", "cuMemCreate", "cuMemMap"]
    dynamic = subprocess.run(["readelf", "-d", str(stub)], capture_output=True, text=True, check=True).stdout
    assert "[libcuda.so.1]" in dynamic
    assert os.readlink(tmp_path / "deps/custub/libcuda.so.1") == "libcuda.so"
    args = (tmp_path / "build-args").read_text().splitlines()
    assert args[:4] == ["-m", "polyforge", "build", "--cuda"]
    assert args[args.index("--arch") + 1] == "90-real"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--target"] == ["test-backend-ops", "llama-bench"]
    lib = tmp_path / "deps/cublas/nvidia/cu13/lib"
    assert f"CUDA_cuda_driver_LIBRARY={stub}" in args
    assert f"CUDA_cublas_LIBRARY={lib}/libcublas.so.13" in args
    assert args[-2:] == ["--json", "--quiet"]


def test_without_a_vendored_tree_one_line_and_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "cuda_host_build: no vendor/llama.cpp/ggml/src/ggml-cuda: run polyforge vendor fetch and apply first"]


def test_ship_out_packs_the_build_for_a_gpu_machine(tmp_path: Path) -> None:
    env = _stand_in(tmp_path)
    # a python that runs `-c` code as python does and answers the build as the stand-in's does
    fake_python = Path(env["PYTHON"])
    fake_python.write_text(
        f'#!/bin/sh\nif [ "$1" = -c ]; then exec {sys.executable} "$@"; fi\n'
        f'printf "%s\\n" "$@" > {tmp_path}/build-args\necho \'{{"key": "cuda-x"}}\'\n')
    built = tmp_path / "build/cuda-x"
    (built / "bin").mkdir(parents=True)
    (built / "bin/libggml-cuda.so").write_text("kernels")
    (built / "manifest.json").write_text('{"key": "cuda-x"}')
    (built / "CMakeCache.txt").write_text("not shipped")
    ship = tmp_path / "ship.tar.xz"
    result = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env={**env, "SHIP_OUT": str(ship)},
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '{"key": "cuda-x"}'
    with tarfile.open(ship) as tar:
        assert sorted(tar.getnames()) == ["cuda-x/bin", "cuda-x/bin/libggml-cuda.so", "cuda-x/manifest.json"]
        assert tar.extractfile("cuda-x/bin/libggml-cuda.so").read() == b"kernels"
    assert f"build cuda-x packed into {ship}" in result.stderr
