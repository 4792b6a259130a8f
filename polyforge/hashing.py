"""The one hashing routine: sha256 over bytes, a file (streamed), or the files of a folder."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


# Not tree_identity's rule: this hashes a gate record's inputs (gate programs, built libraries,
# polyforge's own sources), where a build/ folder is no build output to skip; only bytecode is
# noise in all of them.
_SKIPPED_DIRS = ("__pycache__",)


def sha256_files(root: Path, pattern: str = "*") -> str:
    """sha256 over the relative path and sha256 of every regular file under root matching pattern
    (symlinks are skipped: what they point at is listed by its own name; so is bytecode)."""
    lines = []
    for path in sorted(root.rglob(pattern)):
        if path.is_symlink() or not path.is_file() or any(p in _SKIPPED_DIRS for p in path.parts):
            continue
        lines.append(f"{path.relative_to(root).as_posix()}\0{sha256_file(path)}\n")
    return sha256_bytes("".join(lines).encode())
