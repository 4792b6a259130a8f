"""`polyforge build`: build the vendored (patched) tree out of tree, keyed by its inputs.

The build directory is build/<kind>-<key>, where key digests
  - the baseline tree id (a pin bump changes it),
  - the applied chain: patch names and sha256 in order (a patch change changes it),
  - the build options (cuda, architectures, type, FA quant pairs, -D values),
  - the toolchain: C and C++ compiler, nvcc (for --cuda) and cmake versions.
A new key gets a fresh CMake cache, so nothing is sticky (CMAKE_CUDA_ARCHITECTURES in
particular). An unchanged key reuses the directory; live edits in the vendored tree that
no patch captures yet are rebuilt incrementally by ninja there, and the manifest records
the live tree id they were built from.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from polyforge import schema
from polyforge.build import cmake
from polyforge.build import remote_cache
from polyforge.build import toolchain
from polyforge.chain.engine import Chain
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed
from polyforge.filelock import FileLock
from polyforge.hashing import sha256_bytes, sha256_file
from polyforge.kvtypes import CHAIN_BITS
from polyforge.textfile import write_text_atomic

DEFAULT_TARGETS = ("ggml", "llama", "llama-server", "llama-cli", "llama-bench", "llama-batched-bench",
                   "llama-perplexity", "test-backend-ops", "test-quantize-fns")
BUILD_TYPES = ("Release", "Debug", "RelWithDebInfo")
BUILD_CONFIG = "build.yaml"  # under gates/: the K/V pairs the chain needs, one place
MANIFEST = "manifest.json"
LOG = "build.log"  # the last build's full output (ninja and the compilers)
CONFIGURE_LOG = "configure.log"  # cmake's output when this key was configured
CCACHE_STATS_LOG = "ccache-stats.log"  # what each compilation of the last build got from the caches
_CONFIGURED = ".polyforge-configured"

# Offline: the server UI would download prebuilt assets; FetchContent must never reach out.
OFFLINE_ARGS = ("-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DFETCHCONTENT_FULLY_DISCONNECTED=ON")
_DEFINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?::[A-Z]+)?=(.*)$")
_ARCH = re.compile(r"^(?:sm_|compute_)?(\d{2,3}[a-z]?(?:-(?:real|virtual))?)$")
_FA_TYPES = re.compile(r"set\s*\(\s*FA_TYPES\s+([^)]*)\)")

# x86-64 builds leave out ggml's AMX kernels: on AMX machines (Sapphire Rapids and later) a native
# build repacks Q4_K weights into AMX buffers whose mul_mat segfaults (upstream issue 20824; the
# Gemma 3 gates crash in warm-up). Explicit -mno-* flags win over -march=native in GCC and Clang.
X86_ISA_OFF = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")

# The binaries find their libraries through RUNPATH $ORIGIN (they share bin/), not the build
# directory's absolute path: bin/ is relocatable (polyforge package ships it), and two clones at
# different paths link the same bytes. The build tree takes the install RUNPATH: CMake's own build
# RUNPATH ends in an empty entry (padding), which the loader reads as the current directory.
# Libraries outside the compiler's own folders (the CUDA toolkit's) keep their absolute folder.
RUNPATH = "$ORIGIN"
RPATH_ARGS = ("-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", f"-DCMAKE_INSTALL_RPATH={RUNPATH}",
              "-DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON")
# libllama compiles its models/*.cpp as unity sources, which CMake writes with absolute #include
# paths: ccache's base directory cannot rewrite a path inside a file, so those objects missed the
# cache in every other clone and carried the clone's path (__FILE__) into libllama.so. Relative
# includes (CMake >= 3.32) make them the same in every clone.
UNITY_ARGS = ("-DCMAKE_UNITY_BUILD_RELOCATABLE=ON",)


class BuildFailed(VerificationFailed):
    """The compiler or cmake failed (exit 1)."""


@dataclass(frozen=True)
class BuildOptions:
    cuda: bool = False
    archs: tuple[str, ...] = ()
    targets: tuple[str, ...] = DEFAULT_TARGETS
    build_type: str = "Release"
    defines: tuple[tuple[str, str], ...] = ()
    jobs: int | None = None

    @staticmethod
    def make(*, cuda: bool = False, arch: str | None = None, targets: list[str] | None = None,
             build_type: str = "Release", defines: list[str] | None = None, jobs: int | None = None) -> "BuildOptions":
        if build_type not in BUILD_TYPES:
            raise BadInput(f"--type {build_type}: one of {', '.join(BUILD_TYPES)}")
        archs: list[str] = []
        for item in filter(None, re.split(r"[,;\s]+", arch or "")):
            m = _ARCH.match(item.strip())
            if not m:
                raise BadInput(f"--arch {item}: not a CUDA architecture (e.g. 90, 90a, 120)")
            archs.append(m.group(1))
        if archs and not cuda:
            raise BadInput("--arch needs --cuda")
        parsed = []
        for d in defines or []:
            m = _DEFINE.match(d)
            if not m:
                raise BadInput(f"-D {d}: expected KEY=VALUE")
            parsed.append((m.group(1), m.group(2)))
        if jobs is not None and jobs < 1:
            raise BadInput("--jobs must be at least 1")
        return BuildOptions(cuda, tuple(archs), tuple(targets) if targets else DEFAULT_TARGETS, build_type,
                            tuple(sorted(dict(parsed).items())), jobs)


# -- the K/V pairs for GGML_CUDA_FA_QUANTS -------------------------------------------------
def load_fa_pairs(gates_dir: Path) -> list[str]:
    """The declared K/V pairs (gates/build.yaml: cuda.fa_quants), each '<type_K>-<type_V>'."""
    path = gates_dir / BUILD_CONFIG
    where = str(path)
    try:
        top = schema.mapping(schema.load_yaml(path) or {}, where)
    except FileNotFoundError:
        raise BadInput(f"{path} is missing (it declares the FlashAttention K/V pairs)") from None
    cuda = schema.optional(top, "cuda", dict, where, {})
    pairs = schema.str_list(cuda, "fa_quants", where, section="cuda", required=True)
    out = []
    for pair in pairs:
        if not re.match(r"^[a-z0-9_]+-[a-z0-9_]+$", pair.strip().lower()):
            raise BadInput(f"{where}: 'cuda.fa_quants' entry {pair!r} is not <type_K>-<type_V>")
        out.append(pair.strip().lower())
    return list(dict.fromkeys(out))


def tree_fa_types(source_dir: Path) -> tuple[str, ...] | None:
    """The KV types the tree's ggml/cmake/common.cmake accepts in GGML_CUDA_FA_QUANTS."""
    try:
        text = (source_dir / "ggml" / "cmake" / "common.cmake").read_text()
    except FileNotFoundError:
        return None
    m = _FA_TYPES.search(text)
    return tuple(m.group(1).split()) if m else None


