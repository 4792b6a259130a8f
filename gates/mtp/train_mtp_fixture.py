#!/usr/bin/env python3
"""Train the tiny Gemma-4 target + Gemma-4 assistant (MTP) fixture and export GGUFs.

Deterministic (fixed seeds, torch deterministic algorithms, fixed thread count).
Needs torch (CPU) and numpy; gguf-py is taken from vendor/llama.cpp/gguf-py.

    python gates/mtp/train_mtp_fixture.py --out gates/mtp/data --work /tmp/mtp-work

Writes into --out:
    target.gguf                  gemma4 target (byte-level 'gemma4' BPE vocab, F32)
    assistant.gguf               gemma4-assistant, dense LM head (upstream converter metadata)
    assistant-centroid.gguf      same weights + masked_embd_centroids / masked_embd_ordering
    corpus.txt                   the training text (first chars of gates/data/llama-docs.txt)
    reference.json               prompts, PyTorch logits/greedy continuations, simulated acceptance
    MANIFEST.json                shapes, hyper-parameters, sha256 of every file
See gates/mtp/README.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "vendor" / "llama.cpp" / "gguf-py"))

import gguf  # noqa: E402
from mtp_fixture_model import (  # noqa: E402
    N_VOCAB, TargetCfg, AssistantCfg, Target, Assistant, causal_masks, cfg_dict,
)
from mtp_vocab import BOS_ID, add_vocab, decode, encode, write_file  # noqa: E402

CORPUS = ROOT / "gates" / "data" / "llama-docs.txt"


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def set_determinism(seed, threads):
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)


def load_corpus(n_chars):
    text = CORPUS.read_text(encoding="utf-8")[:n_chars]
    text = text[: text.rfind("\n") + 1]
    assert "\u2581" not in text
    return text


def lr_at(step, total, peak, warm=50):
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def batch_windows(toks, gen, B, T):
    """B windows of BOS + T-1 corpus tokens starting at random offsets."""
    n = len(toks)
    offs = torch.randint(0, n - (T - 1), (B,), generator=gen)
    rows = [torch.cat([torch.tensor([BOS_ID]), toks[o: o + T - 1]]) for o in offs.tolist()]
    return torch.stack(rows)


# ------------------------------------------------------------------ training ----
def train_target(tgt, toks, args):
    gen = torch.Generator().manual_seed(args.seed + 1)
    opt = torch.optim.AdamW(tgt.parameters(), lr=args.lr_target, betas=(0.9, 0.98), weight_decay=0.0)
    t0 = time.time()
    for step in range(args.steps_target):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps_target, args.lr_target)
        x = batch_windows(toks, gen, args.batch, args.seq)
        logits, _ = tgt(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, N_VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tgt.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps_target - 1:
            acc = (logits.argmax(-1) == x[:, 1:]).float().mean().item()
            log(f"target step {step} loss {loss.item():.4f} acc {acc:.3f} ({time.time() - t0:.0f}s)")
    return time.time() - t0


def draft_batch(tgt, asst_cfg, x, K, n_q=0, gen=None):
    """Target pass over x [B,T] (frozen) -> tensors for K teacher-forced draft steps.
    Draft query at position p (p = 1..T-K) reads target KV at positions < p, gets
    token x[p] + target h at p-1; step k (0-based) consumes x[p+k] and is trained to
    predict the target's greedy token after position p+k."""
    with torch.no_grad():
        logits, hn, kv = tgt(x, want_kv=True)
    B, T = x.shape
    p = torch.arange(1, T - K + 1)
    if n_q and n_q < len(p):  # subsample query positions (same for every row) to save CPU
        p = torch.sort(p[torch.randperm(len(p), generator=gen)[:n_q]]).values
    P = len(p)
    greedy = logits.argmax(-1)  # [B,T]: target's prediction for position t+1
    m_full, m_swa = causal_masks(p[None, :], torch.arange(T), asst_cfg.n_swa, strict=True)
    return dict(
        h0=hn[:, p - 1], pos=p[None, :].expand(B, P), kv=kv,
        masks={"full": m_full, "swa": m_swa},
        toks=[x[:, p + k] for k in range(K)],
        labels=[greedy[:, p + k] for k in range(K)],
    )


