"""What this machine builds with: compilers, nvcc and its cuBLAS, ccache, the GPUs. Probed here
for both build (which keys a build by it and refuses what it lacks) and doctor (which reports
each as ok or missing)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from polyforge import proc
from polyforge.build import cmake
from polyforge.errors import EnvironmentProblem


def find_compiler(var: str, default: str) -> str | None:
    """The compiler $VAR names (or `default`), resolved to its real path: cc and c++ are
    usually links, and the key should name the compiler, not the link."""
    name = os.environ.get(var) or default
    path = proc.which(name)
    return os.path.realpath(path) if path else None


def find_nvcc() -> str | None:
    for candidate in (os.environ.get("CUDACXX"), proc.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_cublas(nvcc: str) -> str | None:
    """libcublas of the toolkit nvcc belongs to (ggml-cuda links CUDA::cublas), or a system one."""
    roots = [Path(os.path.realpath(nvcc)).parent.parent, Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"))]
    folders = [f for root in roots for f in (root / "lib64", root / "lib", *sorted(root.glob("targets/*/lib")))]
    folders += [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib/aarch64-linux-gnu")]
    for folder in folders:
        hits = sorted(folder.glob("libcublas.so*")) if folder.is_dir() else []
        if hits:
            return str(hits[0])
    return None


def find_ccache() -> str | None:
    return proc.which("ccache")


def query_gpus(fields: str) -> list[list[str]]:
    """One row of nvidia-smi --query-gpu=FIELDS per GPU; [] without a usable nvidia-smi."""
    smi = proc.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = proc.run([smi, f"--query-gpu={fields}", "--format=csv,noheader"], timeout=30)
    except EnvironmentProblem:
        return []
    if done.returncode != 0:
        return []
    return [[p.strip() for p in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def local_gpu_archs() -> list[str]:
    """Compute capabilities of the local GPUs as CMake architectures ('9.0' -> '90')."""
    archs = []
    for (cap, *_) in query_gpus("compute_cap"):
        m = re.match(r"^(\d+)\.(\d+)$", cap)
        if m:
            archs.append(f"{m.group(1)}{m.group(2)}")
    return sorted(set(archs))


def describe(cuda: bool, cublas_library: str | None = None) -> dict:
    """The tools a build compiles with and their versions (part of the build key); fails, with
    the fix, on what the build needs and this machine lacks. `cublas_library` is the build's
    CUDA_cublas_LIBRARY define: a cuBLAS outside the toolkit (a GPU-less build host with the
    nvidia-cublas wheel, say), which then replaces the search."""
    cc, cxx = find_compiler("CC", "cc"), find_compiler("CXX", "c++")
    if cxx is None or cc is None:
        raise EnvironmentProblem("no C/C++ compiler found (cc, c++ or $CC, $CXX)",
                                 hint="install one, e.g. apt-get install build-essential")
    info = {"cc": cc, "cc_version": cmake.tool_version(cc), "cxx": cxx, "cxx_version": cmake.tool_version(cxx),
            "cmake_version": cmake.tool_version(cmake.find_cmake())}
    if cuda:
        nvcc = find_nvcc()
        if nvcc is None:
            raise EnvironmentProblem("--cuda needs nvcc, and none was found (PATH, $CUDACXX, /usr/local/cuda/bin)",
                                     hint="install the CUDA toolkit or set CUDACXX")
        if cublas_library is not None:
            if not os.path.isfile(cublas_library):
                raise EnvironmentProblem(f"CUDA_cublas_LIBRARY={cublas_library} is not a file",
                                         hint="name libcublas.so of the cuBLAS to link, or leave the define out")
        elif find_cublas(nvcc) is None:
            raise EnvironmentProblem(f"--cuda needs cuBLAS (libcublas.so), and the CUDA toolkit of {nvcc} has none",
                                     hint="install the toolkit's cuBLAS (e.g. apt-get install libcublas-dev-13-0)")
        info["nvcc"] = nvcc
        info["nvcc_version"] = cmake.tool_version(nvcc, lines=2)
    return info
