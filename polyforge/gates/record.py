"""A gate's verdict kept with its build, next to a digest of what it was judged from.

build/KEY/gates/NAME/verdict.json holds the last verdict of gate NAME on that build and the
inputs it depended on:
  - the build: its key, its live tree id, the sha256 of each binary the gate ran (those it
    asked its context for: build.targets, {bin:NAME}) and of every shared library in bin/ (a
    binary built later for another gate does not count);
  - the gate definitions and programs: every file under gates/ (thresholds live there), and
    each file or folder its params name as {root}/PATH (a script, the vendored gguf-py);
  - polyforge's own code (the gate kinds compute the metrics), and the versions of the
    distributions the gate programs import;
  - the models' sha256;
  - the environment the commands see that can change a result (the gate's env, LLAMA_*,
    GGML_*, CUDA_*, OMP_*), the Python and the platform.
A passing verdict whose inputs are all unchanged is reused instead of running the gate again,
the gates' counterpart of a build directory keyed by its inputs: `polyforge up` run twice, or
the tests after the main command, judge each gate once. A failed verdict is never reused;
`--rerun` runs a gate whatever is recorded.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import polyforge
from ..hashing import sha256_bytes, sha256_file, sha256_files
from ..textfile import write_text_atomic
from . import GATE_MODULES, distribution_version
from .runner import Gate, Verdict

RECORD = "verdict.json"
ENV_PREFIXES = ("LLAMA_", "GGML_", "CUDA_", "OMP_")
_ROOT_PATH = re.compile(r"\{root\}/([^\s{}]+)")


def binaries(build_dir: Path, names) -> dict[str, str | None]:
    """sha256 of bin/NAME for each name (None: not there)."""
    out: dict[str, str | None] = {}
    for name in sorted(names):
        path = build_dir / "bin" / name
        out[name] = sha256_file(path) if path.is_file() else None
    return out


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _referenced(gate: Gate, project_root: Path) -> dict[str, str | None]:
    """{root}/PATH in the gate's params: each path's digest (None: not there)."""
    out: dict[str, str | None] = {}
    for text in _strings(gate.params):
        for rel in _ROOT_PATH.findall(text):
            path = project_root / rel
            out[rel] = (sha256_files(path) if path.is_dir() else sha256_file(path) if path.is_file() else None)
    return dict(sorted(out.items()))


def gate_inputs(gate: Gate, *, project_root: Path, gates_dir: Path, build_dir: Path, build_key: str,
                live_tree: str | None, models: dict[str, str], env: dict[str, str]) -> dict:
    """What the gate's verdict on this build depends on (models: name -> sha256)."""
    seen_env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    seen_env.update(env)
    return {
        "gate": gate.name,
        "build": build_key,
        "live_tree": live_tree,
        "libraries": sha256_files(build_dir / "bin", "*.so*"),
        "gates": sha256_files(gates_dir),
        "referenced": _referenced(gate, project_root),
        "polyforge": sha256_files(Path(polyforge.__file__).parent, "*.py"),
        "distributions": {dist: distribution_version(dist) for dist in sorted(set(GATE_MODULES.values()))},
        "models": dict(sorted(models.items())),
        "env": dict(sorted(seen_env.items())),
        "python": sys.version,
        "platform": platform.platform(),
    }


def inputs_digest(inputs: dict) -> str:
    return sha256_bytes(json.dumps(inputs, sort_keys=True).encode())


def load_passing(work_dir: Path, inputs: dict, build_dir: Path) -> Verdict | None:
    """The recorded verdict when it passed, its inputs equal these and the binaries it ran are the
    same files; else None (a record that cannot be read is as good as none: the gate runs)."""
    try:
        data = json.loads((work_dir / RECORD).read_text(encoding="utf-8"))
        if data.get("inputs_digest") != inputs_digest(inputs) or data["verdict"].get("ok") is not True:
            return None
        ran = data["binaries"]
        if not isinstance(ran, dict) or binaries(build_dir, ran) != ran:
            return None
        return Verdict.from_dict(data["verdict"], reused_from=str(data["recorded_at"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def save(work_dir: Path, inputs: dict, verdict: Verdict, ran: dict[str, str | None]) -> None:
    """Record the verdict and the binaries it ran (passing or not: a failure replaces an older pass)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    record = {"recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "inputs_digest": inputs_digest(inputs),
              "inputs": inputs, "binaries": ran, "verdict": verdict.as_dict()}
    write_text_atomic(work_dir / RECORD, json.dumps(record, indent=1) + "\n")