def run_draft_chain(asst, tgt, d, K):
    h = d["h0"]
    outs = []
    for k in range(K):
        e = tgt.embed(d["toks"][k])
        logits, h, y = asst.step(e, h, d["pos"], d["kv"], d["masks"])
        outs.append((logits, y))
    return outs


def train_assistant(asst, tgt, toks, args):
    gen = torch.Generator().manual_seed(args.seed + 2)
    params = [p for n, p in asst.named_parameters() if not n.startswith("centroids")]
    opt = torch.optim.AdamW(params, lr=args.lr_asst, betas=(0.9, 0.98), weight_decay=0.0)
    K = args.draft_steps
    w = torch.tensor([1.0 / (1 + 0.25 * k) for k in range(K)])
    t0 = time.time()
    for step in range(args.steps_asst):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps_asst, args.lr_asst)
        x = batch_windows(toks, gen, args.batch_asst, args.seq)
        d = draft_batch(tgt, asst.c, x, K, args.asst_queries, gen)
        outs = run_draft_chain(asst, tgt, d, K)
        losses = [F.cross_entropy(lg.reshape(-1, N_VOCAB), lab.reshape(-1)) for (lg, _), lab in zip(outs, d["labels"])]
        loss = sum(wi * li for wi, li in zip(w, losses)) / w.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps_asst - 1:
            accs = [(lg.argmax(-1) == lab).float().mean().item() for (lg, _), lab in zip(outs, d["labels"])]
            log(f"assistant step {step} loss {loss.item():.4f} acc/step " + " ".join(f"{a:.2f}" for a in accs)
                + f" ({time.time() - t0:.0f}s)")
    return time.time() - t0


def balanced_kmeans(X, C, iters, gen):
    """Equal-size clusters (N = C*K) of the rows of X (cosine), deterministic."""
    N = X.shape[0]
    K = N // C
    Xn = F.normalize(X, dim=-1)
    cent = Xn[torch.randperm(N, generator=gen)[:C]].clone()
    for _ in range(iters):
        sim = Xn @ cent.t()  # [N,C]
        order = torch.argsort(sim.flatten(), descending=True, stable=True)
        assign = torch.full((N,), -1, dtype=torch.long)
        cap = torch.zeros(C, dtype=torch.long)
        for idx in order.tolist():
            i, c = divmod(idx, C)
            if assign[i] >= 0 or cap[c] >= K:
                continue
            assign[i] = c
            cap[c] += 1
        for c in range(C):
            cent[c] = F.normalize(Xn[assign == c].mean(0), dim=0)
    ordering = torch.cat([torch.nonzero(assign == c).flatten() for c in range(C)])
    return ordering, assign


def train_centroids(asst, tgt, toks, args):
    """Ordering = balanced k-means over the (tied) LM-head rows; centroids trained
    (trunk frozen) to rank the cluster of the target's greedy token first."""
    c = asst.c
    gen = torch.Generator().manual_seed(args.seed + 3)
    with torch.no_grad():
        ordering, assign = balanced_kmeans(asst.embd.detach(), c.num_centroids, 10, gen)
        asst.ordering.copy_(ordering)
    opt = torch.optim.AdamW(asst.centroids.parameters(), lr=1e-2, weight_decay=0.0)
    K = args.draft_steps
    t0 = time.time()
    for step in range(args.steps_centroid):
        x = batch_windows(toks, gen, args.batch_asst, args.seq)
        with torch.no_grad():
            d = draft_batch(tgt, c, x, K, args.asst_queries, gen)
            outs = run_draft_chain(asst, tgt, d, K)
        ys = torch.cat([y.reshape(-1, c.d) for _, y in outs])
        # train on the assistant's own argmax (what the dense head would draft)
        lab = torch.cat([lg.argmax(-1).reshape(-1) for lg, _ in outs])
        loss = F.cross_entropy(asst.centroids(ys), assign[lab])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.steps_centroid - 1:
            with torch.no_grad():
                top = asst.centroids(ys).topk(c.centroid_top_k, -1).indices
                hit = (top == assign[lab][:, None]).any(-1).float().mean().item()
            log(f"centroid step {step} loss {loss.item():.4f} top{c.centroid_top_k}-hit {hit:.3f}")
    return time.time() - t0


