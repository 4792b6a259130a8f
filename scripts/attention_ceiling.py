#!/usr/bin/env python3
"""The highest decode ratio over f16/f16 that a K/V type could reach, from the f16 side's step and its attention.

A decode step splits into its attention (the FA kernels with their combine or stream-k fixup, and every kernel a
K/V type adds: conversions, rotations, its stores) and the rest (mat-vecs, norms, RoPE, the host's time between
launches), which is the same work whatever the K/V type. With S the f16 step and A its attention, rest = S - A; for
a K/V type whose cache takes T to read once at the bandwidth peak:

  free attention       S / rest
  at the bandwidth     S / (rest + T)

and for a goal ratio G the time the type's whole attention may take, S / G - rest, with the share of the bandwidth
that reading its K/V in that time asks for. A goal above the second ceiling cannot be met by any attention kernel
without the rest getting faster (which lifts f16 as much).

S and A come from the command line, or from a scripts/cupti_trace.c trace of the f16 side: the mean over its decode
steps as decode_trace_split.py splits them, attention being the kernels whose names match --attention (own time).
--step-us overrides S, e.g. with llama-bench's step (1e6 / t/s), which carries none of the trace's overhead.

  attention_ceiling.py --step-us 2571 --attention-us 892 --kv turbo3/turbo3 --layers 16 --kv-heads 2 \\
      --head-dim 512 --depth 32768 --bandwidth 4800 --goal 1.5
  attention_ceiling.py --trace f16.csv [--step-us S] --kv ... [--all-steps] [--skip N] [--json]

Exit status 0 with the figures (also where the goal is above a ceiling: that is a finding, not a failure), 2 on bad
input.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from polyforge.bench.matrix import KV_BITS, KvShape  # noqa: E402
from polyforge.errors import BadInput  # noqa: E402
from polyforge.kvtypes import kv_pair  # noqa: E402

import decode_trace_split as split  # noqa: E402  (this script's folder is first on sys.path when run)

# upstream's FA kernels and their combine / stream-k fixup: flash_attn_ext_*, flash_attn_combine_results,
# flash_attn_stream_k_fixup
DEFAULT_ATTENTION = r"^flash_attn"


@dataclass(frozen=True)
class Ceiling:
    step_us: float
    attention_us: float
    rest_us: float
    kv: str
    kv_bytes: float  # one read of the K/V cache, all layers
    kv_read_us: float  # that read at the bandwidth peak
    free_attention: float
    at_bandwidth: float
    goal: float | None = None
    goal_budget_us: float | None = None  # what the type's attention may take for the goal
    goal_bandwidth_share: float | None = None  # kv_read_us / goal_budget_us; None where the budget is not positive


def ceiling(step_us: float, attention_us: float, kv: str, shape: KvShape, depth: int, bandwidth_gbps: float,
            goal: float | None = None) -> Ceiling:
    if not step_us > 0 or not 0 <= attention_us < step_us:
        raise BadInput(f"the step ({step_us} us) must be positive and longer than its attention ({attention_us} us)")
    if depth < 1 or not bandwidth_gbps > 0:
        raise BadInput("--depth and --bandwidth must be positive")
    if goal is not None and not goal > 0:
        raise BadInput("--goal must be positive")
    pair = kv_pair(kv)
    if pair is None:
        raise BadInput(f"--kv takes a K/V pair such as turbo3/turbo3, not {kv!r}")
    for t in pair:
        if t not in KV_BITS:
            raise BadInput(f"--kv: no size known for KV type {t}")
    kv_bytes = depth * shape.bytes_per_token(*pair)
    kv_read_us = kv_bytes / (bandwidth_gbps * 1e3)  # GB/s = 1e3 bytes/us
    rest = step_us - attention_us
    budget = share = None
    if goal is not None:
        budget = step_us / goal - rest
        share = kv_read_us / budget if budget > 0 else None
    return Ceiling(step_us, attention_us, rest, kv, kv_bytes, kv_read_us, step_us / rest,
                   step_us / (rest + kv_read_us), goal, budget, share)


def step_from_trace(path: str, attention: str, skip: int, all_steps: bool) -> tuple[float, float]:
    """(mean step, mean attention own time) in us over the decode steps of a trace."""
    steps = [split.summarize(s) for s in split.decode_steps(split.read_trace(path), not all_steps)[skip:]]
    if not steps:
        raise BadInput(f"{path}: no decode steps found")
    pattern = re.compile(attention)
    span = sum(s[0] for s in steps) / len(steps)
    attn = sum(ns for s in steps for name, ns in s[2].items() if pattern.search(split.short_name(name))) / len(steps)
    return span / 1e3, attn / 1e3


def render(c: Ceiling, bandwidth_gbps: float) -> str:
    lines = [f"f16 step {c.step_us:.1f} us, attention {c.attention_us:.1f} us, rest {c.rest_us:.1f} us",
             f"{c.kv}: K/V {c.kv_bytes / 1e6:.1f} MB a step, {c.kv_read_us:.1f} us at {bandwidth_gbps:g} GB/s",
             f"ceiling: {c.free_attention:.3f} with a free attention, {c.at_bandwidth:.3f} at the bandwidth"]
    if c.goal is not None:
        head = f"goal {c.goal:g}: attention budget {c.goal_budget_us:.1f} us a step"
        if c.goal_bandwidth_share is None:
            lines.append(f"{head}: none left, above the free-attention ceiling")
        elif c.goal_bandwidth_share > 1:
            lines.append(f"{head}: below the K/V's {c.kv_read_us:.1f} us at the bandwidth, above the ceiling")
        else:
            lines.append(f"{head}: the K/V read at {100 * c.goal_bandwidth_share:.0f} % of the bandwidth, "
                         "with nothing else")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", help="scripts/cupti_trace.c CSV of the f16 side")
    ap.add_argument("--step-us", type=float, help="the f16 step (overrides the trace's)")
    ap.add_argument("--attention-us", type=float, help="the f16 step's attention (without --trace)")
    ap.add_argument("--attention", default=DEFAULT_ATTENTION,
                    help=f"regex of the attention kernels in a trace (default {DEFAULT_ATTENTION!r})")
    ap.add_argument("--skip", type=int, default=2, help="trace steps to leave out at the start (default 2)")
    ap.add_argument("--all-steps", action="store_true", help="every trace step (llama-batched-bench: no saved state)")
    ap.add_argument("--kv", required=True, help="the K/V pair, e.g. turbo3/turbo3")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--head-dim", type=int, required=True, help="K and V head size")
    ap.add_argument("--depth", type=int, required=True, help="cached cells at the step")
    ap.add_argument("--bandwidth", type=float, default=4800.0, help="GB/s (default 4800, the H200)")
    ap.add_argument("--goal", type=float, help="a ratio to f16/f16 to budget for")
    ap.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    args = ap.parse_args(argv)
    try:
        if args.trace:
            step, attention = step_from_trace(args.trace, args.attention, args.skip, args.all_steps)
            step = args.step_us if args.step_us is not None else step
        elif args.step_us is None or args.attention_us is None:
            raise BadInput("give --step-us and --attention-us, or --trace")
        else:
            step, attention = args.step_us, args.attention_us
        if min(args.layers, args.kv_heads, args.head_dim) < 1:
            raise BadInput("--layers, --kv-heads and --head-dim must be positive")
        shape = KvShape((args.kv_heads,) * args.layers, args.head_dim, args.head_dim)
        c = ceiling(step, attention, args.kv, shape, args.depth, args.bandwidth, args.goal)
    except (BadInput, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(c)) if args.json else render(c, args.bandwidth))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
