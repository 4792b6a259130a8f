#!/usr/bin/env python3
"""Copy a GGUF with edits, through gguf-py: the fork-format and bad-input MTP fixtures.

As a library: rewrite(gguf, src, dst, arch=..., kv=..., drop_kv=..., rename_kv=..., tensors=...,
rename_tensors=...). As a script it writes a gemma4-assistant file the way the
atomic-llama-cpp-turboquant converter does (arch `gemma4_assistant`, key
`gemma4_assistant.n_embd_backbone` instead of `embedding_length_out`, no
`nextn_predict_layers`, tensors `mtp.pre_projection.weight`, `mtp.post_projection.weight`,
`mtp.centroids.weight`, `mtp.token_ordering.weight`), which 0074 loads:

    python gates/mtp/gguf_rewrite.py --gguf-py vendor/llama.cpp/gguf-py fork IN.gguf OUT.gguf
"""

import argparse
import sys

FORK_ARCH = "gemma4_assistant"
FORK_TENSORS = {
    "nextn.pre_projection.weight": "mtp.pre_projection.weight",
    "nextn.post_projection.weight": "mtp.post_projection.weight",
    "masked_embd_centroids.weight": "mtp.centroids.weight",
    "masked_embd_ordering": "mtp.token_ordering.weight",
}


def rewrite(gguf, src, dst, arch=None, kv=None, drop_kv=(), rename_kv=None, tensors=None, rename_tensors=None):
    """Copy src to dst: arch renames general.architecture and the keys under its prefix, kv sets
    {key: (value, GGUFValueType)}, tensors replaces data {name: array}, the renames map old to new."""
    import numpy as np

    reader = gguf.GGUFReader(src)
    old_arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    new_arch = arch or old_arch
    writer = gguf.GGUFWriter(dst, new_arch)
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_kv:
            continue
        if name.startswith(old_arch + "."):
            name = new_arch + name[len(old_arch):]
        name = (rename_kv or {}).get(name, name)
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), vtype)
    for key, (value, vtype) in (kv or {}).items():
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        name = (rename_tensors or {}).get(t.name, t.name)
        if t.name in (tensors or {}):
            writer.add_tensor(name, np.ascontiguousarray(tensors[t.name]))
        else:
            writer.add_tensor(name, np.array(t.data), raw_shape=[int(x) for x in reversed(t.shape)],
                              raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def to_fork_format(gguf, src, dst):
    reader = gguf.GGUFReader(src)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    backbone = int(reader.fields[f"{arch}.embedding_length_out"].contents())
    rewrite(gguf, src, dst, arch=FORK_ARCH,
            drop_kv=(f"{arch}.embedding_length_out", f"{arch}.nextn_predict_layers"),
            kv={f"{FORK_ARCH}.n_embd_backbone": (backbone, gguf.GGUFValueType.UINT32)},
            rename_tensors=FORK_TENSORS)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-py", required=True, help="gguf-py folder of the vendored tree")
    sub = ap.add_subparsers(dest="cmd", required=True)
    fork = sub.add_parser("fork", help="write a gemma4-assistant GGUF in the fork's format")
    fork.add_argument("src")
    fork.add_argument("dst")
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf

    to_fork_format(gguf, args.src, args.dst)


if __name__ == "__main__":
    main()