# ------------------------------------------------------------------ reference ----
@torch.no_grad()
def greedy(tgt, ids, n):
    ids = list(ids)
    for _ in range(n):
        logits, _ = tgt(torch.tensor([ids]))
        ids.append(int(logits[0, -1].argmax()))
    return ids


@torch.no_grad()
def simulate_mtp(tgt, asst, seq, n_prompt, n_max, head="dense"):
    """Replay of upstream draft-mtp on a fixed greedy sequence: drafts from position p
    (id_last = seq[p], h = target h[p-1], KV < p), accepted while equal to seq."""
    x = torch.tensor([seq])
    _, hn, kv = tgt(x, want_kv=True)
    T = len(seq)
    p = n_prompt
    n_draft = n_acc = 0
    while p < T - 1:
        pos = torch.tensor([[p]])
        m_full, m_swa = causal_masks(pos, torch.arange(T), asst.c.n_swa, strict=True)
        masks = {"full": m_full, "swa": m_swa}
        h = hn[:, p - 1: p]
        tok = seq[p]
        drafts = []
        for _ in range(min(n_max, T - 1 - p)):
            logits, h, y = asst.step(tgt.embed(torch.tensor([[tok]])), h, pos, kv, masks)
            lg = asst.centroid_logits(y) if head == "centroid" else logits
            tok = int(lg[0, 0].argmax())
            drafts.append(tok)
        a = 0
        while a < len(drafts) and drafts[a] == seq[p + 1 + a]:
            a += 1
        n_draft += len(drafts)
        n_acc += a
        p += a + 1
    return n_draft, n_acc


def make_reference(tgt, asst, toks, args):
    ref = {"prompts": []}
    n = len(toks)
    offs = [int(i * (n - 400) / (args.n_prompts - 1)) for i in range(args.n_prompts)]
    tot = {"dense": [0, 0], "centroid": [0, 0]}
    for o in offs:
        prompt = [BOS_ID] + toks[o: o + args.prompt_len].tolist()
        seq = greedy(tgt, prompt, args.gen_len)
        with torch.no_grad():
            logits, _ = tgt(torch.tensor([prompt]))
        last = logits[0, -1]
        corpus_next = toks[o + args.prompt_len: o + args.prompt_len + args.gen_len].tolist()
        match = sum(1 for a, b in zip(seq[len(prompt):], corpus_next) if a == b)
        entry = {
            "offset": o,
            "prompt_text": decode(prompt[1:]),
            "prompt_ids": prompt,
            "greedy_ids": seq[len(prompt):],
            "greedy_text": decode(seq[len(prompt):]),
            "greedy_matches_corpus": match,
            "final_logits": [round(float(v), 6) for v in last.tolist()],
        }
        for head in ("dense", "centroid"):
            nd, na = simulate_mtp(tgt, asst, seq, len(prompt), args.n_max, head)
            entry[f"sim_{head}_n_draft"], entry[f"sim_{head}_n_accepted"] = nd, na
            tot[head][0] += nd
            tot[head][1] += na
        ref["prompts"].append(entry)
        log(f"ref offset {o}: greedy==corpus {match}/{args.gen_len}, "
            f"sim dense {entry['sim_dense_n_accepted']}/{entry['sim_dense_n_draft']}, "
            f"centroid {entry['sim_centroid_n_accepted']}/{entry['sim_centroid_n_draft']}")
    for head in ("dense", "centroid"):
        ref[f"sim_{head}_acceptance"] = tot[head][1] / max(1, tot[head][0])
    ref["n_max"] = args.n_max
    ref["gen_len"] = args.gen_len
    return ref


