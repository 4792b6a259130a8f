#!/usr/bin/env python3
"""Gate `shared-pool`: shared read-only prompt-prefix pool across llama-server slots.

Starts llama-server (127.0.0.1, free port) with `--parallel 9 --kv-unified`, prefills a
~1k-token document with a needle into a pool slot, lets agents attend that single copy
through `shared_pool_slot` / `shared_prefix_n_tokens`, and checks correctness, isolation,
memory (KV cells from /metrics), fallback, errors and load.

Memory is read from the `llamacpp:kv_cells*` gauges of /metrics (cache 0 = full-attention cache,
1 = SWA cache). Shared: peak used cells while N sharers run against one pool. Naive: the pool's KV
state is restored into N slots (real copies, no compute) and the added used cells are measured;
the private cells of the agents (suffix + generated, measured in the shared run) are added.

Server logs stay in --log-dir (the gate's record folder when polyforge runs it; a new temporary
folder otherwise), reported as log_dir in the metrics.
Stdlib + polyforge's llama-server harness (polyforge.gates.server). Prints one verdict JSON on
stdout, logs on stderr; exit 0 only when ok.
"""

import argparse
import math
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from polyforge.gates.server import LlamaServer, program_log, run_program

GATE = "shared-pool"

THRESHOLDS = {
    "n_agents": 8,
    "max_abs_dprob_same_structure": 0.0,   # same batch structure: bit-exact
    # vs a cold full-prompt run the batch structure differs (doc+suffix split into other ubatches), which
    # perturbs the logits in upstream llama.cpp too: the same-structure reference without sharing is
    # bit-identical to the shared run, so these bound upstream batching noise, not the sharing
    "max_abs_dprob_cold": 0.15,            # |p_top1(shared) - p_top1(cold)| before the first divergence
    "near_tie_margin": 0.15,               # a top-1 flip vs cold is tolerated only if top1 - top2 < this
    "min_prefix_cell_ratio_n32": 30.0,     # document cells: naive N copies vs one shared copy
    "min_total_cell_ratio_vs_ideal": 0.95, # measured total ratio / ideal N(P+s)/(P+Ns)
}

AGENTS = ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel"]
LOCKERS = [8213, 5527, 6391, 7048, 2964, 4183, 9752, 3606]
NEEDLE_CODE = 4719


def make_document(n_sections):
    places = ["northern depot", "river terminal", "eastern warehouse", "hill station", "harbor office",
              "southern yard", "central archive", "western gate", "old mill", "signal tower"]
    goods = ["copper wire", "grain sacks", "glass panels", "tool kits", "paper rolls",
             "oil drums", "timber beams", "cotton bales", "steel pipes", "salt blocks"]
    paras = ["Quarterly field report of the Harrow Logistics cooperative. This document summarizes "
             "deliveries, inspections and incidents recorded by the regional coordinators."]
    for k in range(n_sections):
        p, g = places[k % len(places)], goods[(k * 3) % len(goods)]
        paras.append(
            f"Section {k + 1}. The {p} received {120 + 17 * k} crates of {g} during week {k % 13 + 1}. "
            f"Inspector {['Moreau', 'Tanaka', 'Okafor', 'Lindqvist', 'Rossi'][k % 5]} noted that "
            f"{(k * 7) % 23 + 2} crates were damaged and sent back for repair. Storage levels stayed "
            f"at {55 + (k * 11) % 40} percent and no further action was required.")
        if k == n_sections // 2:
            paras.append(f"Security notice: the vault access code is {NEEDLE_CODE}. "
                         "It must not be written on any other document.")
    # the suffixes start with the agent name, so that two prompts never share more than the document
    return "\n\n".join(paras) + "\n\n"


def make_suffix(i):
    name, locker = AGENTS[i], LOCKERS[i]
    memo = f"{name} private memo: your locker number is {locker}.\n"
    if i % 2 == 0:
        q = "Question: What is the vault access code in the report?\nAnswer:"
    else:
        other = AGENTS[(i + 1) % len(AGENTS)]
        q = f"Question: What is the locker number of agent {other}?\nAnswer:"
    return memo + q


