"""`polyforge bench`: a llama-bench matrix over KV types (-ctk/-ctv pairs) x depths (-d) x
flag sets, with repetitions; writes JSON, a markdown table with ratios against a reference
KV type measured in the same run, and a PNG of decode t/s against depth per KV type.

Given the machine's memory bandwidth, each decode row also gets its bandwidth roofline: the bytes
a generated token reads (the weights, as llama-bench sizes them, plus the KV cache at the row's
mean depth, from the model's GGUF shape) and the fraction of bandwidth/bytes the row reached.

llama-bench crosses every list it is given, so each (KV pair, flag set) is one invocation
with the depth list; rows are keyed by (kv, flags, test, depth).
"""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import proc
from .errors import BadInput, EnvironmentProblem, VerificationFailed
from .gguf import read_metadata
from .kvtypes import CHAIN_BITS, UPSTREAM_BITS

_KV = re.compile(r"^([a-z0-9_]+)/([a-z0-9_]+)$")


@dataclass(frozen=True)
class BenchSpec:
    kv: tuple[str, ...]
    reference: str
    depths: tuple[int, ...]
    flag_sets: tuple[str, ...]
    n_prompt: int
    n_gen: int
    repetitions: int
    bandwidth_gbps: float | None = None  # memory bandwidth for the decode rooflines

    @staticmethod
    def make(kv: list[str], reference: str | None, depths: list[int], flag_sets: list[str] | None,
             n_prompt: int, n_gen: int, repetitions: int, bandwidth_gbps: float | None = None) -> "BenchSpec":
        pairs = [p.strip() for item in kv for p in item.split(",") if p.strip()]
        if not pairs:
            raise BadInput("--kv: give at least one K/V pair, e.g. f16/f16,q8_0/q8_0")
        for pair in pairs:
            if not _KV.match(pair):
                raise BadInput(f"--kv {pair}: not a K/V type pair like q8_0/q4_0")
        reference = reference or pairs[0]
        if reference not in pairs:
            pairs.insert(0, reference)  # the reference is measured in the same run
        if not depths or any(d < 0 for d in depths):
            raise BadInput("--depth: a list of non-negative depths")
        if repetitions < 1 or n_prompt < 0 or n_gen < 0 or (n_prompt == 0 and n_gen == 0):
            raise BadInput("-r must be >= 1, and -p or -n must be > 0")
        for flags in flag_sets or []:
            try:
                shlex.split(flags)
            except ValueError as exc:
                raise BadInput(f"--flags {flags!r}: {exc}") from None
        if bandwidth_gbps is not None and not bandwidth_gbps > 0:
            raise BadInput("--bandwidth takes a positive number of GB/s")
        return BenchSpec(tuple(dict.fromkeys(pairs)), reference, tuple(sorted(set(depths))),
                         tuple(flag_sets or [""]), n_prompt, n_gen, repetitions, bandwidth_gbps)


def test_name(row: dict) -> str:
    if int(row.get("n_gen", 0)) > 0 and int(row.get("n_prompt", 0)) == 0:
        return f"tg{row['n_gen']}"
    if int(row.get("n_prompt", 0)) > 0 and int(row.get("n_gen", 0)) == 0:
        return f"pp{row['n_prompt']}"
    return f"pp{row.get('n_prompt')}+tg{row.get('n_gen')}"


def parse_llama_bench(stdout: str) -> list[dict]:
    """llama-bench -o json prints one JSON array (after any log lines)."""
    start = stdout.find("[")
    if start < 0:
        return []
    try:
        data = json.loads(stdout[start:])
    except ValueError:
        return []
    return data if isinstance(data, list) else []


