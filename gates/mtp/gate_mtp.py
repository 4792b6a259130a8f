#!/usr/bin/env python3
"""Gate `mtp`: 0074 speculative MTP on the tiny trained gemma4 target + gemma4-assistant pair.

The fixture (gates/mtp/data/, made by train_mtp_fixture.py beside this file) is a gemma4 target and
its gemma4-assistant draft head, trained on gates/data/llama-docs.txt. For each configuration
llama-server runs greedy completions of N prompts x T tokens (one slot, -fa on) and the gate
checks, against the same server without MTP and the same KV types:

1. lossless: MTP-on tokens equal MTP-off tokens for every prompt, and teacher-forced top-1
   agreement is 1.0 (each MTP-on token is the target's greedy token after the MTP-on prefix,
   asked one token at a time of a server without MTP);
2. acceptance: sum(draft_n_accepted) / sum(draft_n) of the MTP runs;
3. speed: decode tokens/s with MTP over without, from the same run (reported; a benchmark, not
   a verdict on a shared machine), on the fixture and on its twin whose FFNs are widened by
   zeros to --twin-ff (same function, the per-token cost of a real target; f16 K/V with n_max 3
   and 8, turbo3 K/V with n_max 2 and 3 and with n_max 8 at --spec-draft-p-min 0.8;
   --twin-rounds alternating rounds, the fastest of each);
4. the same with -ctk/-ctv turbo3 (the draft reads the target's turbo3 K/V);
5. the atomic-llama-cpp-turboquant command line (--mtp-head, --spec-type mtp,
   --draft-block-size 3, --draft-max 8, --draft-min 0, -ngld, -ctkd/-ctvd turbo3) serves;
6. the centroid-head assistant drafts, and the same head in the fork's file format (arch
   `gemma4_assistant`, mtp.* tensor names, no embedding_length_out / nextn_predict_layers)
   drafts exactly like it;
7. bad input is refused at load with one clear line and a clean exit: a missing file, a head
   built for another target width, a centroid table that does not divide the vocabulary, an
   ordering that is not a permutation, an ordering of the wrong length.

Stdlib + numpy + gguf-py (for the bad-input files) + polyforge's llama-server harness
(polyforge.gates.server). Prints one verdict JSON on stdout, logs on stderr; exit 0 only when ok.
"""

import argparse
import os
import shutil
import sys
import tempfile

from gguf_rewrite import rewrite, to_fork_format
from pad_mtp_target import pad_target

from polyforge.gates.server import LlamaServer, program_log, run_program

GATE = "mtp"

THRESHOLDS = {
    "min_acceptance": 0.6,
    "min_teacher_forced": 1.0,
}

TURBO = ["-ctk", "turbo3", "-ctv", "turbo3", "-ctkd", "turbo3", "-ctvd", "turbo3"]


