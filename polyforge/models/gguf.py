"""A GGUF file's header without a dependency on gguf-py: its key/value metadata (the shape facts
polyforge needs: layers, heads, head sizes) and where each tensor's data lies.

Arrays are read as lists up to MAX_ARRAY elements (per-layer values); longer ones (the tokenizer's)
are skipped and recorded as their length.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from polyforge.errors import BadInput

MAX_ARRAY = 1024
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, f: BinaryIO, path: Path):
        self.f, self.path = f, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise BadInput(f"{self.path}: truncated GGUF header")
        return struct.unpack(fmt, data)[0]

    def string(self) -> str:
        n = self.take("<Q")
        data = self.f.read(n)
        if len(data) != n:
            raise BadInput(f"{self.path}: truncated GGUF header")
        return data.decode("utf-8", errors="replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype, n = self.take("<I"), self.take("<Q")
            if n > MAX_ARRAY:
                for _ in range(n):
                    self.skip(etype)
                return n
            return [self.value(etype) for _ in range(n)]
        raise BadInput(f"{self.path}: unknown GGUF value type {vtype}")

    def skip(self, vtype: int) -> None:
        if vtype in _SCALARS:
            self.f.seek(struct.calcsize(_SCALARS[vtype]), 1)
        elif vtype == _STRING:
            self.f.seek(self.take("<Q"), 1)
        else:
            self.value(vtype)


def _read_header(path: Path, with_tensors: bool) -> tuple[dict, dict]:
    """(metadata, tensors): tensors maps a name to (ggml type, dims, absolute byte offset), empty
    unless with_tensors; a clear error for a file that is not GGUF."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise BadInput(f"{path}: not a GGUF file")
            r = _Reader(f, path)
            version = r.take("<I")
            if version < 2:
                raise BadInput(f"{path}: GGUF version {version} is not supported")
            n_tensors = r.take("<Q")
            n_kv = r.take("<Q")
            meta = {}
            for _ in range(n_kv):
                key = r.string()
                meta[key] = r.value(r.take("<I"))
            if not with_tensors:
                return meta, {}
            infos = {}
            for _ in range(n_tensors):
                name = r.string()
                dims = [r.take("<Q") for _ in range(r.take("<I"))]
                infos[name] = (r.take("<I"), dims, r.take("<Q"))
            align = int(meta.get("general.alignment", 32))
            data_start = -(-f.tell() // align) * align
            return meta, {name: (t, dims, data_start + off) for name, (t, dims, off) in infos.items()}
    except OSError as exc:
        raise BadInput(f"{path}: {exc.strerror or exc}") from None


def read_metadata(path: Path) -> dict:
    """The file's metadata keys and values; a clear error for a file that is not GGUF."""
    return _read_header(path, with_tensors=False)[0]


def read_tensors(path: Path) -> dict[str, tuple[int, list[int], int]]:
    """Each tensor's (ggml type, dims, absolute byte offset of its data in the file)."""
    return _read_header(path, with_tensors=True)[1]