def run(bench_bin: Path, model: Path, spec: BenchSpec, out_dir: Path, *, timeout: float = 3600,
        log: Callable[[str], None] = lambda m: None) -> dict:
    shape = None
    if spec.bandwidth_gbps is not None:  # refuse what cannot be modelled before the runs
        shape = kv_shape(read_metadata(model))
        for pair in spec.kv:
            shape.bytes_per_token(*pair.split("/"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    started = time.monotonic()
    for flags in spec.flag_sets:
        for pair in spec.kv:
            k, v = pair.split("/")
            argv = [bench_bin, "-m", model, "-ctk", k, "-ctv", v, "-d", ",".join(map(str, spec.depths)),
                    "-p", str(spec.n_prompt), "-n", str(spec.n_gen), "-r", str(spec.repetitions), "-o", "json",
                    *shlex.split(flags)]
            log(f"llama-bench {pair} {flags}".rstrip())
            done = proc.run(argv, timeout=timeout)
            stem = f"{k}-{v}" + (f"-{re.sub(r'[^A-Za-z0-9]+', '_', flags).strip('_')}" if flags else "")
            (out_dir / f"{stem}.log").write_text(f"$ {' '.join(done.args)}\n{done.stdout}\n--- stderr\n{done.stderr}")
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise VerificationFailed(f"llama-bench failed for {pair} {flags}: {last} (log: {out_dir / (stem + '.log')})")
            results = parse_llama_bench(done.stdout)
            if not results:
                raise VerificationFailed(f"llama-bench printed no results for {pair} (log: {out_dir / (stem + '.log')})")
            for r in results:
                rows.append({"kv": pair, "flags": flags, "test": test_name(r), "depth": int(r.get("n_depth", 0)),
                             "avg_ts": float(r["avg_ts"]), "stddev_ts": float(r.get("stddev_ts", 0.0)),
                             "samples": len(r.get("samples_ts", [])) or spec.repetitions,
                             "n_gen": int(r.get("n_gen", 0)), "model_size": int(r.get("model_size", 0))})
    add_ratios(rows, spec.reference)
    if shape is not None:
        add_roofline(rows, shape, spec.bandwidth_gbps)
    result = {"reference": spec.reference, "bandwidth_gbps": spec.bandwidth_gbps, "spec": {"kv": list(spec.kv), "depths": list(spec.depths),
              "flags": list(spec.flag_sets), "n_prompt": spec.n_prompt, "n_gen": spec.n_gen,
              "repetitions": spec.repetitions}, "model": str(model), "rows": rows,
              "seconds": round(time.monotonic() - started, 1)}
    (out_dir / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "bench.md").write_text(markdown(result))
    result["files"] = {"json": str(out_dir / "bench.json"), "markdown": str(out_dir / "bench.md")}
    png = out_dir / "decode_vs_depth.png"
    if plot(result, png):
        result["files"]["png"] = str(png)
    return result


def add_ratios(rows: list[dict], reference: str) -> None:
    """ratio = avg_ts / the reference KV type's avg_ts at the same flags, test and depth."""
    ref = {(r["flags"], r["test"], r["depth"]): r["avg_ts"] for r in rows if r["kv"] == reference}
    for r in rows:
        base = ref.get((r["flags"], r["test"], r["depth"]))
        r["ratio"] = round(r["avg_ts"] / base, 4) if base else None


KV_BITS = {**UPSTREAM_BITS, **CHAIN_BITS}


@dataclass(frozen=True)
class KvShape:
    """What one cached token costs per layer: K and V values of every KV head."""
    n_head_kv: tuple[int, ...]  # per layer
    head_dim_k: int
    head_dim_v: int

    def bytes_per_token(self, type_k: str, type_v: str) -> float:
        for t in (type_k, type_v):
            if t not in KV_BITS:
                raise BadInput(f"--bandwidth: no size known for KV type {t}")
        per_layer_head = self.head_dim_k * KV_BITS[type_k] / 8 + self.head_dim_v * KV_BITS[type_v] / 8
        return sum(n * per_layer_head for n in self.n_head_kv)


def kv_shape(meta: dict) -> KvShape:
    """The KV shape from GGUF metadata; models whose layers do not all cache every token (sliding window)
    are refused, since their bytes per token do not follow from the depth."""
    arch = meta.get("general.architecture")
    key = lambda name: meta.get(f"{arch}.{name}")
    n_layer, n_embd, n_head = key("block_count"), key("embedding_length"), key("attention.head_count")
    if not isinstance(n_layer, int) or not isinstance(n_embd, int) or not n_head:
        raise BadInput(f"--bandwidth: the model's GGUF lacks {arch}.block_count/embedding_length/attention.head_count")
    if key("attention.sliding_window"):
        raise BadInput(f"--bandwidth: {arch} has sliding-window layers; its KV bytes per token are not modelled")
    n_head_kv = key("attention.head_count_kv") or n_head
    heads = [n_head_kv] * n_layer if isinstance(n_head_kv, int) else list(n_head_kv)
    n_head0 = n_head if isinstance(n_head, int) else max(n_head)
    head_dim_k = key("attention.key_length") or n_embd // n_head0
    head_dim_v = key("attention.value_length") or n_embd // n_head0
    if len(heads) != n_layer:
        raise BadInput(f"--bandwidth: head_count_kv has {len(heads)} entries for {n_layer} layers")
    return KvShape(tuple(heads), head_dim_k, head_dim_v)


def add_roofline(rows: list[dict], shape: KvShape, bandwidth_gbps: float) -> None:
    """For decode rows: bytes read per generated token (weights + KV at the mean depth of the test),
    the t/s that bandwidth_gbps allows, and the fraction of it reached."""
    for r in rows:
        if not r["test"].startswith("tg") or not r.get("model_size"):
            continue
        k, v = r["kv"].split("/")
        depth = r["depth"] + (r["n_gen"] - 1) / 2
        nbytes = r["model_size"] + depth * shape.bytes_per_token(k, v)
        r["bytes_per_token"] = round(nbytes)
        r["roofline_ts"] = round(bandwidth_gbps * 1e9 / nbytes, 1)
        r["roofline_fraction"] = round(r["avg_ts"] / r["roofline_ts"], 4)


def markdown(result: dict) -> str:
    roof = result.get("bandwidth_gbps") is not None
    head = "| kv | flags | test | depth | t/s | ± | ratio |" + (" GB/token | roofline t/s | of roofline |" if roof else "")
    lines = [f"reference: `{result['reference']}` (ratio = t/s / reference t/s, same run)"
             + (f"; roofline at {result['bandwidth_gbps']:g} GB/s" if roof else ""), "",
             head, "|---|---|---|---:|---:|---:|---:|" + ("---:|---:|---:|" if roof else "")]
    for r in sorted(result["rows"], key=lambda r: (r["flags"], r["test"], r["depth"], r["kv"])):
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        line = (f"| {r['kv']} | {r['flags'] or '-'} | {r['test']} | {r['depth']} | {r['avg_ts']:.2f} | "
                f"{r['stddev_ts']:.2f} | {ratio} |")
        if roof:
            line += (f" {r['bytes_per_token'] / 1e9:.2f} | {r['roofline_ts']:.0f} | {r['roofline_fraction']:.0%} |"
                     if "roofline_ts" in r else " - | - | - |")
        lines.append(line)
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    """Decode t/s against depth, one line per KV type (and flag set); False without tg rows."""
    decode = [r for r in result["rows"] if r["test"].startswith("tg")]
    if not decode:
        return False
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EnvironmentProblem("the PNG plot needs matplotlib", hint="pip install 'polyforge[bench]'") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[str, list[tuple[int, float, float]]] = {}
    for r in decode:
        label = r["kv"] + (f" {r['flags']}" if r["flags"] else "")
        series.setdefault(label, []).append((r["depth"], r["avg_ts"], r["stddev_ts"]))
    for label, points in sorted(series.items()):
        points.sort()
        ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                    marker="o", capsize=3, label=label)
    ax.set_xlabel("depth (tokens in the KV cache)")
    ax.set_ylabel("decode t/s")
    ax.set_title(f"decode speed by KV type (reference {result['reference']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