# ------------------------------------------------------------------ export ----
def f32(t):
    return t.detach().to(torch.float32).contiguous().numpy()


def add_common_hparams(w, c, n_kv_shared):
    w.add_context_length(c.n_ctx)
    w.add_embedding_length(c.d)
    w.add_block_count(c.n_layer)
    w.add_feed_forward_length(c.n_ff)
    w.add_head_count(c.n_head)
    swa = [t == "sliding_attention" for t in c.layer_types]
    w.add_head_count_kv([c.nkv_swa if s else c.nkv_full for s in swa])
    w.add_layer_norm_rms_eps(c.eps)
    w.add_key_length(c.hd_full)
    w.add_value_length(c.hd_full)
    w.add_key_length_swa(c.hd_swa)
    w.add_value_length_swa(c.hd_swa)
    w.add_rope_freq_base(c.base_full)
    w.add_rope_freq_base_swa(c.base_swa)
    w.add_sliding_window(c.n_swa)
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(n_kv_shared)
    w.add_embedding_length_per_layer_input(0)
    w.add_rope_dimension_count(c.hd_full)
    w.add_rope_dimension_count_swa(c.hd_swa)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def add_layers(w, layers):
    """blk.N tensors in llama.cpp's names; target layers also have K and V (the assistant's are Q-only)."""
    for i, L in enumerate(layers):
        kv = hasattr(L, "wk")
        tensors = [("attn_norm", L.attn_norm), ("attn_q", L.wq.weight)]
        tensors += [("attn_k", L.wk.weight), ("attn_v", L.wv.weight)] if kv else []
        tensors += [("attn_output", L.wo.weight), ("attn_q_norm", L.q_norm)]
        tensors += [("attn_k_norm", L.k_norm)] if kv else []
        tensors += [("post_attention_norm", L.post_attn_norm), ("ffn_norm", L.ffn_norm),
                    ("ffn_gate", L.gate.weight), ("ffn_up", L.up.weight), ("ffn_down", L.down.weight),
                    ("post_ffw_norm", L.ffn_post_norm), ("layer_output_scale", L.out_scale)]
        for name, t in tensors:
            w.add_tensor(f"blk.{i}.{name}.weight", f32(t))


def write_target(path, tgt):
    c = tgt.c
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_name("polyforge-mtp-fixture-target")
    add_common_hparams(w, c, 0)
    w.add_final_logit_softcapping(c.final_softcap)
    add_vocab(w, N_VOCAB)
    w.add_tensor("token_embd.weight", f32(tgt.embd))
    w.add_tensor("output_norm.weight", f32(tgt.out_norm))
    w.add_tensor("rope_freqs.weight", f32(tgt.ff))
    add_layers(w, tgt.layers)
    write_file(w)


def write_assistant(path, asst, centroids=False, meta=True):
    c = asst.c
    w = gguf.GGUFWriter(str(path), "gemma4-assistant")
    w.add_name("polyforge-mtp-fixture-assistant" + ("-centroids" if centroids else ""))
    add_common_hparams(w, c, c.n_layer)
    if meta:
        # what conversion/gemma.py Gemma4AssistantModel.set_gguf_parameters writes
        w.add_embedding_length_out(c.d_backbone)
        w.add_nextn_predict_layers(c.n_layer)
    add_vocab(w, N_VOCAB)
    w.add_tensor("token_embd.weight", f32(asst.embd))
    w.add_tensor("output_norm.weight", f32(asst.out_norm))
    w.add_tensor("rope_freqs.weight", f32(asst.ff))
    w.add_tensor("nextn.pre_projection.weight", f32(asst.pre_proj.weight))
    w.add_tensor("nextn.post_projection.weight", f32(asst.post_proj.weight))
    if centroids:
        # HF masked_embedding.centroids [C, d] -> ne {d, C}; token_ordering [V] (int64 in HF) as I32
        w.add_tensor("masked_embd_centroids.weight", f32(asst.centroids.weight))
        w.add_tensor("masked_embd_ordering", asst.ordering.to(torch.int32).numpy())
        # HF centroid_intermediate_top_k; the key patch 0074's converter writes and its loader reads
        # (upstream b11312 has no such key and cannot load this file at all)
        w.add_uint32("gemma4-assistant.centroid_top_k", c.centroid_top_k)
    add_layers(w, asst.layers)
    write_file(w)


