"""polyforge.build.toolchain: the probes build and doctor share, against fake tools on PATH."""

from __future__ import annotations

import os

import pytest

from buildkit import write_script
from polyforge.build import toolchain
from polyforge.errors import EnvironmentProblem


def test_find_compiler_resolves_the_variable_to_a_real_path(tmp_path, monkeypatch):
    real = write_script(tmp_path / "bin" / "gcc-99", "print('gcc 99')\n")
    (tmp_path / "bin" / "c++").symlink_to(real)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CXX", raising=False)
    assert toolchain.find_compiler("CXX", "c++") == os.path.realpath(real)  # the link's target names the compiler
    monkeypatch.setenv("CXX", "no-such-c++")
    assert toolchain.find_compiler("CXX", "c++") is None


def test_find_nvcc_and_its_cublas(tmp_path, monkeypatch):
    nvcc = write_script(tmp_path / "cuda" / "bin" / "nvcc", "print('nvcc')\n")
    monkeypatch.setenv("CUDACXX", str(nvcc))
    assert toolchain.find_nvcc() == str(nvcc)
    lib = tmp_path / "cuda" / "lib64" / "libcublas.so.13"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    assert toolchain.find_cublas(str(nvcc)) == str(lib)  # the toolkit's own, before any system one


def test_gpu_archs_from_nvidia_smi(tmp_path, monkeypatch):
    write_script(tmp_path / "nvidia-smi", "print('9.0'); print('12.0'); print('9.0')\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert toolchain.local_gpu_archs() == ["120", "90"]
    write_script(tmp_path / "nvidia-smi", "import sys; sys.exit(9)\n")
    assert toolchain.query_gpus("name") == [] and toolchain.local_gpu_archs() == []


def test_describe_needs_a_compiler_and_for_cuda_nvcc_and_cublas(monkeypatch):
    tools = toolchain.describe(cuda=False)
    assert set(tools) == {"cc", "cc_version", "cxx", "cxx_version", "cmake_version"}  # the key digests these
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: "/usr/bin/true")
    monkeypatch.setattr(toolchain, "find_cublas", lambda nvcc: None)
    with pytest.raises(EnvironmentProblem, match="cuBLAS"):
        toolchain.describe(cuda=True)
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: None)
    with pytest.raises(EnvironmentProblem, match="nvcc"):
        toolchain.describe(cuda=True)
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(EnvironmentProblem, match="no C/C\\+\\+ compiler"):
        toolchain.describe(cuda=False)


def test_describe_takes_a_cublas_named_by_the_build(tmp_path, monkeypatch):
    """CUDA_cublas_LIBRARY (a GPU-less build host with the nvidia-cublas wheel) replaces the
    toolkit search; a name that is not a file is refused before cmake runs."""
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: "/usr/bin/true")
    monkeypatch.setattr(toolchain, "find_cublas", lambda nvcc: None)
    lib = tmp_path / "libcublas.so.13"
    lib.write_bytes(b"")
    assert toolchain.describe(cuda=True, cublas_library=str(lib))["nvcc"] == "/usr/bin/true"
    with pytest.raises(EnvironmentProblem, match="CUDA_cublas_LIBRARY=.* is not a file"):
        toolchain.describe(cuda=True, cublas_library=str(tmp_path / "missing.so"))