def fa_quants(pairs: list[str], types: tuple[str, ...] | None,
              pending: frozenset[str] = frozenset()) -> tuple[str, list[str]]:
    """GGML_CUDA_FA_QUANTS for the tree: (the value, the pairs left out).

    A pair whose types the tree does not know is left out only when those are types an
    unapplied patch of the chain brings (`pending`: the turbo types before 0073 is applied);
    any other is an error, never a silently dropped kernel. A tree whose common.cmake has no
    FA_TYPES list the way polyforge reads it fails too (upstream changed it: look again).
    Comma-separated: CMake accepts ',' and ';' alike and ',' survives the command line unquoted.
    """
    if types is None:
        raise VerificationFailed("ggml/cmake/common.cmake has no `set(FA_TYPES ...)` list: cannot tell which "
                                 "GGML_CUDA_FA_QUANTS pairs the tree builds",
                                 hint="upstream changed how it lists them: update builder._FA_TYPES, or pass "
                                      "-D GGML_CUDA_FA_QUANTS=...")
    unknown = {t for p in pairs for t in p.split("-") if t not in types}
    if unknown - pending:
        bad = [p for p in pairs if set(p.split("-")) & (unknown - pending)]
        raise BadInput(f"gates/{BUILD_CONFIG}: cuda.fa_quants {', '.join(bad)}: the tree's ggml/cmake/common.cmake "
                       f"does not know {', '.join(sorted(unknown - pending))}",
                       hint=f"the tree knows {' '.join(types)}")
    kept = [p for p in pairs if all(t in types for t in p.split("-"))]
    dropped = [p for p in pairs if p not in kept]
    return ",".join(kept or ["f16-f16"]), dropped