def sha256(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(HERE / "data"))
    ap.add_argument("--work", default="/tmp/mtp-fixture-work", help="checkpoints (.pt)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corpus-chars", type=int, default=6000)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--batch", type=int, default=6)
    ap.add_argument("--batch-asst", type=int, default=8)
    ap.add_argument("--asst-queries", type=int, default=48, help="draft query positions per window")
    ap.add_argument("--steps-target", type=int, default=600)
    ap.add_argument("--steps-asst", type=int, default=800)
    ap.add_argument("--steps-centroid", type=int, default=100)
    ap.add_argument("--lr-target", type=float, default=3e-3)
    ap.add_argument("--lr-asst", type=float, default=3e-3)
    ap.add_argument("--draft-steps", type=int, default=8)
    ap.add_argument("--n-prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--reuse", action="store_true", help="load both checkpoints from --work instead of training")
    ap.add_argument("--reuse-target", action="store_true",
                    help="load target.pt from --work, train the assistant (same result as a full run)")
    args = ap.parse_args()

    set_determinism(args.seed, args.threads)
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)

    text = load_corpus(args.corpus_chars)
    toks = torch.tensor(encode(text), dtype=torch.long)
    log(f"corpus: {len(text)} chars, {len(toks)} tokens")

    tcfg, acfg = TargetCfg(), AssistantCfg()
    tgt, asst = Target(tcfg), Assistant(acfg)
    times = {}
    if args.reuse:
        tgt.load_state_dict(torch.load(work / "target.pt"))
        asst.load_state_dict(torch.load(work / "assistant.pt"))
    else:
        if args.reuse_target:
            tgt.load_state_dict(torch.load(work / "target.pt"))
        else:
            times["target_s"] = train_target(tgt, toks, args)
            torch.save(tgt.state_dict(), work / "target.pt")
        for p in tgt.parameters():
            p.requires_grad_(False)
        times["assistant_s"] = train_assistant(asst, tgt, toks, args)
        times["centroid_s"] = train_centroids(asst, tgt, toks, args)
        torch.save(asst.state_dict(), work / "assistant.pt")
    tgt.eval()
    asst.eval()
    for p in list(tgt.parameters()) + list(asst.parameters()):
        p.requires_grad_(False)

    files = {
        "target.gguf": lambda p: write_target(p, tgt),
        "assistant.gguf": lambda p: write_assistant(p, asst),
        "assistant-centroid.gguf": lambda p: write_assistant(p, asst, centroids=True),
    }
    files["corpus.txt"] = lambda p: p.write_text(text, encoding="utf-8")
    for name, fn in files.items():
        fn(out / name)
        log(f"wrote {out / name} ({(out / name).stat().st_size} bytes)")

    ref = make_reference(tgt, asst, toks, args)
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    log(f"simulated acceptance (n_max={args.n_max}): dense {ref['sim_dense_acceptance']:.3f}, "
        f"centroid {ref['sim_centroid_acceptance']:.3f}")

    manifest = {
        "made_by": "gates/mtp/train_mtp_fixture.py",
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "work", "reuse", "reuse_target")},
        "torch": torch.__version__,
        "corpus": {"file": "gates/data/llama-docs.txt", "chars": len(text), "tokens": len(toks)},
        "target": cfg_dict(tcfg),
        "assistant": cfg_dict(acfg),
        "train_seconds": times,
        "files": {n: {"bytes": (out / n).stat().st_size, "sha256": sha256(out / n)}
                  for n in list(files) + ["reference.json"]},
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log("manifest written")


if __name__ == "__main__":
    main()
