#!/usr/bin/env python3
"""Per-draft-step time of the Gemma 4 assistant (MTP draft head): dense LM head vs centroid head.

Patch 0074 gives the gemma4-assistant draft model the centroid (ordered-embedding) LM head of
transformers' Gemma4AssistantMaskedEmbedder: it scores n_centroids clusters, keeps the top_k
(`{arch}.centroid_top_k`, 32) and computes logits for top_k * n_vocab/n_centroids tokens only
(32 * 128 = 4096 of 262144), instead of the dense head's full 262144 x n_embd matmul. This script
measures what that buys per draft step, at the shape of the Gemma 4 E2B assistant, on random
weights (the time does not depend on the values).

Method:
1. Write three random-weight GGUFs into --work (seeded, reused while their spec is unchanged):
   - target.gguf (arch gemma4): n_embd 1536 (the E2B width), vocab 262144, 2 layers (1 sliding,
     1 full; the assistant's Q attends the target's KV of its last sliding and last full layer),
     8 heads, 1 KV head, head dim 256 (sliding) / 512 (full) like E2B, small n_ff;
   - draft-dense.gguf (arch gemma4-assistant) of the E2B assistant's shape: n_embd 256, 4 layers
     (3 sliding + 1 full), 4 heads, 1 KV head, head dim 256/512, n_ff 2048, backbone 1536,
     vocab 262144, tied LM head (token_embd);
   - draft-centroid.gguf: the same weights plus masked_embd_centroids [n_embd, 2048],
     masked_embd_ordering (I32, a random permutation of the vocab) and centroid_top_k = 32.
   The vocab is byte-level (the 'gemma4' tokenizer model, as gates/mtp/train_mtp_fixture.py
   writes it) padded with unused tokens to 262144.
2. Start one llama-server per head with the target and `-md DRAFT --spec-type draft-mtp
   --spec-draft-n-max N --spec-draft-p-min 0 -lv 4 -c 4096 -fa on -ngl X -ngld X -np 1` (and one
   with the target alone), all at once, and send greedy /completion requests (temperature 0,
   top_k 1, ignore_eos, no prompt cache) in turn, dense, centroid, target, dense, ..., so that a
   shared host's changing load falls on every head alike: --warmup rounds, then --reps measured
   ones. After each request the server logs, at trace level (-lv 4), the
   cumulative statistics of its speculative implementation (common_speculative_print_stats,
   called from the slot's print_timings when a request ends):
     statistics draft-mtp: #calls(b,g,a) = ... #gen tokens = T ... dur(b,g,a) = b, g, a ms
   The difference of two consecutive lines is one request. With random weights nothing is
   accepted and p_min is 0, so every draft call runs exactly n_max draft steps (each a decode of
   one token through the assistant and its LM head, plus sampling over 262144 logits):
     ms/step = delta g / (delta #calls_g * n_max)        (primary)
     ms/tok  = delta g / delta #gen tokens               (near the end of a request the server
                                                          caps the draft to the tokens left, so
                                                          the last calls count fewer tokens
                                                          than they ran steps: slightly higher)
   The median over the measured requests is reported, with min/max.
3. For context, the target's decode ms/token without a draft (timings.predicted_per_token_ms of
   a server started with the target alone, median), and the speculative runs' own ms/token.

On a CPU shared with other jobs use --threads 1 (or at most the idle cores): with more threads
than free cores the OpenMP barriers spin (70 % of a perf profile in libgomp at -t 2 on a busy
2-core host) and the step times swing 2-3x from request to request.

Output: a table on stdout (dense ms/step, centroid ms/step, dense/centroid), or with --json one
JSON object on stdout (the table then goes to stderr). Logs on stderr; server logs in --work.

Runs in the environment polyforge is installed in (its llama-server harness, numpy); pass the
vendored tree's gguf-py with --gguf-py:
  bench_mtp_head.py --server build/bin/llama-server --gguf-py vendor/llama.cpp/gguf-py \\
      --work /tmp/mtp-head-bench [--ngl 0|99] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import numpy as np

from polyforge.gates.server import LlamaServer, program_log

# the MTP fixture's byte-level vocabulary, padded to the E2B vocab size
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "gates", "mtp"))
from mtp_vocab import add_vocab, write_file  # noqa: E402

# -------------------------------------------------------------------------- shapes ----
N_VOCAB = 262144
# google/gemma-4-E2B-it-assistant config.json: backbone_hidden_size 1536, num_centroids 2048,
# centroid_intermediate_top_k 32, text_config hidden_size 256, intermediate_size 2048,
# 4 layers (sliding x3, full), 4 heads, 1 KV head, head_dim 256, global_head_dim 512,
# sliding_window 512, rope_theta 1e6 (full, partial 0.25 'proportional') / 1e4 (sliding),
# rms_norm_eps 1e-6, tied embeddings, vocab 262144
ASSISTANT = dict(n_embd=256, n_ff=2048, layer_types=["swa", "swa", "swa", "full"], n_head=4,
                 n_head_kv=1, hd_swa=256, hd_full=512, n_centroids=2048, top_k=32)
# google/gemma-4-E2B-it: hidden 1536, 8 heads, 1 KV head, head_dim 256 / 512; cut to 2 layers
TARGET = dict(n_embd=1536, n_ff=2048, layer_types=["swa", "full"], n_head=8, n_head_kv=1,
              hd_swa=256, hd_full=512)
COMMON = dict(n_ctx_train=131072, n_swa=512, eps=1e-6, base_full=1_000_000.0, base_swa=10_000.0,
              partial_full=0.25)
STD = 0.02  # weight init scale

PROMPT = ("The quick brown fox jumps over the lazy dog. Speculative decoding drafts a few tokens "
          "with a small model and verifies them with the large one in a single batch.")

STATS_RE = re.compile(
    r"statistics\s+draft-mtp: #calls\(b,g,a\) =\s*(\d+)\s+(\d+)\s+(\d+), #gen drafts =\s*(\d+), "
    r"#acc drafts =\s*(\d+), #gen tokens =\s*(\d+), #acc tokens =\s*(\d+).*?"
    r"dur\(b,g,a\) = ([\d.]+), ([\d.]+), ([\d.]+) ms")


# ---------------------------------------------------------------------- gguf writing ----
def import_gguf(path):
    if path:
        sys.path.insert(0, path)
    import gguf
    return gguf


def add_hparams(w, gguf, c, n_kv_shared):
    swa = [t == "swa" for t in c["layer_types"]]
    w.add_context_length(COMMON["n_ctx_train"])
    w.add_embedding_length(c["n_embd"])
    w.add_block_count(len(swa))
    w.add_feed_forward_length(c["n_ff"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv([c["n_head_kv"]] * len(swa))
    w.add_layer_norm_rms_eps(COMMON["eps"])
    w.add_key_length(c["hd_full"])
    w.add_value_length(c["hd_full"])
    w.add_key_length_swa(c["hd_swa"])
    w.add_value_length_swa(c["hd_swa"])
    w.add_rope_freq_base(COMMON["base_full"])
    w.add_rope_freq_base_swa(COMMON["base_swa"])
    w.add_sliding_window(COMMON["n_swa"])
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(n_kv_shared)
    w.add_embedding_length_per_layer_input(0)
    w.add_rope_dimension_count(c["hd_full"])
    w.add_rope_dimension_count_swa(c["hd_swa"])


class Weights:
    """Random matrices as F16, or as Q8_0 blocks made directly (random int8 quants, one scale),
    which is much faster than quantizing float data and just as valid for timing."""

    def __init__(self, gguf, rng):
        self.gguf, self.rng = gguf, rng

    def matrix(self, rows, cols, typ):
        if typ == "q8_0":
            assert cols % 32 == 0
            nb = cols // 32
            out = np.empty((rows, nb, 34), dtype=np.uint8)
            # |q| ~ U(-127, 127) has std ~73: scale so that values have std ~STD
            out[:, :, :2] = np.frombuffer(np.float16(STD / 73.3).tobytes(), dtype=np.uint8)
            step = max(1, (1 << 24) // cols)
            for r in range(0, rows, step):
                q = self.rng.integers(-127, 128, size=(min(step, rows - r), nb, 32), dtype=np.int8)
                out[r:r + step, :, 2:] = q.view(np.uint8)
            return out.reshape(rows, nb * 34), self.gguf.GGMLQuantizationType.Q8_0
        out = np.empty((rows, cols), dtype=np.float16)
        step = max(1, (1 << 24) // cols)
        for r in range(0, rows, step):
            n = min(step, rows - r)
            out[r:r + n] = self.rng.standard_normal((n, cols), dtype=np.float32) * STD
        return out, None


def rope_freqs(hd_full):
    n_rot = int(hd_full * COMMON["partial_full"] / 2)
    return np.array([1.0] * n_rot + [1e30] * (hd_full // 2 - n_rot), dtype=np.float32)


def ones(n):
    return np.ones(n, dtype=np.float32)


def write(path, gguf, arch, name, hparams_fn, tensors):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    hparams_fn(w)
    add_vocab(w, N_VOCAB)
    for tname, (arr, raw) in tensors:
        if raw is None:
            w.add_tensor(tname, arr)
        else:
            w.add_tensor(tname, arr, raw_dtype=raw)
    write_file(w)


def layer_tensors(W, c, i, with_kv, typ):
    d, swa = c["n_embd"], c["layer_types"][i] == "swa"
    hd = c["hd_swa"] if swa else c["hd_full"]
    nq, nkv = c["n_head"] * hd, c["n_head_kv"] * hd
    b = f"blk.{i}."
    t = [(b + "attn_norm.weight", (ones(d), None)),
         (b + "attn_q.weight", W.matrix(nq, d, typ))]
    if with_kv:
        t += [(b + "attn_k.weight", W.matrix(nkv, d, typ)),
              (b + "attn_v.weight", W.matrix(nkv, d, typ)),
              (b + "attn_k_norm.weight", (ones(hd), None))]
    t += [(b + "attn_output.weight", W.matrix(d, nq, typ)),
          (b + "attn_q_norm.weight", (ones(hd), None)),
          (b + "post_attention_norm.weight", (ones(d), None)),
          (b + "ffn_norm.weight", (ones(d), None)),
          (b + "ffn_gate.weight", W.matrix(c["n_ff"], d, typ)),
          (b + "ffn_up.weight", W.matrix(c["n_ff"], d, typ)),
          (b + "ffn_down.weight", W.matrix(d, c["n_ff"], typ)),
          (b + "post_ffw_norm.weight", (ones(d), None)),
          (b + "layer_output_scale.weight", (ones(1), None))]
    return t


def generate(work, spec, gguf_py):
    gguf = import_gguf(gguf_py)
    rng = np.random.default_rng(spec["seed"])
    W = Weights(gguf, rng)
    paths = {k: os.path.join(work, f) for k, f in
             (("target", "target.gguf"), ("dense", "draft-dense.gguf"), ("centroid", "draft-centroid.gguf"))}

    # target (gemma4)
    c = TARGET
    tt = spec["target_type"]
    tensors = [("token_embd.weight", W.matrix(N_VOCAB, c["n_embd"], tt)),
               ("output_norm.weight", (ones(c["n_embd"]), None)),
               ("rope_freqs.weight", (rope_freqs(c["hd_full"]), None))]
    for i in range(len(c["layer_types"])):
        tensors += layer_tensors(W, c, i, True, tt)
    write(paths["target"], gguf, "gemma4", "polyforge-bench-mtp-head-target",
          lambda w: add_hparams(w, gguf, c, 0), tensors)
    del tensors

    # assistant (gemma4-assistant), one set of weights for both files
    a = ASSISTANT
    dt = spec["draft_type"]
    d, dbb = a["n_embd"], TARGET["n_embd"]
    base = [("token_embd.weight", W.matrix(N_VOCAB, d, dt)),
            ("output_norm.weight", (ones(d), None)),
            ("rope_freqs.weight", (rope_freqs(a["hd_full"]), None)),
            ("nextn.pre_projection.weight", W.matrix(d, 2 * dbb, dt)),
            ("nextn.post_projection.weight", W.matrix(dbb, d, dt))]
    for i in range(len(a["layer_types"])):
        base += layer_tensors(W, a, i, False, dt)
    # HF masked_embedding.centroids [C, d] -> ne {d, C}; token_ordering as I32
    centroids = [("masked_embd_centroids.weight", W.matrix(a["n_centroids"], d, dt)),
                 ("masked_embd_ordering", (rng.permutation(N_VOCAB).astype(np.int32), None))]

    def asst_hparams(w, top_k):
        add_hparams(w, gguf, a, len(a["layer_types"]))
        # what conversion/gemma.py Gemma4AssistantModel.set_gguf_parameters writes
        w.add_embedding_length_out(dbb)
        w.add_nextn_predict_layers(len(a["layer_types"]))
        if top_k:
            w.add_uint32("gemma4-assistant.centroid_top_k", top_k)

    write(paths["dense"], gguf, "gemma4-assistant", "polyforge-bench-mtp-head-dense",
          lambda w: asst_hparams(w, 0), base)
    write(paths["centroid"], gguf, "gemma4-assistant", "polyforge-bench-mtp-head-centroid",
          lambda w: asst_hparams(w, a["top_k"]), base + centroids)
    return paths


# ---------------------------------------------------------------------------- runs ----
def parse_stats(text):
    out = []
    for m in STATS_RE.finditer(text):
        v = [int(x) for x in m.groups()[:7]] + [float(x) for x in m.groups()[7:]]
        out.append(dict(calls_b=v[0], calls_g=v[1], calls_a=v[2], gen_drafts=v[3], acc_drafts=v[4],
                        gen_tokens=v[5], acc_tokens=v[6], ms_b=v[7], ms_g=v[8], ms_a=v[9]))
    return out


def completion(server, n_predict):
    body = {"prompt": PROMPT, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 0,
            "ignore_eos": True, "cache_prompt": False}
    st, r = server.post_json("/completion", body, timeout=1800)
    if st != 200:
        raise RuntimeError(f"/completion: HTTP {st}: {r}")
    return r


def wait_stats(server, n_before, timeout=30.0):
    t_end = time.time() + timeout
    while True:
        stats = parse_stats(server.log_text())
        if len(stats) > n_before or time.time() > t_end:
            return stats
        time.sleep(0.1)


def start_server(args, paths, head):
    common = ["-c", "4096", "-fa", "on", "-ngl", str(args.ngl), "-np", "1", "-lv", "4"]
    if args.threads:
        common += ["-t", str(args.threads)]
    extra = ["-md", paths[head], "--spec-type", "draft-mtp", "--spec-draft-n-max", str(args.n_max),
             "--spec-draft-p-min", "0", "-ngld", str(args.ngl)] if head != "target" else []
    return LlamaServer(args.server, paths["target"], common + extra, os.path.join(args.work, f"bench-{head}.log"))


class HeadRun:
    """Requests to one server and what they measured."""

    def __init__(self, args, srv, head):
        self.args, self.srv, self.head = args, srv, head
        self.prev = None
        self.per_step, self.per_tok, self.decode_ms, self.n_steps = [], [], [], []
        self.draft_n = self.draft_acc = 0

    def request(self, k, measured):
        a, srv = self.args, self.srv
        n_before = len(parse_stats(srv.log_text()))
        r = completion(srv, a.n_predict)
        t = r.get("timings", {})
        msg = ""
        if self.head != "target":
            stats = wait_stats(srv, n_before)
            if len(stats) <= n_before:
                raise RuntimeError(f"no 'statistics draft-mtp' line after request {k} (needs -lv 4), "
                                   f"see {srv.log_path}")
            cur = stats[-1]
            base = self.prev or {key: 0 for key in cur}
            self.prev = cur
            dg = cur["ms_g"] - base["ms_g"]
            dcalls = cur["calls_g"] - base["calls_g"]
            dtok = cur["gen_tokens"] - base["gen_tokens"]
            if dcalls <= 0 or dtok <= 0:
                raise RuntimeError(f"request {k} drafted nothing: {cur}")
            step = dg / (dcalls * a.n_max)
            msg = f", draft {step:.3f} ms/step ({dcalls} calls, {dtok} tokens)"
            if measured:
                self.per_step.append(step)
                self.per_tok.append(dg / dtok)
                self.n_steps.append(dcalls * a.n_max)
                self.draft_n += int(t.get("draft_n", 0))
                self.draft_acc += int(t.get("draft_n_accepted", 0))
        if measured:
            self.decode_ms.append(float(t.get("predicted_per_token_ms", float("nan"))))
        program_log(f"{self.head} request {k}{'' if measured else ' (warm-up)'}: {t.get('predicted_n')} tokens, "
            f"{t.get('predicted_per_token_ms', 0):.2f} ms/token{msg}")

    def result(self):
        res = {"decode_ms_per_token": summary(self.decode_ms)}
        if self.head != "target":
            res.update({"ms_per_step": summary(self.per_step), "ms_per_gen_token": summary(self.per_tok),
                        "steps_per_request": self.n_steps, "draft_n": self.draft_n,
                        "draft_n_accepted": self.draft_acc, "log": str(self.srv.log_path)})
        return res


def run_all(args, paths, heads):
    """All servers up at once, requests interleaved (dense, centroid, target, dense, ...), so
    that a shared host's load drifts over all heads alike."""
    servers, runs = [], {}
    try:
        for head in heads:
            srv = start_server(args, paths, head)
            servers.append(srv)
            srv.start()
            srv.wait_healthy(args.ready_timeout)
            runs[head] = HeadRun(args, srv, head)
        for k in range(args.warmup + args.reps):
            for head in heads:
                runs[head].request(k, k >= args.warmup)
    finally:
        for srv in servers:
            srv.stop()
    return {head: run.result() for head, run in runs.items()}


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else None