def ccache_env(project_root: Path, toolchain_info: dict) -> dict[str, str]:
    """Environment for ccache, or {} when it is not installed.

    ccache already hashes the preprocessed input and the flags, so a patch that changes
    one file misses only the objects that file reaches. Namespacing the cache by the whole
    key would throw that away (every patch change would miss everything), so the namespace
    is the toolchain alone: entries of different compilers never hit each other anyway,
    and the namespace lets one evict a retired toolchain's entries
    (ccache --evict-namespace). BASEDIR is the project root, the common ancestor of the
    source tree and every build directory, so both the source paths and the generated
    include paths under build/<key>/ become relative and identical across keys.
    """
    if toolchain.find_ccache() is None:
        return {}
    digest = sha256_bytes(json.dumps(toolchain_info, sort_keys=True).encode())[:12]
    return {"CCACHE_BASEDIR": str(project_root), "CCACHE_NAMESPACE": f"polyforge-{digest}"}


# -- the plan ------------------------------------------------------------------------------
@dataclass
class Plan:
    key: str
    build_dir: Path
    source_dir: Path
    inputs: dict
    cache_args: list[str]
    targets: list[str]
    jobs: int | None
    env: dict[str, str]
    live_tree: str
    notes: list[str] = field(default_factory=list)
    remote: remote_cache.RemoteCache | None = None  # the shared compiler cache, when ccache is used

    def as_dict(self) -> dict:
        return {"key": self.key, "build_dir": str(self.build_dir), "source_dir": str(self.source_dir),
                "inputs": self.inputs, "cache_args": self.cache_args, "targets": self.targets,
                "jobs": self.jobs, "env": self.env, "live_tree": self.live_tree, "notes": self.notes,
                "remote_cache": self.remote.as_dict() if self.remote else None,
                "configured": (self.build_dir / _CONFIGURED).is_file()}


def cpu_compile_flags(defines: dict[str, str], machine: str | None = None) -> str:
    """The C/C++ flags polyforge adds (X86_ISA_OFF on x86-64), unless the user sets the flags."""
    import platform
    if "CMAKE_C_FLAGS" in defines or "CMAKE_CXX_FLAGS" in defines:
        return ""
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return ""
    return " ".join(X86_ISA_OFF)


def chain_digest(applied: list[tuple[str, str]]) -> str:
    return sha256_bytes("".join(f"{name} {sha}\n" for name, sha in applied).encode())


def plan(chain: Chain, options: BuildOptions) -> Plan:
    """Everything the build will do, computed from the chain and options; runs nothing but
    version probes and a snapshot of the live tree. Holds the project lock meanwhile, so the
    applied chain and the live tree it records are one state, not a tree half moved."""
    with chain.exclusive():
        return _plan(chain, options)


