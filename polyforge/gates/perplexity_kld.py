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
from pathlib import Path
from typing import Callable

from .. import schema
from ..errors import BadInput, VerificationFailed
from ._common import need_model, run_logged
from ..kvtypes import bits_per_pair, kv_pair

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


def common_args(model, ctx: int, chunks: int | None, flags: list) -> list:
    """The arguments every llama-perplexity run of one measurement shares; -lv 4: llama's own info
    lines (the KV cache size) are below the default verbosity."""
    return ["-m", model, "-c", str(ctx), "-lv", "4"] + (["--chunks", str(chunks)] if chunks else []) + list(flags)


def save_base(exe, common: list, text, base: str, base_file: Path, log: Path, timeout: float, *,
              env: dict | None = None, on_failure: Callable = lambda done: None) -> dict:
    """llama-perplexity --kl-divergence-base with the base pair's KV types: the base's logits in
    base_file; its ppl, kv_mib and bits_per_pair."""
    bk, bv = base.split("/")
    done = run_logged([exe, *common, "-f", text, "-ctk", bk, "-ctv", bv, "--kl-divergence-base", base_file],
                      log, timeout, env=env)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        on_failure(done)
    if done.returncode != 0 or not Path(base_file).is_file():
        raise VerificationFailed(f"llama-perplexity (base {base}) failed with exit {done.returncode}: "
                                 f"{_last_error(output)} (log: {log})")
    final = _FINAL_PPL.search(output)
    return {"ppl": float(final.group(1)) if final else None, "kv_mib": kv_mib(output),
            "bits_per_pair": bits_per_pair(base)}


def measure_pair(exe, common: list, pair: str, base_file: Path, log: Path, timeout: float, *,
                 env: dict | None = None, on_failure: Callable = lambda done: None) -> dict:
    """llama-perplexity --kl-divergence with the pair's KV types against the base's logits: the
    pair's metrics (kld_mean, kld_p99, kld_max, top1, ppl, kv_mib, bits_per_pair; those found)."""
    k, v = pair.split("/")
    done = run_logged([exe, *common, "-ctk", k, "-ctv", v, "--kl-divergence-base", base_file, "--kl-divergence"],
                      log, timeout, env=env)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        on_failure(done)
        raise VerificationFailed(f"llama-perplexity ({pair}) failed with exit {done.returncode}: "
                                 f"{_last_error(output)} (log: {log})")
    row = parse_kld(output)
    row["kv_mib"] = kv_mib(output)
    row["bits_per_pair"] = bits_per_pair(pair)
    return {key: value for key, value in row.items() if value is not None}


def run(ctx) -> dict:
    p = ctx.gate.params
    exe = ctx.bin("llama-perplexity")
    common = common_args(ctx.model(p["model"]), p["ctx"], p["chunks"], [ctx.substitute(f) for f in p["flags"]])
    base_file = ctx.work_dir / "base.kld"
    metrics: dict = {}
    try:
        ctx.log(f"base {p['base']}: saving logits")
        metrics["base"] = save_base(exe, common, ctx.data(p["text"]), p["base"], base_file, ctx.work_dir / "base.log",
                                    ctx.gate.timeout, env=ctx.env, on_failure=ctx.note_failed_command)
        for pair in p["configs"]:
            k, v = pair.split("/")
            ctx.log(f"{pair}: KL divergence against {p['base']}")
            metrics[pair] = measure_pair(exe, common, pair, base_file, ctx.work_dir / f"{k}-{v}.log",
                                         ctx.gate.timeout, env=ctx.env, on_failure=ctx.note_failed_command)
    finally:
        base_file.unlink(missing_ok=True)  # n_vocab x tokens of logits: large, and per run
    return metrics


def _last_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "error" in line.lower() or "failed" in line.lower():
            return line[:300]
    return lines[-1][:300] if lines else "no output"