def load_note():
    try:
        la = os.getloadavg()
        return {"loadavg": [round(x, 2) for x in la], "cpus": os.cpu_count()}
    except OSError:
        return {"cpus": os.cpu_count()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="llama-server binary (with patch 0074)")
    ap.add_argument("--gguf-py", help="gguf-py folder (VENDOR/llama.cpp/gguf-py)")
    ap.add_argument("--work", required=True, help="folder for the GGUFs and server logs (not in git)")
    ap.add_argument("--ngl", type=int, default=0, help="-ngl and -ngld (0: CPU, 99: all on the GPU)")
    ap.add_argument("--threads", type=int, default=0, help="-t (default: llama-server's)")
    ap.add_argument("--n-predict", type=int, default=64, help="tokens per request")
    ap.add_argument("--reps", type=int, default=5, help="measured requests per head")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up requests per head")
    ap.add_argument("--n-max", type=int, default=8, help="--spec-draft-n-max")
    ap.add_argument("--draft-type", choices=("f16", "q8_0"), default="f16",
                    help="assistant matrices, LM head included")
    ap.add_argument("--target-type", choices=("f16", "q8_0"), default="q8_0", help="target matrices")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--regen", action="store_true", help="write the GGUFs even if --work has them")
    ap.add_argument("--no-baseline", action="store_true", help="skip the target-only decode run")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()

    os.makedirs(args.work, exist_ok=True)
    spec = {"seed": args.seed, "draft_type": args.draft_type, "target_type": args.target_type,
            "n_vocab": N_VOCAB, "assistant": ASSISTANT, "target": TARGET, "common": COMMON, "version": 1}
    spec_path = os.path.join(args.work, "spec.json")
    names = ("target.gguf", "draft-dense.gguf", "draft-centroid.gguf")
    paths = {k: os.path.join(args.work, f) for k, f in zip(("target", "dense", "centroid"), names)}
    have = os.path.exists(spec_path) and all(os.path.exists(p) for p in paths.values())
    if have:
        with open(spec_path) as f:
            have = json.load(f) == spec
    gen_s = None
    if args.regen or not have:
        if os.path.exists(spec_path):
            os.remove(spec_path)
        program_log(f"writing random GGUFs to {args.work} (seed {args.seed})")
        t0 = time.time()
        paths = generate(args.work, spec, args.gguf_py)
        gen_s = time.time() - t0
        with open(spec_path, "w") as f:
            json.dump(spec, f, indent=1)
        program_log(f"generation took {gen_s:.1f} s: " + ", ".join(
            f"{os.path.basename(p)} {os.path.getsize(p) / 2**20:.0f} MiB" for p in paths.values()))
    else:
        program_log(f"reusing the GGUFs in {args.work}")

    load_before = load_note()
    heads = ["dense", "centroid"] + ([] if args.no_baseline else ["target"])
    results = run_all(args, paths, heads)
    if "target" in results:
        results["target_only"] = results.pop("target")
    load_after = load_note()

    d, c = results["dense"]["ms_per_step"]["median"], results["centroid"]["ms_per_step"]["median"]
    out = {
        "shape": {"n_vocab": N_VOCAB, "assistant": ASSISTANT, "target": TARGET,
                  "draft_type": args.draft_type, "target_type": args.target_type,
                  "scored_tokens_centroid": ASSISTANT["top_k"] * N_VOCAB // ASSISTANT["n_centroids"]},
        "config": {"ngl": args.ngl, "threads": args.threads or None, "n_predict": args.n_predict,
                   "reps": args.reps, "warmup": args.warmup, "n_max": args.n_max, "seed": args.seed},
        "generation_s": gen_s,
        "results": results,
        "dense_over_centroid": d / c if c else None,
        "host": {"before": load_before, "after": load_after},
    }

    lines = [f"draft step, Gemma 4 E2B assistant head (vocab {N_VOCAB}, n_embd {ASSISTANT['n_embd']}, "
             f"{args.draft_type}), ngl {args.ngl}, median of {args.reps} x {args.n_predict} tokens, n_max {args.n_max}",
             f"{'head':<10} {'ms/step':>9} {'min':>9} {'max':>9} {'ms/gen tok':>11} {'spec ms/tok':>12}"]
    for head in ("dense", "centroid"):
        r = results[head]
        s = r["ms_per_step"]
        lines.append(f"{head:<10} {s['median']:9.3f} {s['min']:9.3f} {s['max']:9.3f} "
                     f"{r['ms_per_gen_token']['median']:11.3f} {r['decode_ms_per_token']['median']:12.2f}")
    lines.append(f"dense/centroid per step: {out['dense_over_centroid']:.2f}x")
    if "target_only" in results:
        lines.append(f"target alone (2-layer E2B-width gemma4, {args.target_type}): "
                     f"{results['target_only']['decode_ms_per_token']['median']:.2f} ms/token")
    lines.append(f"host load: before {load_before}, after {load_after}")
    table = "\n".join(lines)
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps(out, indent=1))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
