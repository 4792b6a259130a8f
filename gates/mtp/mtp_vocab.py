"""The byte-level vocabulary of the MTP test models, and its GGUF tokenizer keys (no torch).

Shared by gates/mtp/mtp_fixture_model.py (the trained fixture, 288 ids) and
scripts/bench_mtp_head.py (random E2B-shaped models, 262144 ids). Ids: 0 <pad>, 1 <eos>, 2 <bos>,
3 <unk>, 4..259 <0x00>..<0xFF>, 260 U+2581 (space), then <unusedN> up to n_vocab. Under
llama.cpp's 'gemma4' BPE tokenizer every character but ' ' falls back to its UTF-8 byte tokens.
"""

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
BYTE0 = 4
SPACE_ID = 260
SPACE_PIECE = "\u2581"

# gguf.TokenType
NORMAL, UNKNOWN, CONTROL, UNUSED, BYTE = 1, 2, 3, 5, 6


def vocab_tokens(n_vocab):
    """(text, score, toktype) for every id."""
    out = [("<pad>", 0.0, CONTROL), ("<eos>", 0.0, CONTROL), ("<bos>", 0.0, CONTROL), ("<unk>", 0.0, UNKNOWN)]
    out += [(f"<0x{b:02X}>", 0.0, BYTE) for b in range(256)]
    out += [(SPACE_PIECE, 0.0, NORMAL)]
    out += [(f"<unused{i}>", 0.0, UNUSED) for i in range(n_vocab - len(out))]
    return out


def encode(text: str) -> list[int]:
    """The ids llama.cpp's tokenizer yields for this vocab: ' ' -> U+2581, else UTF-8 bytes."""
    ids = []
    for ch in text:
        if ch == " ":
            ids.append(SPACE_ID)
        else:
            ids.extend(BYTE0 + b for b in ch.encode("utf-8"))
    return ids


def decode(ids) -> str:
    bs = bytearray()
    for i in ids:
        if i == SPACE_ID:
            bs += b" "
        elif BYTE0 <= i < BYTE0 + 256:
            bs.append(i - BYTE0)
    return bs.decode("utf-8", errors="replace")


def add_vocab(w, n_vocab):
    """The tokenizer keys of a GGUFWriter."""
    toks = vocab_tokens(n_vocab)
    w.add_tokenizer_model("gemma4")
    w.add_token_list([t for t, _, _ in toks])
    w.add_token_scores([s for _, s, _ in toks])
    w.add_token_types([ty for _, _, ty in toks])
    # 'gemma4' is BPE: llama.cpp requires a merges array. One merge that never
    # applies (our pieces are single chars) keeps the vocabulary purely byte-level.
    w.add_token_merges(["<0x00> <0x00>"])
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_add_space_prefix(False)
    w.add_add_bos_token(True)


def write_file(w):
    """Header, KV data and tensors of a GGUFWriter, then close it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