def parse_kv_cells(metrics_text):
    """The `llamacpp:kv_cells*` gauges of a /metrics scrape: {metric: {cache: value}}."""
    res = {}
    for line in metrics_text.splitlines():
        if line.startswith("llamacpp:kv_cells"):
            name, val = line.split(" ")
            metric, label = name[len("llamacpp:"):].split("{")
            cache = int(label.split('"')[1])
            res.setdefault(metric, {})[cache] = int(float(val))
    return res


class PoolServer(LlamaServer):
    """llama-server with /metrics and a slot-save folder (the naive baseline restores slots). LLAMA_KV_CACHE_DEBUG=1:
    the KV cache compares each KQ mask built from the cells that several slots' sequences share (0077) with the
    general loop's and aborts on a difference, so the agents' batches here check that shortcut too."""

    def __init__(self, binary, model, args, log_path, slot_dir):
        super().__init__(binary, model, ["--metrics", "--slot-save-path", slot_dir + "/"] + list(args), log_path,
                         env={"LLAMA_KV_CACHE_DEBUG": "1"})

    def kv_cells(self):
        """Scrape /metrics: {metric: {cache: value}}; the scrape also resets kv_cells_used_max."""
        st, text = self.get("/metrics")
        assert st == 200, text
        return parse_kv_cells(text)

    def slot(self, id_slot):
        st, r = self.get("/slots")
        assert st == 200, r
        return next(s for s in r if s["id"] == id_slot)


def top_probs(res):
    """per generated token: (top1 id, top1 prob, top2 prob)"""
    out = []
    for tok in res.get("completion_probabilities", []):
        tops = tok.get("top_logprobs") or tok.get("top_probs") or []
        ps = [(t["id"], math.exp(t["logprob"]) if "logprob" in t else t["prob"]) for t in tops]
        ps.sort(key=lambda x: -x[1])
        out.append((ps[0][0], ps[0][1], ps[1][1] if len(ps) > 1 else 0.0))
    return out


def compare_probs(a, b, margin, info=None):
    """compare top-1 along the common prefix: (max |dp| before divergence, flipped, flip_is_near_tie)"""
    dmax = 0.0
    for k, ((ia, pa, qa), (ib, pb, qb)) in enumerate(zip(a, b)):
        if ia != ib:
            if info is not None:
                info.update(max_dp=round(dmax, 4), flip_at=k, margins=[round(pa - qa, 4), round(pb - qb, 4)])
            return dmax, True, (pa - qa) < margin or (pb - qb) < margin
        dmax = max(dmax, abs(pa - pb))
    if info is not None:
        info.update(max_dp=round(dmax, 4), flip_at=None)
    return dmax, False, False


def verdict(metrics, checks):
    """ok only when checks ran and every one held."""
    return {"gate": GATE, "ok": bool(checks) and all(checks.values()), "metrics": {**metrics, "checks": checks},
            "thresholds": THRESHOLDS}