def _plan(chain: Chain, options: BuildOptions) -> Plan:
    tree = chain.tree
    tree.require()
    project = chain.project
    source = tree.path
    applied = [(a.name, a.sha256) for a in tree.applied()]
    defines = dict(options.defines)
    tools = toolchain.describe(options.cuda, defines.get("CUDA_cublas_LIBRARY"))
    notes: list[str] = []
    cache_args = [f"-DCMAKE_BUILD_TYPE={options.build_type}", "-DBUILD_SHARED_LIBS=ON", *OFFLINE_ARGS, *RPATH_ARGS,
                  *UNITY_ARGS, f"-DCMAKE_C_COMPILER={tools['cc']}", f"-DCMAKE_CXX_COMPILER={tools['cxx']}"]
    option_inputs: dict = {"cuda": options.cuda, "build_type": options.build_type, "runpath": RUNPATH,
                           "unity_relocatable": True}
    if options.cuda:
        archs = list(options.archs)
        if not archs:
            archs = toolchain.local_gpu_archs()
            if not archs:
                raise EnvironmentProblem("--cuda: no GPU found to take the compute capability from",
                                         hint="pass --arch, e.g. --arch 90 for an H100/H200")
            notes.append(f"architectures from the local GPU: {','.join(archs)}")
        if "GGML_CUDA_FA_QUANTS" in defines:
            quants, dropped = defines.pop("GGML_CUDA_FA_QUANTS"), []
        else:
            # the chain's own KV types may be missing only while a patch is still unapplied
            pending = frozenset(CHAIN_BITS) if len(applied) < len(chain.patches()) else frozenset()
            quants, dropped = fa_quants(load_fa_pairs(project.gates_dir), tree_fa_types(source), pending)
        if dropped:
            notes.append(f"FA pairs of types an unapplied patch brings, left out: {', '.join(dropped)}")
        cache_args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}",
                       f"-DGGML_CUDA_FA_QUANTS={quants}", f"-DCMAKE_CUDA_COMPILER={tools['nvcc']}"]
        option_inputs.update(archs=archs, fa_quants=quants)
    else:
        cache_args.append("-DGGML_CUDA=OFF")
    cpu_flags = cpu_compile_flags(defines)
    if cpu_flags:
        cache_args += [f"-DCMAKE_{lang}_FLAGS={cpu_flags}" for lang in ("C", "CXX")]
        option_inputs["cpu_flags"] = cpu_flags
    env = ccache_env(project.root, tools)
    remote = remote_cache.configured(project.gates_dir / BUILD_CONFIG)
    if remote is not None and not env:
        notes.append(f"remote cache {remote.shown} unused: ccache is not installed")
        remote = None
    if env:
        launchers = ["C", "CXX"] + (["CUDA"] if options.cuda else [])
        cache_args.append("-DGGML_CCACHE=OFF")  # ggml's own launcher would bypass our env
        cache_args += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={toolchain.find_ccache()}" for lang in launchers]
    else:
        cache_args.append("-DGGML_CCACHE=OFF")
        notes.append("ccache not installed: every fresh key compiles from scratch")
    cache_args += [f"-D{k}={v}" for k, v in sorted(defines.items())]
    option_inputs["defines"] = dict(sorted(defines.items()))
    inputs = {
        "baseline_tree": tree.baseline_tree(),
        "chain": [{"name": n, "sha256": s} for n, s in applied],
        "chain_digest": chain_digest(applied),
        "options": option_inputs,
        "toolchain": tools,
    }
    keyed = {k: inputs[k] for k in ("baseline_tree", "chain_digest", "options", "toolchain")}
    key = ("cuda-" if options.cuda else "cpu-") + sha256_bytes(json.dumps(keyed, sort_keys=True).encode())[:12]
    return Plan(key, project.build_root / key, source, inputs, cache_args, list(options.targets),
                options.jobs, env, tree.snapshot(), notes, remote)


# -- the manifest --------------------------------------------------------------------------
@dataclass
class Artifact:
    """A shared library or executable under build/<key>/bin/."""
    name: str
    path: str  # relative to the build directory
    kind: str  # "library" or "binary"
    size: int
    sha256: str
    links: list[str]  # the symlinks to it in bin/ (libllama.so, libllama.so.0)
    mtime_ns: int  # with size: an unchanged file keeps its hash without rehashing

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(data: dict) -> "Artifact":
        return Artifact(data["name"], data["path"], data["kind"], data["size"], data["sha256"],
                        list(data.get("links", [])), data.get("mtime_ns", 0))


@dataclass
class Manifest:
    """build/<key>/manifest.json: what a finished build was built from and what it made."""
    key: str
    build_dir: Path
    inputs: dict  # what the key digests: baseline_tree, chain [{name, sha256}], chain_digest, options, toolchain
    cache_args: list[str]
    live_tree: str | None  # the tree built, live edits included
    targets: list[str]  # every target built in this directory so far
    built_at: str | None
    log: str | None
    configure_log: str | None
    artifacts: list[Artifact]

    @property
    def cuda(self) -> bool:
        return bool((self.inputs.get("options") or {}).get("cuda"))

    def binary(self, name: str) -> Path:
        """bin/NAME of this build, or a clear error when it was not built."""
        path = self.build_dir / "bin" / name
        if not path.is_file():
            raise BadInput(f"build {self.key} has no {name}", hint=f"polyforge build --target {name}")
        return path

    def as_dict(self) -> dict:
        return {"key": self.key, "build_dir": str(self.build_dir), "inputs": self.inputs,
                "cache_args": self.cache_args, "live_tree": self.live_tree, "targets": self.targets,
                "built_at": self.built_at, "log": self.log, "configure_log": self.configure_log,
                "artifacts": [a.as_dict() for a in self.artifacts]}

    @staticmethod
    def from_dict(data: dict) -> "Manifest":
        return Manifest(data["key"], Path(data["build_dir"]), data.get("inputs") or {}, list(data.get("cache_args", [])),
                        data.get("live_tree"), list(data.get("targets", [])), data.get("built_at"), data.get("log"),
                        data.get("configure_log"), [Artifact.from_dict(a) for a in data.get("artifacts", [])])


