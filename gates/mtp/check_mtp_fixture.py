#!/usr/bin/env python3
"""Check the MTP fixture against llama.cpp (CPU build).

1. tokenizer: llama-server /tokenize of each reference prompt text == the ids trained on
2. logits: mtp_logits_dump.cpp (beside this file, built here against libllama) -> final-position
   logits vs PyTorch's (reference.json), and a 64-token greedy continuation
3. MTP: llama-server -m target -md assistant --spec-type draft-mtp, 8 prompts x 128
   tokens greedy; MTP-on output == MTP-off output, acceptance, decode t/s on/off

    python gates/mtp/check_mtp_fixture.py --bin build/cpu-*/bin [--fixtures gates/mtp/data]
Prints a JSON summary (also written to --summary if given). Exit 1 on a failed check.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from polyforge.gates.server import LlamaServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def ask(server, path, body):
    status, res = server.post_json(path, body)
    if status != 200:
        raise RuntimeError(f"{server.log_path.stem}: {path} returned {status}: {res}")
    return res


def build_dump(bin_dir, out):
    src = HERE / "mtp_logits_dump.cpp"
    inc = ROOT / "vendor" / "llama.cpp"
    subprocess.run(["g++", "-O2", "-std=c++17", str(src), f"-I{inc / 'include'}", f"-I{inc / 'ggml' / 'include'}",
                    f"-L{bin_dir}", "-lllama", f"-Wl,-rpath,{bin_dir}", "-o", str(out)], check=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--fixtures", default=str(HERE / "data"))
    ap.add_argument("--assistant", default="assistant.gguf")
    ap.add_argument("--target", help="target GGUF for the server runs (default: FIXTURES/target.gguf), "
                                     "e.g. a pad_mtp_target.py twin for the speed measurement")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-max", type=int, default=8)
    ap.add_argument("--n-min", type=int, default=0)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--extra", default="", help="extra llama-server args (both runs)")
    ap.add_argument("--summary")
    return ap.parse_args(argv)


def main():
    args = parse_args()

    bin_dir = Path(args.bin).resolve()
    fx = Path(args.fixtures)
    ref = json.loads((fx / "reference.json").read_text())
    prompts = ref["prompts"]
    tmp = Path(tempfile.mkdtemp(prefix="mtp-check-"))
    summary = {"fixtures": str(fx), "assistant": args.assistant}
    ok = True

    # 2. logits
    dump = tmp / "mtp_logits_dump"
    build_dump(bin_dir, dump)
    inp = "".join(" ".join(map(str, p["prompt_ids"])) + "\n" for p in prompts)
    summary["logits"] = {}
    for mode, env in (("default_f16_kv", {}), ("f32_kv_no_fa", {"MTP_DUMP_F32_KV": "1"})):
        r = subprocess.run([str(dump), str(fx / "target.gguf"), "64"], input=inp, capture_output=True, text=True,
                           check=True, env={**os.environ, **env})
        rows = [json.loads(l) for l in r.stdout.splitlines()]
        max_abs, max_rel, greedy_eq, top1_eq = 0.0, 0.0, 0, 0
        for p, o in zip(prompts, rows):
            a, b = p["final_logits"], o["final_logits"]
            d = max(abs(x - y) for x, y in zip(a, b))
            scale = max(abs(x) for x in a)
            max_abs, max_rel = max(max_abs, d), max(max_rel, d / scale)
            top1_eq += int(max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__))
            n = min(64, len(p["greedy_ids"]))
            greedy_eq += int(o["greedy"][:n] == p["greedy_ids"][:n])
        summary["logits"][mode] = {"max_abs_diff": max_abs, "max_rel_diff_vs_max_logit": max_rel,
                                   "top1_equal": f"{top1_eq}/{len(prompts)}",
                                   "greedy64_equal": f"{greedy_eq}/{len(prompts)}"}
        ok &= greedy_eq == len(prompts)

    server = str(bin_dir / "llama-server")
    target = args.target or str(fx / "target.gguf")
    base = ["-c", "2048", "-np", "1", "-t", str(args.threads), "-tb", str(args.threads),
            "--no-warmup"] + (args.extra.split() if args.extra else [])
    body = lambda p: {"prompt": p["prompt_ids"], "n_predict": args.n_gen, "temperature": 0.0, "top_k": 1,
                      "return_tokens": True, "cache_prompt": False, "ignore_eos": True}

    # 1. tokenizer + MTP-off
    runs = {}
    with LlamaServer(server, target, base, tmp / "off.log") as srv:
        srv.wait_healthy(60)
        tok_eq = 0
        for p in prompts:
            t = ask(srv, "/tokenize", {"content": p["prompt_text"]})["tokens"]
            tok_eq += int(t == p["prompt_ids"][1:])
        summary["tokenizer_equal"] = f"{tok_eq}/{len(prompts)}"
        ok &= tok_eq == len(prompts)
        runs["off"] = [ask(srv, "/completion", body(p)) for p in prompts]

    spec = ["-md", str(fx / args.assistant), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(args.n_max),
            "--spec-draft-n-min", str(args.n_min)]
    with LlamaServer(server, target, base + spec, tmp / "on.log") as srv:
        srv.wait_healthy(60)
        runs["on"] = [ask(srv, "/completion", body(p)) for p in prompts]

    same = sum(int(a["tokens"] == b["tokens"]) for a, b in zip(runs["off"], runs["on"]))
    ref_same = sum(int(a["tokens"] == p["greedy_ids"][:args.n_gen]) for a, p in zip(runs["off"], prompts))
    dn = sum(r["timings"].get("draft_n", 0) for r in runs["on"])
    da = sum(r["timings"].get("draft_n_accepted", 0) for r in runs["on"])

    def tps(rs):
        n = sum(r["timings"]["predicted_n"] for r in rs)
        ms = sum(r["timings"]["predicted_ms"] for r in rs)
        return n / (ms / 1000.0)

    summary["mtp"] = {
        "lossless_on_equals_off": f"{same}/{len(prompts)}",
        "off_equals_pytorch_greedy": f"{ref_same}/{len(prompts)}",
        "draft_n": dn, "draft_n_accepted": da, "acceptance": da / dn if dn else 0.0,
        "pytorch_simulated_acceptance": ref.get("sim_centroid_acceptance" if "centroid" in args.assistant
                                                else "sim_dense_acceptance"),
        "decode_tps_off": tps(runs["off"]), "decode_tps_on": tps(runs["on"]),
    }
    summary["mtp"]["speedup"] = summary["mtp"]["decode_tps_on"] / summary["mtp"]["decode_tps_off"]
    ok &= same == len(prompts)
    summary["ok"] = bool(ok)
    s = json.dumps(summary, indent=1)
    print(s)
    if args.summary:
        Path(args.summary).write_text(s + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
