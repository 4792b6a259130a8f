"""`polyforge doctor`: what this machine has for building and gating, each ok or missing,
with the fix."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from polyforge.build import cmake
from polyforge.build import remote_cache
from polyforge.build import toolchain
from polyforge.build.builder import BUILD_CONFIG
from polyforge.errors import BadInput, EnvironmentProblem
from polyforge.gates import GATE_MODULES, distribution_version
from polyforge.project import find_project

MIN_FREE_GIB = 10.0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None
    required: bool = True  # False: only some commands need it (nvcc, GPU)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Report:
    checks: list[Check]

    @property
    def ok(self) -> bool:
        """Every required check passed (nvcc, the GPU and ccache are wanted, not required)."""
        return all(c.ok for c in self.checks if c.required)

    def as_dict(self) -> dict:
        return {"ok": self.ok, "checks": [c.as_dict() for c in self.checks]}


def diagnose() -> Report:
    """The checks, the disk's at this project's build/ (or the current folder: doctor also runs
    outside a project)."""
    try:
        project = find_project()
        disk_path, build_config = project.build_root, project.gates_dir / BUILD_CONFIG
    except BadInput:
        disk_path, build_config = Path.cwd(), None
    return Report(checks(disk_path, build_config))


def _tool(name: str, finder, fix: str) -> Check:
    try:
        path = finder()
    except EnvironmentProblem as exc:
        return Check(name, False, exc.message, fix)
    version = cmake.tool_version(path)
    if version is None:
        return Check(name, False, f"{path} does not run", fix)
    return Check(name, True, f"{version} ({path})")


def checks(disk_path: Path, build_config: Path | None = None) -> list[Check]:
    out = []
    py_ok = sys.version_info >= (3, 10)
    out.append(Check("python", py_ok, f"{platform.python_version()} ({sys.executable})",
                     None if py_ok else "use Python 3.10 or newer"))
    out += [_gate_module(module, dist) for module, dist in GATE_MODULES.items()]
    out.append(_tool("cmake", cmake.find_cmake, "pip install cmake"))
    out.append(_tool("ninja", cmake.find_ninja, "pip install ninja"))
    for var, default, label in (("CXX", "c++", "c++ compiler"), ("CC", "cc", "c compiler")):
        path = toolchain.find_compiler(var, default)
        version = cmake.tool_version(path) if path else None
        out.append(Check(label, version is not None, f"{version} ({path})" if version else "not found",
                         None if version else "apt-get install build-essential (or set $CXX/$CC)"))
    nvcc = toolchain.find_nvcc()
    nvcc_version = cmake.tool_version(nvcc, lines=2) if nvcc else None
    out.append(Check("nvcc", nvcc_version is not None, f"{nvcc_version} ({nvcc})" if nvcc_version else "not found",
                     None if nvcc_version else "install the CUDA toolkit or set CUDACXX (needed for --cuda only)",
                     required=False))
    cublas = toolchain.find_cublas(nvcc) if nvcc else None
    out.append(Check("cublas", cublas is not None, cublas or ("not found next to nvcc" if nvcc else "no CUDA toolkit"),
                     None if cublas else "install the CUDA toolkit's cuBLAS, e.g. libcublas-dev-13-0 (needed for --cuda only)",
                     required=False))
    gpus = _gpus()
    out.append(Check("gpu", bool(gpus), "; ".join(gpus) if gpus else "no NVIDIA GPU visible (nvidia-smi)",
                     None if gpus else "without one, --cuda builds need --arch (and gates run on the CPU)",
                     required=False))
    ccache = toolchain.find_ccache()
    ccache_version = cmake.tool_version(ccache) if ccache else None
    out.append(Check("ccache", ccache_version is not None, f"{ccache_version} ({ccache})" if ccache_version else "not found",
                     None if ccache_version else "apt-get install ccache (rebuilds of a new key get much faster)",
                     required=False))
    out.append(remote_cache_check(build_config))
    probe = disk_path if disk_path.exists() else Path.cwd()
    free = shutil.disk_usage(probe).free / 2**30
    out.append(Check("disk", free >= MIN_FREE_GIB, f"{free:.1f} GiB free at {probe}",
                     None if free >= MIN_FREE_GIB else f"free at least {MIN_FREE_GIB:.0f} GiB (a CUDA build takes several)"))
    return out


def remote_cache_check(build_config: Path | None) -> Check:
    """The shared compiler cache builds would use ($POLYFORGE_REMOTE_CACHE, else build.yaml's
    remote_cache.url): none, or reachable, or why not. Wanted, never required: builds without
    it use the local cache."""
    name = "remote cache"
    where = f"${remote_cache.ENV_VAR} or {BUILD_CONFIG} remote_cache.url"
    try:
        remote = remote_cache.configured(build_config)
    except BadInput as exc:
        return Check(name, False, exc.message, exc.hint or f"fix {where}", required=False)
    if remote is None:
        return Check(name, True, f"none configured ({where}): builds use the local ccache alone", required=False)
    why = remote_cache.probe(remote)
    if why is not None:
        return Check(name, False, f"{remote.shown} (from {remote.origin}): {why}",
                     "start the cache server or fix the URL; builds meanwhile use the local cache", required=False)
    return Check(name, True, f"{remote.shown} (from {remote.origin}) answers", required=False)


def _gate_module(module: str, dist: str) -> Check:
    """A module the gate programs import, looked for in this interpreter (the one gates run)."""
    name = f"python module {module}"
    if importlib.util.find_spec(module) is None:
        return Check(name, False, "not importable (the gates' programs import it)",
                     f"pip install {dist} (a dependency of polyforge: reinstall it, pip install -e .)")
    version = distribution_version(dist) or "version unknown"  # importable from a folder, not installed
    return Check(name, True, f"{dist} {version}")


def _gpus() -> list[str]:
    rows = []
    for parts in toolchain.query_gpus("name,compute_cap,memory.total"):
        if len(parts) >= 2:
            rows.append(f"{parts[0]} (compute capability {parts[1]}" + (f", {parts[2]})" if len(parts) > 2 else ")"))
    return rows
