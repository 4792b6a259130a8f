"""polyforge/models/gguf.py: where each tensor's data lies, on a GGUF written byte by byte here."""

from __future__ import annotations

import struct

from polyforge.models.gguf import read_metadata, read_tensors


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf(path, tensors: dict, alignment: int) -> None:
    """GGUF v3: one metadata key (general.alignment), f32 tensors laid out at aligned offsets."""
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1)
    header += _string("general.alignment") + struct.pack("<II", 4, alignment)
    data, infos = b"", b""
    for name, values in tensors.items():
        data += b"\0" * (-len(data) % alignment)
        infos += _string(name) + struct.pack("<I", 1) + struct.pack("<Q", len(values))
        infos += struct.pack("<IQ", 0, len(data))
        data += struct.pack(f"<{len(values)}f", *values)
    head = header + infos
    path.write_bytes(head + b"\0" * (-len(head) % alignment) + data)


def test_tensor_offsets_point_at_their_data(tmp_path):
    path = tmp_path / "t.gguf"
    tensors = {"blk.0.attn_q_norm.weight": [1.0, 2.0, 3.0], "blk.0.attn_k_norm.weight": [4.0, 5.0, 6.0, 7.0, 8.0]}
    _gguf(path, tensors, alignment=64)
    infos = read_tensors(path)
    assert set(infos) == set(tensors)
    raw = path.read_bytes()
    for name, values in tensors.items():
        ggml_type, dims, offset = infos[name]
        assert ggml_type == 0 and dims == [len(values)] and offset % 64 == 0
        assert list(struct.unpack_from(f"<{len(values)}f", raw, offset)) == values
    assert read_metadata(path) == {"general.alignment": 64}
