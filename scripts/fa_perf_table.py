#!/usr/bin/env python3
"""Flash-attention kernel times from `test-backend-ops perf -o FLASH_ATTN_EXT` as ratios to f16/f16.

Reads the console output of one or more runs (each optionally named, NAME=FILE: e.g. `scripts/gpu_check.sh
OUT fa-perf` on two builds of the chain), groups the FLASH_ATTN_EXT cases by shape (head size, K/V heads, GQA, KV
length, queries) and prints, per shape and run, each K/V pair's time per run and its speed relative to f16/f16 and
to q8_0/q8_0 of the same run and shape (reference time / pair time: above 1 is faster). With two or more runs, the
last column of each pair is its speed in that run relative to the first run. With --bandwidth GB/s (the GPU's
peak, as `polyforge bench` reports it), each row also gets the share of that bandwidth its K/V bytes take: KV
length x K/V heads x (K head size x K bits + V head size x V bits) / 8 per run, Q and mask left out.

  fa_perf_table.py before=OUT1/fa-perf.txt after=OUT2/fa-perf.txt [--bandwidth 3352] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from polyforge.kvtypes import KV_BITS

# "  FLASH_ATTN_EXT(hsk=128,...,type_K=turbo3,type_V=turbo3,...):      1234 runs -    56.78 us/run - ..."
LINE = re.compile(r"^\s*FLASH_ATTN_EXT\((?P<params>[^)]*)\):\s+(?P<runs>\d+) runs -\s+(?P<us>[\d.]+) us/run")
PARAM = re.compile(r"(\w+)=(\[[^\]]*\]|[^,]*)")

SHAPE_KEYS = ("hsk", "hsv", "nh", "nr23", "kv", "nb", "mask", "sinks", "max_bias", "logit_softcap", "prec",
              "permute", "kv_view", "v_is_view_of_k", "n_kv_max")
REFERENCE = "f16/f16"
BASELINE = "q8_0/q8_0"  # the pair a user would pick instead of a new type


def parse_params(text: str) -> dict[str, str]:
    return {key: value for key, value in PARAM.findall(text)}


def parse_perf(text: str) -> dict[tuple, dict[str, float]]:
    """{shape: {"K/V": microseconds per run}} of the FLASH_ATTN_EXT lines with a time."""
    times: dict[tuple, dict[str, float]] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if not match:
            continue
        params = parse_params(match["params"])
        if "type_K" not in params or "type_V" not in params:
            raise ValueError(f"FLASH_ATTN_EXT line without K/V types: {line.strip()[:120]}")
        shape = tuple((key, params.get(key, "")) for key in SHAPE_KEYS)
        times.setdefault(shape, {})[f"{params['type_K']}/{params['type_V']}"] = float(match["us"])
    return times


def shape_label(shape: tuple) -> str:
    p = dict(shape)
    return f"D={p['hsk']} kv_heads={p['nh']} gqa={p['nr23']} kv={p['kv']} queries={p['nb']}"


def kv_bytes(shape: tuple, pair: str) -> float | None:
    """The bytes of K and V one run reads once; None for a type without a known size."""
    p = dict(shape)
    type_k, type_v = pair.split("/")
    if type_k not in KV_BITS or type_v not in KV_BITS:
        return None
    return int(p["kv"]) * int(p["nh"]) * (int(p["hsk"]) * KV_BITS[type_k] + int(p["hsv"]) * KV_BITS[type_v]) / 8


def table(runs: list[tuple[str, dict[tuple, dict[str, float]]]], bandwidth_gbps: float | None = None) -> list[dict]:
    """One row per (shape, run, pair): time, speed relative to f16/f16 and to q8_0/q8_0, speed relative to the
    first run, and with a bandwidth the share of it the pair's K/V bytes take."""
    # numerically by head size, heads, GQA, KV length, queries (the numbers inside each value)
    shapes = sorted({shape for _, times in runs for shape in times},
                    key=lambda s: tuple(tuple(int(x) for x in re.findall(r"\d+", v)) for _, v in s))
    rows = []
    first = runs[0][1]
    for shape in shapes:
        for name, times in runs:
            pairs = times.get(shape, {})
            ref = pairs.get(REFERENCE)
            baseline = pairs.get(BASELINE)
            for pair, us in pairs.items():
                base = first.get(shape, {}).get(pair)
                nbytes = kv_bytes(shape, pair) if bandwidth_gbps else None
                rows.append({
                    "shape": shape_label(shape), "run": name, "pair": pair, "us": us,
                    "vs_f16": ref / us if ref and pair != REFERENCE else None,
                    "vs_q8_0": baseline / us if baseline and pair != BASELINE else None,
                    "vs_first_run": base / us if base and times is not first else None,
                    # GB/s = 1e3 bytes/us
                    "of_bandwidth": nbytes / (us * bandwidth_gbps * 1e3) if nbytes else None,
                })
    return rows


def render(rows: list[dict], bandwidth: bool = False) -> str:
    def num(value: float | None, fmt: str = ".2f") -> str:
        return "-" if value is None else format(value, fmt)

    head = "| shape | run | K/V | us/run | speed vs f16/f16 | speed vs q8_0/q8_0 | speed vs first run |"
    out = [head + (" of bandwidth |" if bandwidth else ""), "|---" * (7 + bandwidth) + "|"]
    for row in rows:
        line = (f"| {row['shape']} | {row['run']} | {row['pair']} | {row['us']:.2f} | {num(row['vs_f16'])} | "
                f"{num(row['vs_q8_0'])} | {num(row['vs_first_run'])} |")
        out.append(line + (f" {num(row['of_bandwidth'], '.0%')} |" if bandwidth else ""))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="[NAME=]FILE")
    ap.add_argument("--json", action="store_true", help="rows as JSON instead of a markdown table")
    ap.add_argument("--bandwidth", type=float, metavar="GB/S", help="the GPU's memory bandwidth: each row's share")
    args = ap.parse_args(argv)
    if args.bandwidth is not None and not args.bandwidth > 0:
        print(f"fa_perf_table: --bandwidth must be a positive GB/s, not {args.bandwidth:g}", file=sys.stderr)
        return 2

    runs = []
    for spec in args.runs:
        name, _, path = spec.rpartition("=")
        path_obj = Path(path)
        if not path_obj.is_file():
            print(f"fa_perf_table: no file {path}", file=sys.stderr)
            return 2
        try:
            times = parse_perf(path_obj.read_text(errors="replace"))
        except ValueError as e:
            print(f"fa_perf_table: {path}: {e}", file=sys.stderr)
            return 1
        if not times:
            print(f"fa_perf_table: no FLASH_ATTN_EXT times in {path}", file=sys.stderr)
            return 1
        runs.append((name or path_obj.parent.name or path, times))

    rows = table(runs, args.bandwidth)
    print(json.dumps(rows, indent=1) if args.json else render(rows, args.bandwidth is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