def make_prompts(text, n_prompts, n_chars):
    """n_prompts snippets of the training text, each starting at a line start, spread evenly."""
    starts = [i + 1 for i, c in enumerate(text[:-n_chars]) if c == "\n" and text[i + 1].isalpha()]
    step = max(1, len(starts) // n_prompts)
    return [text[starts[k * step]:starts[k * step] + n_chars] for k in range(n_prompts)]


def greedy(server, prompt, n_predict, cache_prompt=False):
    st, r = server.post_json("/completion", {
        "prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 0,
        "ignore_eos": True, "cache_prompt": cache_prompt, "return_tokens": True,
    })
    if st != 200:
        raise RuntimeError(f"{server.log_path.stem}: /completion returned {st}: {r}")
    return r["tokens"], r["timings"]


def start(args, target, extra, log_dir, name):
    """One slot, -fa on, the gate's -ngl; every configuration differs only in `extra`. Started
    and healthy inside a `with` block."""
    server = LlamaServer(args.server, target, ["-c", "2048", "--parallel", "1", "-fa", "on", "-ngl", str(args.ngl),
                                               "--no-warmup"] + extra, os.path.join(log_dir, f"{name}.log"))
    program_log(f"start {name}: {' '.join(server.argv)}")
    return server


def summarize_run(timings):
    """Tokens/s and draft counts of one configuration from its requests' /completion timings."""
    draft_n = sum(t.get("draft_n", 0) for t in timings)
    accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
    return {"draft_n": draft_n, "draft_n_accepted": accepted, "acceptance": accepted / draft_n if draft_n else 0.0,
            "tps": 1000.0 * sum(t["predicted_n"] for t in timings) / sum(t["predicted_ms"] for t in timings)}


def run_config(args, name, extra, prompts, log_dir, target=None):
    """Greedy completions of every prompt on a fresh server; tokens, draft counts and decode speed."""
    with start(args, target or args.target, extra, log_dir, name) as server:
        server.wait_healthy(args.startup_timeout)
        runs = [greedy(server, p, args.n_predict) for p in prompts]
    return {"tokens": [tokens for tokens, _ in runs], **summarize_run([timings for _, timings in runs])}


def judge_config(on, off, teacher_forced_top1, n_prompts):
    """A speculative configuration against the same server without MTP: (its metrics row,
    lossless, acceptance high enough)."""
    equal = sum(a == b for a, b in zip(on["tokens"], off["tokens"]))
    row = {"outputs_equal": equal, "teacher_forced_top1": round(teacher_forced_top1, 4),
           "draft_n": on["draft_n"], "draft_n_accepted": on["draft_n_accepted"],
           "acceptance": round(on["acceptance"], 4), "tps": round(on["tps"], 1),
           "speedup": round(on["tps"] / off["tps"], 3)}
    lossless = equal == n_prompts and teacher_forced_top1 >= THRESHOLDS["min_teacher_forced"]
    return row, lossless, on["acceptance"] >= THRESHOLDS["min_acceptance"]


def teacher_forced(args, extra, prompts, outputs, log_dir, name):
    """Fraction of positions where the MTP-on token is the target's greedy token after the MTP-on prefix."""
    with start(args, args.target, extra, log_dir, name) as server:
        server.wait_healthy(args.startup_timeout)
        agree = total = 0
        for p, out in zip(prompts, outputs):
            prefix = server.tokenize(p, add_special=True)
            for tok in out:
                nxt, _ = greedy(server, prefix, 1, cache_prompt=True)
                agree += int(nxt == [tok])
                total += 1
                prefix = prefix + [tok]
    return agree / total


def judge_refusal(exit_code, log_text, expect):
    """A bad head must be refused at load: a normal exit with a status (never a signal such as an
    abort or a segfault, never a server left running) and a log line naming the problem."""
    lines = [ln for ln in log_text.splitlines() if expect in ln]
    return {"exit_code": exit_code, "line": lines[0][:300] if lines else None,
            "ok": exit_code is not None and 0 < exit_code < 128 and bool(lines)}


def bad_inputs(args, work):
    """Files a user could pass by mistake, each with the start-up line the server must refuse it with."""
    import numpy as np

    import gguf

    rng = np.random.default_rng(0)
    reader = gguf.GGUFReader(args.assistant_centroid)
    shapes = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    n_embd, n_centroids = shapes["masked_embd_centroids.weight"]
    n_vocab = shapes["masked_embd_ordering"][0]
    ordering = np.array(reader.get_tensor([t.name for t in reader.tensors].index("masked_embd_ordering")).data)

    cases = {}

    # a head trained for a target of another width: its projections are consistent with each other
    pre = shapes["nextn.pre_projection.weight"]   # [2 * n_bb, n_embd]
    n_bb = pre[0] // 2
    wrong_bb = 2 * n_bb  # not the head's own width either (upstream refuses that with its own message)
    arch = "gemma4-assistant"
    path = os.path.join(work, "width.gguf")
    rewrite(gguf, args.assistant, path, drop_kv=(f"{arch}.embedding_length_out",),
            kv={f"{arch}.embedding_length_out": (wrong_bb, gguf.GGUFValueType.UINT32)}, tensors={
                "nextn.pre_projection.weight": rng.standard_normal((n_embd, 2 * wrong_bb), dtype=np.float32),
                "nextn.post_projection.weight": rng.standard_normal((wrong_bb, n_embd), dtype=np.float32)})
    cases["width_mismatch"] = (path, f"target of width {wrong_bb}")

    path = os.path.join(work, "centroids.gguf")
    rewrite(gguf, args.assistant_centroid, path, tensors={
        "masked_embd_centroids.weight": rng.standard_normal((n_centroids + 1, n_embd), dtype=np.float32)})
    cases["centroids_not_dividing_vocab"] = (path, "do not divide the vocabulary")

    path = os.path.join(work, "ordering_dup.gguf")
    dup = ordering.copy()
    dup[1] = dup[0]
    rewrite(gguf, args.assistant_centroid, path, tensors={"masked_embd_ordering": dup.astype(np.int32)})
    cases["ordering_not_permutation"] = (path, "not a permutation")

    path = os.path.join(work, "ordering_short.gguf")
    rewrite(gguf, args.assistant_centroid, path,
            tensors={"masked_embd_ordering": ordering[:n_vocab - 1].astype(np.int32)})
    cases["ordering_wrong_length"] = (path, "masked_embd_ordering")

    cases["missing_file"] = (os.path.join(work, "no-such-head.gguf"), "no-such-head.gguf")

    results = {}
    for name, (path, expect) in cases.items():
        with LlamaServer(args.server, args.target, ["-c", "512", "-ngl", str(args.ngl), "-fa", "on",
                                                    "--mtp-head", path, "--spec-type", "mtp"],
                         os.path.join(work, f"bad-{name}.log")) as server:
            rc = server.wait_exit(args.startup_timeout)
            results[name] = judge_refusal(rc, server.log_text(), expect)
        program_log(f"bad input {name}: exit {rc}, line: {results[name]['line']}")
    return results


def check(args):
    with open(args.text, errors="replace") as f:
        text = f.read()
    if args.text_chars:
        text = text[:args.text_chars]  # the part of the text the fixture was trained on
    prompts = make_prompts(text, args.prompts, args.prompt_chars)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="gate-mtp-")
    os.makedirs(log_dir, exist_ok=True)
    sys.path.insert(0, args.gguf_py)
    import gguf

    if not args.assistant_fork:
        args.assistant_fork = os.path.join(log_dir, "assistant-fork.gguf")
        to_fork_format(gguf, args.assistant_centroid, args.assistant_fork)
    metrics = {"gate": GATE, "log_dir": log_dir, "ngl": args.ngl, "n_prompts": len(prompts),
               "n_predict": args.n_predict, "thresholds": THRESHOLDS}
    checks = {}
    try:
        mtp = ["-md", args.assistant, "--spec-type", "draft-mtp", "--spec-draft-n-max", str(args.draft_max),
               "-ngld", str(args.ngl)]
        fork = ["--mtp-head", args.assistant_fork, "--spec-type", "mtp", "--draft-block-size", "3",
                "--draft-max", "8", "--draft-min", "0", "-ngld", "99"] + TURBO
        configs = {
            "f16": ([], {"dense": mtp,
                         "centroid": ["-md", args.assistant_centroid] + mtp[2:]}),
            "turbo3": (TURBO, {"dense": mtp,
                               "fork_line": fork}),
        }
        for kv, (kv_args, variants) in configs.items():
            off = run_config(args, f"{kv}-off", kv_args, prompts, log_dir)
            metrics[f"{kv}_off_tps"] = round(off["tps"], 1)
            for variant, extra in variants.items():
                key = f"{kv}_{variant}"
                on = run_config(args, key, kv_args + extra, prompts, log_dir)
                tf = teacher_forced(args, kv_args, prompts, on["tokens"], log_dir, f"{key}-tf")
                metrics[key], checks[f"{key}_lossless"], checks[f"{key}_acceptance"] = judge_config(
                    on, off, tf, len(prompts))
                program_log(f"{key}: {metrics[key]}")
        # the fork-format file holds the centroid head's weights: the same drafts, token for token
        fmt = run_config(args, "f16-fork-format", ["--mtp-head", args.assistant_fork, "--spec-type", "mtp",
                                                   "--spec-draft-n-max", str(args.draft_max),
                                                   "-ngld", str(args.ngl)], prompts, log_dir)
        same = run_config(args, "f16-centroid-again", ["-md", args.assistant_centroid] + mtp[2:], prompts, log_dir)
        metrics["fork_format_same_drafts"] = (fmt["tokens"] == same["tokens"]
                                              and fmt["draft_n_accepted"] == same["draft_n_accepted"]
                                              and fmt["draft_n"] == same["draft_n"])
        checks["fork_format_loads_same"] = metrics["fork_format_same_drafts"]

        if args.twin_ff:
            # decode speed on a target that costs what a real one does: the fixture target with every FFN
            # widened by zeros (pad_mtp_target.py) computes the same function, so the assistant
            # drafts for it unchanged; reported, not judged
            twin = os.path.join(log_dir, "target-twin.gguf")
            pad_target(gguf, args.target, twin, args.twin_ff)
            metrics["twin"] = {"n_ff": args.twin_ff, "rounds": args.twin_rounds}
            # (n_max, p_min) per K/V type: turbo3 K makes the head less sure of itself (acceptance ~0.65 at
            # n_max 3), so it is also measured drafting only tokens the head gives p >= 0.8 (--spec-draft-p-min)
            drafts = {"f16": [(3, 0.0), (8, 0.0)], "turbo3": [(2, 0.0), (3, 0.0), (8, 0.8)]}
            for kv, kv_args in (("f16", []), ("turbo3", TURBO)):
                # off and on alternate, and each keeps its fastest round: a busy machine slows rounds, not ratios
                runs = {}
                for r in range(args.twin_rounds):
                    runs.setdefault("off", []).append(run_config(args, f"twin-{kv}-off-{r}", kv_args, prompts, log_dir, twin))
                    for n_max, p_min in drafts[kv]:
                        runs.setdefault((n_max, p_min), []).append(run_config(
                            args, f"twin-{kv}-on-{n_max}-{p_min}-{r}",
                            kv_args + ["-md", args.assistant, "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_max),
                                       "--spec-draft-p-min", str(p_min), "-ngld", str(args.ngl)],
                            prompts, log_dir, twin))
                off_tps = max(run["tps"] for run in runs["off"])
                metrics["twin"][f"{kv}_off_tps"] = round(off_tps, 1)
                for n_max, p_min in drafts[kv]:
                    on = runs[(n_max, p_min)][0]
                    on_tps = max(run["tps"] for run in runs[(n_max, p_min)])
                    key = f"{kv}_n_max_{n_max}" + (f"_p_min_{p_min}" if p_min else "")
                    metrics["twin"][key] = {
                        "outputs_equal": sum(a == b for a, b in zip(on["tokens"], runs["off"][0]["tokens"])),
                        "acceptance": round(on["acceptance"], 4), "tps": round(on_tps, 1),
                        "speedup": round(on_tps / off_tps, 3),
                        "speedup_per_round": [round(a["tps"] / b["tps"], 3)
                                              for a, b in zip(runs[(n_max, p_min)], runs["off"])]}
            program_log(f"twin: {metrics['twin']}")

        if args.bad_input:
            bad = bad_inputs(args, log_dir)
            metrics["bad_input"] = bad
            checks["bad_input_refused"] = all(b["ok"] for b in bad.values())
        ok = all(checks.values())
    except Exception as e:  # the verdict says what broke; logs stay in log_dir
        program_log(f"error: {e!r}")
        metrics["error"] = repr(e)
        ok = False
    metrics["checks"] = checks
    metrics["ok"] = ok
    if ok and not args.log_dir:
        shutil.rmtree(log_dir, ignore_errors=True)
        metrics["log_dir"] = None
    elif args.log_dir:  # the logs stay in the folder asked for; the GGUF files made for the run go
        for name in os.listdir(log_dir):
            if name.endswith(".gguf"):
                os.remove(os.path.join(log_dir, name))
    return metrics


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="path to llama-server")
    ap.add_argument("--target", required=True, help="gemma4 target GGUF")
    ap.add_argument("--assistant", required=True, help="gemma4-assistant GGUF, dense LM head")
    ap.add_argument("--assistant-centroid", required=True, help="gemma4-assistant GGUF with a centroid LM head")
    ap.add_argument("--assistant-fork", help="the centroid head as the fork's converter writes it "
                    "(default: written from --assistant-centroid by gguf_rewrite.py's fork format)")
    ap.add_argument("--text", required=True, help="text the prompts are cut from")
    ap.add_argument("--text-chars", type=int, default=0, help="cut prompts from the first N characters only")
    ap.add_argument("--gguf-py", required=True, help="gguf-py folder of the vendored tree")
    ap.add_argument("--ngl", type=int, default=0, help="-ngl / -ngld (99 on a GPU build)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-chars", type=int, default=160)
    ap.add_argument("--n-predict", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=3, help="--spec-draft-n-max of the upstream-flag runs")
    ap.add_argument("--twin-rounds", type=int, default=2, help="alternating off/on rounds of the twin; the fastest counts")
    ap.add_argument("--twin-ff", type=int, default=16384,
                    help="FFN width of the speed twin of the target (0: no speed measurement)")
    ap.add_argument("--no-bad-input", dest="bad_input", action="store_false")
    ap.add_argument("--startup-timeout", type=float, default=120)
    ap.add_argument("--log-dir", help="folder for the server logs, kept (default: a temporary folder, removed "
                    "when the gate passes)")
    ap.add_argument("--json", action="store_true", help="print the verdict as one compact JSON line")
    args = ap.parse_args(argv)
    if args.twin_rounds < 1:
        ap.error("--twin-rounds must be at least 1")
    return args


def main():
    args = parse_args()
    run_program(lambda: check(args), args.json)


if __name__ == "__main__":
    main()