def read_manifest(build_dir: Path) -> Manifest | None:
    """The build's manifest; None for a build that never finished (or a manifest that is not one)."""
    try:
        return Manifest.from_dict(json.loads((build_dir / MANIFEST).read_text()))
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None


# -- running it ----------------------------------------------------------------------------
@dataclass
class BuildResult:
    plan: Plan
    manifest: Manifest
    configured: bool
    seconds: float
    cache: remote_cache.CacheStats | None = None  # None: built without ccache
    warnings: list[str] = field(default_factory=list)


def build(chain: Chain, options: BuildOptions, *, on_plan: Callable[[Plan], None] | None = None,
          on_progress: Callable[[int, int, str], None] | None = None,
          on_warning: Callable[[str], None] | None = None) -> BuildResult:
    """Plan (under the project lock), then run: what build, gate, bench and up all do."""
    planned = plan(chain, options)
    if on_plan is not None:
        on_plan(planned)
    return run(planned, on_progress=on_progress, on_warning=on_warning)


def compiler_cache_env(plan_: Plan, stats_log: Path) -> tuple[dict[str, str], remote_cache.RemoteCache | None, list[str]]:
    """The build step's environment: the plan's ccache settings, the stats log and the remote
    cache when its probe passes. Returns (env, the remote used, warnings): a remote that does not
    answer is left out with one warning, and the build goes on with the local cache."""
    env = dict(plan_.env)
    if not env:
        return env, None, []
    env["CCACHE_STATSLOG"] = str(stats_log)
    remote = plan_.remote
    if remote is None:
        return env, None, []
    why = remote_cache.probe(remote)
    if why is not None:
        return env, None, [f"remote cache {remote.shown}: {why}; building with the local cache alone"]
    env["CCACHE_REMOTE_STORAGE"] = remote.ccache_url()
    return env, remote, []


