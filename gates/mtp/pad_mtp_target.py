#!/usr/bin/env python3
"""Make a slow twin of the MTP fixture target for the decode-speed measurement.

The trained target (gates/mtp/data/target.gguf) is so small that a decode step is pure
overhead, so the draft head costs as much as the target and MTP can only lose time. This widens
every FFN from n_ff to --n-ff with zero rows/columns: the extra units get gate = up = 0 and a zero
ffn_down column, so they add exact zeros and the model computes the same function, but each
token now reads --n-ff * n_embd * 3 weights per layer (memory-bound, like a real target). The
assistant drafts for it unchanged. Not committed: made at gate time in a second or two.

    python gates/mtp/pad_mtp_target.py --gguf-py vendor/llama.cpp/gguf-py IN.gguf OUT.gguf --n-ff 16384
"""

import argparse
import sys

from gguf_rewrite import rewrite


def pad_target(gguf, src, dst, n_ff, dtype="float32"):
    """Write src with every FFN widened to n_ff by zero rows/columns (the same function)."""
    import numpy as np

    reader = gguf.GGUFReader(src)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    ff_key = f"{arch}.feed_forward_length"
    tensors = {}
    for t in reader.tensors:
        a = np.array(t.data)
        if t.name.endswith((".ffn_gate.weight", ".ffn_up.weight")):      # numpy [n_ff, n_embd]
            b = np.zeros((n_ff, a.shape[1]), dtype=dtype)
            b[: a.shape[0]] = a
            tensors[t.name] = b
        elif t.name.endswith(".ffn_down.weight"):                         # numpy [n_embd, n_ff]
            b = np.zeros((a.shape[0], n_ff), dtype=dtype)
            b[:, : a.shape[1]] = a
            tensors[t.name] = b
    rewrite(gguf, src, dst, drop_kv=(ff_key,), kv={ff_key: (n_ff, gguf.GGUFValueType.UINT32)}, tensors=tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf-py", required=True)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--n-ff", type=int, default=16384)
    ap.add_argument("--f16", action="store_true", help="store the padded FFN matrices as F16")
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf

    pad_target(gguf, args.src, args.dst, args.n_ff, "float16" if args.f16 else "float32")


if __name__ == "__main__":
    main()
