"""perplexity-kld: llama-perplexity --kl-divergence-base with the base KV type, then
--kl-divergence once per KV configuration (-ctk/-ctv), against the base's saved logits.

params: model (required), text (under gates/, required), ctx (default 2048), chunks,
base (K/V, default f16/f16), configs (list of K/V, required), flags (extra arguments).
metrics: one mapping per configuration, "K/V": kld_mean, kld_p99, kld_max, top1 (same
top token, %), ppl, kv_mib (llama's KV cache size), bits_per_pair (K + V bits per element, from polyforge.kvtypes; absent for a type it lacks);
and "base": ppl, kv_mib, tokens.
"""

from __future__ import annotations

import re

from .. import schema
from ..errors import BadInput, VerificationFailed
from ._common import need_model, run_logged
from ..kvtypes import CHAIN_BITS, UPSTREAM_BITS, kv_pair

# the one table of bits per element (kvtypes): upstream's KV types and the chain's
BITS = {**UPSTREAM_BITS, **CHAIN_BITS}
_FLOAT = r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_PATTERNS = {
    "kld_mean": re.compile(r"^Mean\s+KLD:\s+" + _FLOAT, re.M),
    "kld_p99": re.compile(r"^99\.0%\s+KLD:\s+" + _FLOAT, re.M),
    "kld_max": re.compile(r"^Maximum KLD:\s+" + _FLOAT, re.M),
    "top1": re.compile(r"^Same top p:\s+" + _FLOAT, re.M),
    "ppl": re.compile(r"^Mean PPL\(Q\)\s+:\s+" + _FLOAT, re.M),
}
_FINAL_PPL = re.compile(r"Final estimate: PPL = " + _FLOAT)
_KV_SIZE = re.compile(r"llama_kv_cache[^:]*: size = \s*" + _FLOAT + r" MiB")


def _pair(text: str, where: str) -> str:
    if kv_pair(text) is None:
        raise BadInput(f"{where}: {text!r} is not a K/V type pair like q8_0/q4_0")
    return text


def validate_params(params: dict, where: str, models: tuple[str, ...]) -> dict:
    schema.only(params, {"model", "text", "ctx", "chunks", "base", "configs", "flags"}, where,
                section="params")
    model = need_model(params, where, models)
    configs = schema.str_list(params, "configs", where, section="params", required=True)
    out = {"model": model, "text": schema.need(params, "text", str, where, section="params"),
           "ctx": schema.optional(params, "ctx", int, where, 2048, section="params"),
           "chunks": schema.optional(params, "chunks", int, where, section="params"),
           "base": _pair(schema.optional(params, "base", str, where, "f16/f16", section="params"), where),
           "configs": [_pair(c, where) for c in configs],
           "flags": schema.str_list(params, "flags", where, section="params", numbers_as_text=True)}
    if len(set(out["configs"])) != len(out["configs"]):
        raise BadInput(f"{where}: params.configs repeat")
    return out


def kv_mib(text: str) -> float | None:
    """Sum of llama's KV cache sizes (one line per cache: Gemma 3 has a SWA one too)."""
    sizes = [float(m.group(1)) for m in _KV_SIZE.finditer(text)]
    return round(sum(sizes), 3) if sizes else None


def parse_kld(text: str) -> dict:
    out = {}
    for key, pattern in _PATTERNS.items():
        m = pattern.search(text)
        if m:
            out[key] = float(m.group(1))
    return out


def bits_per_pair(pair: str) -> float | None:
    k, v = pair.split("/")
    return BITS[k] + BITS[v] if k in BITS and v in BITS else None


def run(ctx) -> dict:
    p = ctx.gate.params
    exe = ctx.bin("llama-perplexity")
    model = ctx.model(p["model"])
    text = ctx.data(p["text"])
    base_file = ctx.work_dir / "base.kld"
    # -lv 4: llama's own info lines (the KV cache size) are below the default verbosity
    common = ["-m", model, "-c", str(p["ctx"]), "-lv", "4"] + (["--chunks", str(p["chunks"])] if p["chunks"] else [])
    common += [ctx.substitute(f) for f in p["flags"]]
    bk, bv = p["base"].split("/")
    metrics: dict = {}
    try:
        ctx.log(f"base {p['base']}: saving logits")
        done = run_logged([exe, *common, "-f", text, "-ctk", bk, "-ctv", bv, "--kl-divergence-base", base_file],
                          ctx.work_dir / "base.log", ctx.gate.timeout, env=ctx.env)
        output = done.stdout + done.stderr
        if done.returncode != 0:
            ctx.note_failed_command(done)
        if done.returncode != 0 or not base_file.is_file():
            raise VerificationFailed(f"llama-perplexity (base {p['base']}) failed with exit {done.returncode}: "
                                     f"{_last_error(output)} (log: {ctx.work_dir / 'base.log'})")
        final = _FINAL_PPL.search(output)
        metrics["base"] = {"ppl": float(final.group(1)) if final else None, "kv_mib": kv_mib(output),
                           "bits_per_pair": bits_per_pair(p["base"])}
        for pair in p["configs"]:
            k, v = pair.split("/")
            ctx.log(f"{pair}: KL divergence against {p['base']}")
            log = ctx.work_dir / f"{k}-{v}.log"
            done = run_logged([exe, *common, "-ctk", k, "-ctv", v, "--kl-divergence-base", base_file,
                               "--kl-divergence"], log, ctx.gate.timeout, env=ctx.env)
            output = done.stdout + done.stderr
            if done.returncode != 0:
                ctx.note_failed_command(done)
                raise VerificationFailed(f"llama-perplexity ({pair}) failed with exit {done.returncode}: "
                                         f"{_last_error(output)} (log: {log})")
            row = parse_kld(output)
            row["kv_mib"] = kv_mib(output)
            row["bits_per_pair"] = bits_per_pair(pair)
            metrics[pair] = {k2: v2 for k2, v2 in row.items() if v2 is not None}
    finally:
        base_file.unlink(missing_ok=True)  # n_vocab x tokens of logits: large, and per run
    return metrics


def _last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "error" in line.lower() or "failed" in line.lower():
            return line[:300]
    return lines[-1][:300] if lines else "no output"