def check(args):
    metrics, checks = {}, {}
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="gate-shared-pool-")
    slot_dir = os.path.join(log_dir, "slots")
    shutil.rmtree(slot_dir, ignore_errors=True)  # a killed earlier run's saved KV state
    os.makedirs(slot_dir)
    metrics["log_dir"] = log_dir
    extra = shlex.split(args.extra_args) if args.extra_args else []
    servers = []
    t_gate = time.time()

    def start(name, parallel, ctx, more=(), kv_unified=True):
        a = ["--parallel", str(parallel), "-c", str(ctx)] + (["--kv-unified"] if kv_unified else []) + list(more) + extra
        s = PoolServer(args.server, args.model, a, os.path.join(log_dir, f"{name}.log"), slot_dir)
        program_log(f"start {name}: {' '.join(shlex.quote(c) for c in s.argv)}")
        servers.append(s)
        s.start()
        s.wait_healthy(args.startup_timeout)
        return s

    def check(name, ok, detail=None):
        checks[name] = bool(ok)
        if detail is not None:
            metrics.setdefault("details", {})[name] = detail
        program_log(("PASS " if ok else "FAIL ") + name + ("" if detail is None else f": {detail}"))

    G = args.n_gen  # tokens generated per agent in the correctness runs

    def cmpl(srv, tokens, **kw):
        body = {"prompt": tokens, "n_predict": G, "temperature": 0.0, "cache_prompt": True, "n_probs": 3,
                "return_tokens": True}
        body.update(kw)
        st, r = srv.post_json("/completion", body)
        return st, r

    def run_concurrent(srv, bodies, path="/completion"):
        with ThreadPoolExecutor(max_workers=len(bodies)) as ex:
            return list(ex.map(lambda b: srv.post_json(path, b), bodies))

    def slot_action(srv, id_slot, action, filename=None):
        st, r = srv.post_json(f"/slots/{id_slot}?action={action}", {"filename": filename} if filename else {})
        assert st == 200, (action, r)
        return r

    def tdict(r, keys=("cache_n", "prompt_n", "predicted_n", "shared_n", "shared_fallback",
                       "shared_kv_cells", "shared_kv_cells_shared")):
        t = r.get("timings", {}) if isinstance(r, dict) else {}
        return {k: t.get(k) for k in keys if k in t}

    def naive_doc_cells(srv, n):
        """restore the saved pool into slots 1..n (real copies, no compute), return the added used cells"""
        before = srv.kv_cells()["kv_cells_used"]
        for i in range(1, n + 1):
            slot_action(srv, i, "restore", "pool.bin")
        kv = srv.kv_cells()
        for i in range(1, n + 1):
            slot_action(srv, i, "erase")
        return {c: kv["kv_cells_used"][c] - before[c] for c in kv["kv_cells_used"]}, kv["kv_cells"][0]

    try:
        # ------------------------------------------------------------------ main server
        S1 = start("main", 9, args.ctx)

        # a document of about args.doc_tokens tokens with a needle in the middle
        n_sec = 8
        while True:
            doc = make_document(n_sec)
            doc_tok = S1.tokenize(doc, True)
            if len(doc_tok) >= args.doc_tokens or n_sec > 200:
                break
            n_sec += 1
        P = len(doc_tok)
        suf_tok = [S1.tokenize(make_suffix(i), False) for i in range(len(AGENTS))]
        prompts = [doc_tok + s for s in suf_tok]
        metrics["P"] = P
        metrics["suffix_n"] = [len(s) for s in suf_tok]
        program_log(f"document: {P} tokens, suffixes: {metrics['suffix_n']}")
        POOL = 0
        share = {"shared_pool_slot": POOL, "shared_prefix_n_tokens": P}

        # ---------------------------------------------------------------- errors (HTTP 400)
        errs = {}
        errs["pool_out_of_range"] = cmpl(S1, prompts[0], shared_pool_slot=99, shared_prefix_n_tokens=P)
        errs["pool_eq_id_slot"] = cmpl(S1, prompts[0], id_slot=POOL, **share)
        errs["p_zero"] = cmpl(S1, prompts[0], shared_pool_slot=POOL, shared_prefix_n_tokens=0)
        errs["p_ge_prompt"] = cmpl(S1, prompts[0], shared_pool_slot=POOL, shared_prefix_n_tokens=len(prompts[0]))
        errs["chat_p_ge_prompt"] = S1.post_json("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "shared_pool_slot": POOL, "shared_prefix_n_tokens": 100000})
        for k, (st, r) in errs.items():
            msg = r.get("error", {}).get("message", "") if isinstance(r, dict) else str(r)
            check(f"error_400_{k}", st == 400, f"{st}: {msg}")

        # ---------------------------------------------------------------- pool prefill
        st, r = cmpl(S1, doc_tok, id_slot=POOL, n_predict=0)
        assert st == 200, r
        pool_prompt_n = r["timings"]["prompt_n"]
        pool_slot0 = S1.slot(POOL)
        kv0 = S1.kv_cells()
        metrics["pool_prompt_n"] = pool_prompt_n
        check("pool_prefill", pool_slot0["n_prompt_tokens"] == P and kv0["kv_cells_used"][0] == P,
              {"n_prompt_tokens": pool_slot0["n_prompt_tokens"], "kv_cells_used": kv0["kv_cells_used"]})
        slot_action(S1, POOL, "save", "pool.bin")  # used to restore the pool / make naive copies without compute

        # ---------------------------------------------------------------- agents, one at a time
        shared_res = []
        for i, p in enumerate(prompts):
            st, r = cmpl(S1, p, **share)
            assert st == 200, r
            shared_res.append(r)
            t = r["timings"]
            s_i = len(suf_tok[i])
            ok = (t["cache_n"] == P and t["prompt_n"] == s_i and t.get("shared_n") == P
                  and r["id_slot"] != POOL
                  # cell-level isolation: the sequence holds exactly the pool prefix + its own tokens
                  # (the last sampled token is never decoded)
                  and t.get("shared_kv_cells") == P + s_i + t["predicted_n"] - 1
                  and t.get("shared_kv_cells_shared") == P)
            check(f"agent{i}_shared", ok, tdict(r))
        metrics["agent_text"] = [r["content"] for r in shared_res]

        sum_prompt_n = pool_prompt_n + sum(r["timings"]["prompt_n"] for r in shared_res)
        metrics["sum_prompt_n"] = sum_prompt_n
        metrics["naive_sum_prompt_n"] = sum(len(p) for p in prompts)
        check("sum_prompt_n", sum_prompt_n == P + sum(len(s) for s in suf_tok),
              {"sum": sum_prompt_n, "P_plus_suffixes": P + sum(len(s) for s in suf_tok),
               "naive": metrics["naive_sum_prompt_n"]})

        # text isolation: no agent mentions a locker number that only exists in another agent's suffix
        leaks = [(i, j) for i, r in enumerate(shared_res) for j, lk in enumerate(LOCKERS)
                 if j != i and str(lk) in r["content"]]
        check("isolation_text", not leaks, {"leaks": leaks})
        metrics["needle_found"] = sum(str(NEEDLE_CODE) in shared_res[i]["content"] for i in range(0, 8, 2))

        slot_after = S1.slot(POOL)
        kv1 = S1.kv_cells()
        check("pool_unchanged_after_agents",
              slot_after["n_prompt_tokens"] == P and slot_after.get("id_task") == pool_slot0.get("id_task")
              and kv1["kv_cells_used"][0] == P and kv1["kv_cells_shared"][0] == 0,
              {"n_prompt_tokens": slot_after["n_prompt_tokens"], "kv_cells_used": kv1["kv_cells_used"],
               "kv_cells_shared": kv1["kv_cells_shared"]})

        # ---------------------------------------------------------------- concurrent agents (N = 8)
        g8 = 4
        S1.kv_cells()  # reset the peak
        conc = run_concurrent(S1, [dict(prompt=p, n_predict=g8, temperature=0.0, ignore_eos=True, **share)
                                   for p in prompts])
        kvc = S1.kv_cells()
        ok = all(st == 200 and r["timings"]["cache_n"] == P and r["timings"].get("shared_kv_cells_shared", -1) >= P
                 and r["timings"].get("shared_kv_cells") == P + len(suf_tok[i]) + r["timings"]["predicted_n"] - 1
                 for i, (st, r) in enumerate(conc))
        shared_peak_8 = kvc["kv_cells_used_max"][0]
        priv_8 = sum(len(s) + g8 - 1 for s in suf_tok)
        check("concurrent_agents_n8", ok and shared_peak_8 <= P + priv_8,
              {"peak_used": kvc["kv_cells_used_max"], "bound_base": P + priv_8,
               "agents": [tdict(r, ("cache_n", "shared_kv_cells", "shared_kv_cells_shared")) for _, r in conc]})

        # a non-sharing request with the same document while sharers run: similarity routing must not take
        # the pool, and idle slot clearing at its launch must not evict it. It is sent once a sharer is seen
        # running, not after a fixed delay: on a GPU the sharers can be done before any delay ends, and an idle
        # pool with no sharers may be reused by design.
        intr = {}

        def intruder():
            deadline = time.time() + 60
            while time.time() < deadline:
                st, slots = S1.get("/slots")
                if st == 200 and any(s["id"] != POOL and s.get("is_processing") for s in slots):
                    break
                time.sleep(0.01)
            intr["res"] = S1.post_json("/completion", dict(prompt=doc_tok + S1.tokenize("\n\nSummary:", False),
                                                      n_predict=2, temperature=0.0))
        th = threading.Thread(target=intruder)
        th.start()
        conc2 = run_concurrent(S1, [dict(prompt=p, n_predict=64, temperature=0.0, ignore_eos=True, **share)
                                    for p in prompts[:4]])
        th.join()
        st, r = intr["res"]
        slot_after = S1.slot(POOL)
        check("pool_protected_from_similarity_and_idle_clearing",
              st == 200 and r["id_slot"] != POOL and all(c[1]["timings"].get("shared_n") == P for c in conc2)
              and slot_after["n_prompt_tokens"] == P and slot_after.get("id_task") == pool_slot0.get("id_task"),
              {"intruder_slot": r.get("id_slot"), "pool_n_prompt_tokens": slot_after["n_prompt_tokens"]})

        # ---------------------------------------------------------------- load: 64 concurrent sharers
        n_load = args.load
        t0 = time.time()
        load = run_concurrent(S1, [dict(prompt=prompts[i % 8], n_predict=2, temperature=0.0, ignore_eos=True,
                                        **share) for i in range(n_load)])
        t_load = time.time() - t0
        kvl = S1.kv_cells()
        slot_after = S1.slot(POOL)
        n_ok = sum(1 for st, r in load if st == 200 and r["timings"].get("shared_n") == P)
        st_h, _ = S1.get("/health")
        check("load", n_ok == n_load and S1.alive() and st_h == 200 and kvl["kv_cells_used"][0] == P
              and kvl["kv_cells_shared"][0] == 0 and slot_after["n_prompt_tokens"] == P,
              {"ok": n_ok, "n": n_load, "seconds": round(t_load, 1), "used_after": kvl["kv_cells_used"],
               "shared_after": kvl["kv_cells_shared"], "peak_used": kvl["kv_cells_used_max"]})

        # ---------------------------------------------------------------- naive copies at N = 8
        naive8, cells_total_8 = naive_doc_cells(S1, 8)
        check("naive_copies_n8", naive8[0] == 8 * P, {"added_used": naive8})

        # ---------------------------------------------------------------- chat endpoint
        # note: these launches happen while pool 0 has no sharers, so idle slot clearing (upstream
        #       behaviour, --no-cache-idle-slots disables it) evicts pool 0
        msgs = [[{"role": "user", "content": doc + make_suffix(i)}] for i in (0, 1)]
        POOL_CHAT = 8
        # 1. a chat request on the chat pool slot tells how the server tokenizes the chat prompt
        st, r = S1.post_json("/v1/chat/completions", {"messages": msgs[0], "max_tokens": 1, "temperature": 0.0,
                                                 "id_slot": POOL_CHAT})
        n_chat = r["usage"]["prompt_tokens"]
        tmpl = [S1.post_json("/apply-template", {"messages": m})[1]["prompt"] for m in msgs]
        variants = [[S1.tokenize(t, add) for t in tmpl] for add in (True, False)]
        ta, tb = next((v for v in variants if len(v[0]) == n_chat), variants[0])
        Pc = next(k for k in range(min(len(ta), len(tb))) if ta[k] != tb[k])
        # 2. the chat pool holds exactly the common prefix of the two chat prompts
        st, _ = cmpl(S1, ta[:Pc], id_slot=POOL_CHAT, n_predict=0)
        # 3. a chat request that shares it
        st, r = S1.post_json("/v1/chat/completions", {"messages": msgs[1], "max_tokens": 8, "temperature": 0.0,
                                                 "shared_pool_slot": POOL_CHAT, "shared_prefix_n_tokens": Pc})
        t = r.get("timings", {}) if isinstance(r, dict) else {}
        check("chat_shared", st == 200 and t.get("shared_n") == Pc and t.get("cache_n") == Pc,
              {"status": st, "P_chat": Pc, "timings": tdict(r)})

        # ---------------------------------------------------------------- fallback
        # (a) evicted pool
        slot_action(S1, POOL, "erase")
        st, fb_evict = cmpl(S1, prompts[0], **share)
        # (b) mismatching prefix: the pool is restored, one document token of the prompt differs
        slot_action(S1, POOL, "restore", "pool.bin")
        bad = list(prompts[2])
        bad[P // 2] = doc_tok[P // 2 + 1]
        st_b, fb_mis = cmpl(S1, bad, n_predict=1, **share)
        warned = "cannot share" in S1.log_text()

        # ---------------------------------------------------------------- non-unified server: 400
        S0 = start("not-unified", 2, 2048, kv_unified=False)
        st, r = cmpl(S0, prompts[0][:64], shared_pool_slot=1, shared_prefix_n_tokens=32)
        check("error_400_not_unified", st == 400, r.get("error", {}).get("message") if isinstance(r, dict) else r)
        S0.stop()

        check("server_alive", S1.alive())
        S1.stop()

        # ---------------------------------------------------------------- references
        # (a) same batch structure: the document cached in the agent's slot, then the full prompt
        # (b) cold: the full prompt processed from scratch
        # the reference server has no RAM prompt cache (and so no idle slot clearing): the document stays in
        # the slot exactly as computed
        SR = start("reference", 9, args.ctx, ["--cache-ram", "0"])
        st, r = cmpl(SR, doc_tok, id_slot=1, n_predict=0)
        same, cold = [], []
        for i, p in enumerate(prompts):
            st, r = cmpl(SR, p, id_slot=1)
            assert st == 200, r
            same.append(r)
        for i, p in enumerate(prompts):
            st, r = cmpl(SR, p, id_slot=2, cache_prompt=False)
            assert st == 200, r
            cold.append(r)
        SR.stop()

        n_equal, n_struct, dmax_same, dmax_cold, flips, bad_flips = 0, 0, 0.0, 0.0, 0, 0
        for i in range(len(prompts)):
            a, b, c = shared_res[i], same[i], cold[i]
            n_struct += b["timings"]["cache_n"] == P and b["timings"]["prompt_n"] == len(suf_tok[i])
            n_equal += a["tokens"] == b["tokens"]
            d, _, _ = compare_probs(top_probs(a), top_probs(b), 0)
            dmax_same = max(dmax_same, d)
            info = {}
            d, flipped, near_tie = compare_probs(top_probs(a), top_probs(c), THRESHOLDS["near_tie_margin"], info)
            metrics.setdefault("cold_compare", []).append(info)
            dmax_cold = max(dmax_cold, d)
            flips += flipped
            bad_flips += flipped and not near_tie
        metrics.update({"text_equal_same_structure": n_equal, "max_dprob_same_structure": dmax_same,
                        "max_dprob_cold": round(dmax_cold, 6), "text_equal_cold": sum(
                            shared_res[i]["tokens"] == cold[i]["tokens"] for i in range(len(prompts))),
                        "near_tie_flips_vs_cold": flips, "non_near_tie_flips_vs_cold": bad_flips})
        check("reference_same_structure", n_struct == len(prompts), {"cache_n_P_and_prompt_n_s": n_struct})
        check("text_equal_same_structure", n_equal == len(prompts), {"equal": n_equal})
        check("probs_same_structure", dmax_same <= THRESHOLDS["max_abs_dprob_same_structure"], dmax_same)
        check("probs_vs_cold", dmax_cold <= THRESHOLDS["max_abs_dprob_cold"] and bad_flips == 0,
              {"max_dprob": dmax_cold, "flips": flips, "non_near_tie_flips": bad_flips})

        # the fallback is a cold run too: same tolerance as above (the cells lie elsewhere in the unified
        # cache, which can flip a near-tie)
        t = fb_evict["timings"]
        info = {}
        d, flipped, near_tie = compare_probs(top_probs(fb_evict), top_probs(cold[0]), THRESHOLDS["near_tie_margin"], info)
        check("fallback_evicted", t["cache_n"] == 0 and t.get("shared_n") == 0 and t.get("shared_fallback")
              and t["prompt_n"] == len(prompts[0]) and d <= THRESHOLDS["max_abs_dprob_cold"]
              and (not flipped or near_tie),
              dict(tdict(fb_evict), same_text_as_cold=fb_evict["tokens"] == cold[0]["tokens"], vs_cold=info))
        t = fb_mis["timings"]
        check("fallback_mismatch", st_b == 200 and t["cache_n"] == 0 and t.get("shared_n") == 0
              and "match" in (t.get("shared_fallback") or "") and t["prompt_n"] == len(bad), tdict(fb_mis))
        check("fallback_warning_logged", warned)

        # ---------------------------------------------------------------- memory
        gm = 2
        mem = {}

        def mem_entry(N, shared_peak, shared_peak_swa, naive_doc, naive_doc_swa, cells_total, extra_info):
            private = shared_peak - P  # measured: suffix + generated cells of the N sharers
            naive = naive_doc + private
            e = {"N": N, "shared_used": shared_peak, "naive_used": naive, "naive_doc_cells": naive_doc,
                 "private_cells": private, "ratio_total": round(naive / shared_peak, 2),
                 "ratio_ideal_bound": round(N * (P + private / N) / (P + private), 2),
                 "ratio_prefix_cells": round(naive_doc / P, 2),
                 "swa_shared_used": shared_peak_swa, "swa_naive_doc_cells": naive_doc_swa,
                 "kv_buffer_cells": cells_total}
            per_agent = private / N
            e["agents_fit_shared"] = int((cells_total - P) // per_agent)
            e["agents_fit_naive"] = int(cells_total // (P + per_agent))
            e.update(extra_info)
            return e

        mem[8] = mem_entry(8, shared_peak_8, kvc["kv_cells_used_max"].get(1), naive8[0], naive8.get(1),
                           cells_total_8, {"n_gen": g8})
        for N in [32] + ([64] if args.n64 else []):
            S = start(f"mem{N}", N + 1, (N + 1) * (P + 64))
            slot_action(S, 0, "restore", "pool.bin")
            S.kv_cells()
            t0 = time.time()
            res = run_concurrent(S, [dict(prompt=prompts[i % 8], n_predict=gm, temperature=0.0, ignore_eos=True,
                                          **share) for i in range(N)])
            t_sh = time.time() - t0
            kv = S.kv_cells()
            shared_ok = all(st == 200 and r["timings"].get("shared_n") == P for st, r in res)
            naive, cells_total = naive_doc_cells(S, N)
            S.stop()
            e = mem_entry(N, kv["kv_cells_used_max"][0], kv["kv_cells_used_max"].get(1), naive[0], naive.get(1),
                          cells_total, {"n_gen": gm, "seconds_shared": round(t_sh, 1)})
            mem[N] = e
            ok = (shared_ok and e["naive_doc_cells"] == N * P
                  and e["shared_used"] <= P + sum(len(suf_tok[i % 8]) + gm - 1 for i in range(N))
                  and e["ratio_total"] >= THRESHOLDS["min_total_cell_ratio_vs_ideal"] * e["ratio_ideal_bound"]
                  and (N != 32 or e["ratio_prefix_cells"] >= THRESHOLDS["min_prefix_cell_ratio_n32"]))
            check(f"memory_n{N}", ok, e)
        metrics["memory"] = {str(k): v for k, v in mem.items()}
    except BaseException as e:  # noqa: BLE001 - any failure (or SIGTERM) fails the gate
        import traceback
        traceback.print_exc(file=sys.stderr)
        checks["exception"] = False
        metrics["exception"] = f"{type(e).__name__}: {e}"
    finally:
        for s in servers:
            try:
                s.stop()
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(slot_dir, ignore_errors=True)  # saved KV state, the logs stay in log_dir

    metrics["seconds"] = round(time.time() - t_gate, 1)
    return verdict(metrics, checks)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="path to llama-server")
    ap.add_argument("--model", required=True, help="path to the GGUF model (Gemma 3 270M)")
    ap.add_argument("--json", action="store_true", help="print the verdict as one compact JSON line")
    ap.add_argument("--extra-args", default="", help="extra llama-server arguments")
    ap.add_argument("--log-dir", help="folder for the server logs (default: a new temporary folder)")
    ap.add_argument("--ctx", type=int, default=16384, help="context size of the main server (--parallel 9)")
    ap.add_argument("--n64", action="store_true", help="also measure memory at N = 64 (--parallel 65, slower)")
    ap.add_argument("--doc-tokens", type=int, default=1000, help="approximate document length in tokens")
    ap.add_argument("--n-gen", type=int, default=16, help="tokens generated per agent in the correctness runs")
    ap.add_argument("--load", type=int, default=64, help="number of concurrent sharer requests in the load test")
    ap.add_argument("--startup-timeout", type=float, default=120)
    ap.add_argument("--cold-tolerance", type=float, default=THRESHOLDS["max_abs_dprob_cold"],
                    help="bound on |p_top1(shared) - p_top1(cold)| before the first divergence; the "
                         "same-batch-structure comparison stays bit-exact whatever this is")
    ap.add_argument("--near-tie-margin", type=float, default=THRESHOLDS["near_tie_margin"],
                    help="a top-1 flip against a cold run (agents, fallback) is tolerated when top1 - top2 is "
                         "below this; 1.0 reports such flips without judging them")
    return ap.parse_args(argv)


def main():
    args = parse_args()
    THRESHOLDS["max_abs_dprob_cold"] = args.cold_tolerance
    THRESHOLDS["near_tie_margin"] = args.near_tie_margin
    run_program(lambda: check(args), args.json)


if __name__ == "__main__":
    main()