def _artifacts(bin_dir: Path, previous: dict[str, Artifact]) -> list[Artifact]:
    """Every shared library and executable under bin/, with sha256 and size (a file whose
    size and mtime match the previous manifest keeps its hash: no-op rebuilds stay fast)."""
    found: list[Artifact] = []
    if not bin_dir.is_dir():
        return found
    links: dict[str, list[str]] = {}  # libllama.so -> libllama.so.0 -> libllama.so.0.5.0
    for path in sorted(bin_dir.iterdir()):
        if path.is_symlink() and path.resolve().parent == bin_dir.resolve():
            links.setdefault(path.resolve().name, []).append(path.name)
    for path in sorted(bin_dir.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        is_lib = ".so" in path.name or path.suffix in (".dylib", ".dll")
        if not is_lib and not os.access(path, os.X_OK):
            continue
        st = path.stat()
        old = previous.get(path.name)
        if old and old.size == st.st_size and old.mtime_ns == st.st_mtime_ns:
            digest = old.sha256
        else:
            digest = sha256_file(path)
        found.append(Artifact(path.name, str(path.relative_to(bin_dir.parent)), "library" if is_lib else "binary",
                              st.st_size, digest, sorted(links.get(path.name, [])), st.st_mtime_ns))
    return found


def run(plan_: Plan, *, on_line: Callable[[str], None] | None = None,
        on_progress: Callable[[int, int, str], None] | None = None,
        on_warning: Callable[[str], None] | None = None) -> BuildResult:
    """Configure if this key has no CMake cache yet, then build the targets with ninja."""
    started = time.monotonic()
    build_dir = plan_.build_dir
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / LOG
    with FileLock(build_dir / ".lock", f"build {plan_.key}"):
        configured = False
        if not (build_dir / _CONFIGURED).is_file() or not (build_dir / "build.ninja").is_file():
            configure_log = build_dir / CONFIGURE_LOG
            configure_log.write_text("")
            (build_dir / "CMakeCache.txt").unlink(missing_ok=True)  # a half-configured cache is not reused
            status = cmake.configure(plan_.source_dir, build_dir, plan_.cache_args, log_path=configure_log,
                                     env=plan_.env, on_line=on_line)
            if status != 0:
                _fail("cmake configure failed", configure_log)
            (build_dir / _CONFIGURED).write_text(json.dumps(plan_.cache_args) + "\n")
            configured = True
        known = cmake.known_targets(build_dir, env=plan_.env)
        unknown = [t for t in plan_.targets if t not in known]
        if unknown:
            raise BadInput(f"unknown build target(s): {', '.join(unknown)}",
                           hint="polyforge build --print-plan shows the defaults; ninja -C BUILD_DIR -t targets lists all")
        progress = cmake.Progress(on_progress)

        def line_seen(line: str) -> None:
            progress(line)
            if on_line is not None:
                on_line(line)

        log.write_text("")
        stats_log = build_dir / CCACHE_STATS_LOG
        stats_log.write_text("")
        env, remote, warnings = compiler_cache_env(plan_, stats_log)
        for warning in warnings:
            if on_warning is not None:
                on_warning(warning)
        status = cmake.build(build_dir, plan_.targets, jobs=plan_.jobs, log_path=log, env=env,
                             on_line=line_seen)
        if status != 0:
            _fail("build failed", log)
        old = read_manifest(build_dir)
        previous = {a.name: a for a in old.artifacts} if old else {}
        manifest = Manifest(
            key=plan_.key, build_dir=build_dir, inputs=plan_.inputs, cache_args=plan_.cache_args,
            live_tree=plan_.live_tree, targets=sorted(set(old.targets if old else []) | set(plan_.targets)),
            built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), log=str(log),
            configure_log=str(build_dir / CONFIGURE_LOG), artifacts=_artifacts(build_dir / "bin", previous))
        write_text_atomic(build_dir / MANIFEST, json.dumps(manifest.as_dict(), indent=2) + "\n")
    cache = remote_cache.read_stats_log(stats_log, remote) if plan_.env else None
    return BuildResult(plan_, manifest, configured, time.monotonic() - started, cache, warnings)


def _fail(what: str, log: Path) -> None:
    first = cmake.first_error(log.read_text(errors="replace"))
    detail = f": {first}" if first else ""
    raise BuildFailed(f"{what}{detail} (full log: {log})")


def list_builds(build_root: Path) -> list[dict]:
    rows = []
    if not build_root.is_dir():
        return rows
    for folder in sorted(build_root.iterdir()):
        if not folder.is_dir():
            continue
        manifest = read_manifest(folder)
        if manifest is None:
            state = "configured, not built" if (folder / _CONFIGURED).is_file() else "incomplete"
            rows.append({"key": folder.name, "state": state, "build_dir": str(folder)})
            continue
        inputs = manifest.inputs
        rows.append({"key": manifest.key, "state": "built", "build_dir": str(folder),
                     "built_at": manifest.built_at, "options": inputs.get("options"),
                     "chain": [c["name"] for c in inputs.get("chain", [])],
                     "baseline_tree": inputs.get("baseline_tree"), "live_tree": manifest.live_tree,
                     "artifacts": len(manifest.artifacts)})
    return rows


def find_build(build_root: Path, key: str) -> Manifest:
    """The manifest of a finished build by key (or unique key prefix)."""
    matches = [f for f in build_root.iterdir() if f.is_dir() and f.name.startswith(key)] if build_root.is_dir() else []
    if len(matches) != 1:
        raise BadInput(f"--build {key}: " + ("no such build" if not matches else "ambiguous key"),
                       hint="polyforge build --list shows the builds")
    manifest = read_manifest(matches[0])
    if manifest is None:
        raise BadInput(f"--build {key}: that build never finished", hint="run polyforge build again")
    return manifest
