"""Gates: declared in gates/*.yaml, loaded, run and judged by polyforge.gates.runner; what
runs one is its kind, registered in polyforge.gates.kinds (whose docstring says how to add one)."""

from __future__ import annotations

from importlib import metadata

# The third-party modules the gate programs import (gates/*/gate_*.py, what they import, and
# the vendored gguf-py they load), each with the distribution that provides it. `polyforge
# up` runs those programs, so each distribution is a base dependency in pyproject.toml
# (tests/gates/test_runner.py checks both directions), and `polyforge doctor` reports each module.
GATE_MODULES: dict[str, str] = {
    "numpy": "numpy",
    "yaml": "pyyaml",
}

# Modules the gate programs take from the vendored tree (--gguf-py {root}/vendor/llama.cpp/gguf-py),
# not from the environment.
VENDORED_MODULES: tuple[str, ...] = ("gguf",)


def distribution_version(dist: str) -> str | None:
    """The installed version of a distribution (None: not installed, e.g. importable from a folder)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
