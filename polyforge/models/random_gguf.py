"""Write a random-weight llama-architecture GGUF of a given shape (models `random:SHAPE`).

For speed work where the weights' values do not matter (the GPU machine has no network):
llama.cpp loads it like any model, llama-bench and llama-perplexity run on it. The vocab is
a small SentencePiece-style one with byte fallback, so any text tokenizes.

  polyforge models fetch random:tiny
  python -m polyforge.models.random_gguf --shape small,n_layer=2 --gguf-py vendor/llama.cpp/gguf-py --out m.gguf

polyforge.models.registry runs it as a child process: gguf-py is put on sys.path from the vendored
tree, which must not leak into polyforge's own process. parse_shape needs neither gguf nor numpy.

Shape keys: n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx, type (f32|f16|q8_0),
seed; a preset name (tiny, small, 1b, 8b) may come first: "small,n_layer=2".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PRESETS = {
    "tiny": dict(n_layer=2, n_embd=256, n_head=2, n_head_kv=1, n_ff=512, n_vocab=512, n_ctx=4096),
    "small": dict(n_layer=4, n_embd=512, n_head=4, n_head_kv=2, n_ff=1408, n_vocab=2048, n_ctx=8192),
    # head dim 128 and GQA like the common 1B/8B models, for attention and KV-cache work
    "1b": dict(n_layer=16, n_embd=2048, n_head=16, n_head_kv=4, n_ff=5632, n_vocab=8192, n_ctx=32768),
    "8b": dict(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=8192, n_ctx=32768),
}
INT_KEYS = ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_vocab", "n_ctx", "seed")
TYPES = ("f32", "f16", "q8_0")


def parse_shape(text: str) -> dict:
    shape: dict = {"type": "f16", "seed": 0}
    for i, item in enumerate(p.strip() for p in text.split(",") if p.strip()):
        if "=" not in item:
            if i != 0 or item not in PRESETS:
                raise ValueError(f"unknown preset {item!r} (presets: {', '.join(PRESETS)}; it must come first)")
            shape.update(PRESETS[item])
            continue
        key, value = (s.strip() for s in item.split("=", 1))
        if key in INT_KEYS:
            try:
                shape[key] = int(value)
            except ValueError:
                raise ValueError(f"{key}={value}: not an integer") from None
        elif key == "type":
            if value not in TYPES:
                raise ValueError(f"type={value}: one of {', '.join(TYPES)}")
            shape[key] = value
        else:
            raise ValueError(f"unknown shape key {key!r} (keys: {', '.join(INT_KEYS)}, type)")
    missing = [k for k in INT_KEYS if k not in shape]
    if missing:
        raise ValueError(f"shape lacks {', '.join(missing)} (or start with a preset: {', '.join(PRESETS)})")
    if shape["n_embd"] % shape["n_head"] or shape["n_head"] % shape["n_head_kv"]:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    if shape["n_vocab"] < 300:
        raise ValueError("n_vocab must be at least 300 (259 special and byte tokens come first)")
    if shape["type"] == "q8_0" and (shape["n_embd"] % 32 or shape["n_ff"] % 32):
        raise ValueError("type=q8_0 needs n_embd and n_ff divisible by 32")
    return shape


def write(shape: dict, out: Path) -> None:
    import numpy as np
    import gguf

    rng = np.random.default_rng(shape["seed"])
    n_embd, n_head, n_kv, n_ff, n_vocab = (shape[k] for k in ("n_embd", "n_head", "n_head_kv", "n_ff", "n_vocab"))
    head_dim = n_embd // n_head
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(f"random {','.join(f'{k}={shape[k]}' for k in INT_KEYS)},type={shape['type']}")
    writer.add_context_length(shape["n_ctx"])
    writer.add_embedding_length(n_embd)
    writer.add_block_count(shape["n_layer"])
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[shape["type"]]
    writer.add_file_type(file_type)

    # vocab: <unk> <s> </s>, 256 byte tokens, then made-up pieces
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    while len(tokens) < n_vocab:
        i = len(tokens)
        piece = "\u2581" + letters[i % 26] + letters[(i // 26) % 26] + (letters[(i // 676) % 26] if i >= 676 else "")
        tokens.append(piece if piece not in tokens[259:] else piece + str(i))
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + \
        [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (n_vocab - 259)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(n_vocab - 259)])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def weight(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)
        if shape["type"] == "f32":
            writer.add_tensor(name, data)
        elif shape["type"] == "f16":
            writer.add_tensor(name, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(n_embd, dtype=np.float32))

    weight("token_embd.weight", n_vocab, n_embd)
    norm("output_norm.weight")
    weight("output.weight", n_vocab, n_embd)
    for i in range(shape["n_layer"]):
        norm(f"blk.{i}.attn_norm.weight")
        weight(f"blk.{i}.attn_q.weight", n_head * head_dim, n_embd)
        weight(f"blk.{i}.attn_k.weight", n_kv * head_dim, n_embd)
        weight(f"blk.{i}.attn_v.weight", n_kv * head_dim, n_embd)
        weight(f"blk.{i}.attn_output.weight", n_embd, n_head * head_dim)
        norm(f"blk.{i}.ffn_norm.weight")
        weight(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        weight(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        weight(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, help="preset and/or key=value list")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--gguf-py", type=Path, help="gguf-py folder (the vendored tree's)")
    args = parser.parse_args(argv)
    try:
        shape = parse_shape(args.shape)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.gguf_py is not None:
        sys.path.insert(0, str(args.gguf_py))
    try:
        import gguf  # noqa: F401
    except ImportError as exc:  # gguf-py itself, or one of its dependencies (numpy)
        print(f"error: cannot import gguf-py ({exc}); pass --gguf-py VENDOR/llama.cpp/gguf-py", file=sys.stderr)
        return 3
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write(shape, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
