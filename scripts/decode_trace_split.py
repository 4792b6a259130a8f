#!/usr/bin/env python3
"""Split a CUDA kernel trace of a llama-bench decode run into token steps and say where a step's time goes.

The trace is scripts/cupti_trace.c's CSV (or any CSV with "Start (ns)", "Duration (ns)" and "Name"). The
decode steps are the stretches between the host's input copies (host-to-device memcpys that follow a
kernel), after the last large device-to-host copy (llama-bench saving the prefilled state). Per step it
prints the wall span, the GPU-busy time (union of the kernels' intervals: with PDL, kernels overlap),
the idle time and the kernels by time, two ways: own time, each instant of GPU-busy time given to the
earliest-started activity still running (a kernel launched with PDL starts early and waits for its
predecessor, so that instant is the predecessor's work; own times add up to the busy time), and the
launch-to-end durations, which count that wait too. Per step, with launches per step. Host calls the trace
holds ("api NAME" rows: CUDA graph capture, instantiation, update and launch, stream and event waits) are left
out of the steps and listed after the kernels: time and calls per step, by name, of those starting in a step.

  decode_trace_split.py trace.csv [LABEL] [--skip N] [--top K] [--all-steps] [--keep-last]
"""

from __future__ import annotations

import argparse
import collections
import csv
import heapq
import sys


def read_trace(path: str) -> list[tuple[int, int, str]]:
    with open(path, newline="") as f:
        return sorted((int(r["Start (ns)"]), int(r["Duration (ns)"]), r["Name"]) for r in csv.DictReader(f))


def is_copy(name: str, kind: int) -> bool:
    return name.startswith(f"memcpy kind {kind} ")


def copy_bytes(name: str) -> int:
    return int(name.split()[3])


def is_host_call(name: str) -> bool:
    return name.startswith("api ")


def decode_steps(rows: list[tuple[int, int, str]], after_state_copy: bool = True,
                 keep_last: bool = False) -> list[list[tuple[int, int, str]]]:
    """The activities of each decode step, each ending with the next step's first copy; the last step, which no copy
    ends, is left out unless keep_last (a trace of one prompt batch: that step is the one wanted), where it ends with
    its last activity. With after_state_copy only the activities after the last large device-to-host copy
    (llama-bench's saved state; a batch's logits can be as large)."""
    rows = [r for r in rows if not is_host_call(r[2])]
    big_dtoh = [i for i, r in enumerate(rows) if is_copy(r[2], 2) and copy_bytes(r[2]) > 1 << 20]
    rows = rows[big_dtoh[-1] + 1:] if big_dtoh and after_state_copy else rows
    starts, after_kernel = [], True
    for i, (_, _, name) in enumerate(rows):
        if is_copy(name, 1):
            if after_kernel:
                starts.append(i)
            after_kernel = False
        elif not name.startswith("mem"):
            after_kernel = True
    steps = [rows[a:b + 1] for a, b in zip(starts, starts[1:])]
    if keep_last and starts:
        last = rows[starts[-1]:]
        steps.append(last + [(max(start + dur for start, dur, _ in last), 0, "end of trace")])
    return steps


def short_name(name: str) -> str:
    return name.split("(")[0][:60]


def own_times(acts: list[tuple[int, int, str]]) -> collections.Counter:
    """Time by name, each busy instant given to the earliest-started activity still running then."""
    points = sorted({t for start, dur, _ in acts for t in (start, start + dur)})
    by_start = sorted(acts, key=lambda act: act[0])  # stable: equal starts keep the trace's order
    running: list[tuple[int, int, int, str]] = []  # heap of (start, order, end, name)
    own: collections.Counter = collections.Counter()
    started = 0
    for a, b in zip(points, points[1:]):
        while started < len(by_start) and by_start[started][0] <= a:
            start, dur, name = by_start[started]
            heapq.heappush(running, (start, started, start + dur, short_name(name)))
            started += 1
        while running and running[0][2] <= a:  # ended
            heapq.heappop(running)
        if running:
            own[running[0][3]] += b - a
    return own


def summarize(step: list[tuple[int, int, str]]) -> tuple[int, int, collections.Counter, collections.Counter,
                                                          collections.Counter]:
    """(span up to the next step's first copy, GPU-busy union, own time, launch-to-end time and launches by
    name) of one step."""
    *acts, nxt = step
    own = own_times(acts)  # every busy instant once: the GPU-busy union
    by_name: collections.Counter = collections.Counter()
    launches: collections.Counter = collections.Counter()
    for _, dur, name in acts:
        by_name[short_name(name)] += dur
        launches[short_name(name)] += 1
    return nxt[0] - acts[0][0], sum(own.values()), own, by_name, launches


def host_calls(step: list[tuple[int, int, str]], calls: list[tuple[int, int, str]]) -> tuple[collections.Counter,
                                                                                              collections.Counter]:
    """(time, count) by name of the host calls that start in the step's span."""
    start, end = step[0][0], step[-1][0]
    time: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for t, dur, name in calls:
        if start <= t < end:
            call = name.removeprefix("api ")
            time[call] += dur
            count[call] += 1
    return time, count


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("label", nargs="?", default="")
    ap.add_argument("--skip", type=int, default=2, help="steps to leave out at the start (default 2)")
    ap.add_argument("--top", type=int, default=10, help="kernels to list (default 10)")
    ap.add_argument("--all-steps", action="store_true",
                    help="every step from the trace's start (llama-batched-bench: no saved state; --skip the prompt's)")
    ap.add_argument("--keep-last", action="store_true",
                    help="keep the trace's last step, up to its last activity (a trace of one prompt batch)")
    args = ap.parse_args(argv)
    rows = read_trace(args.trace)
    raw_steps = decode_steps(rows, not args.all_steps, args.keep_last)[args.skip:]
    steps = [summarize(s) for s in raw_steps]
    if not steps:
        print(f"error: {args.trace}: no decode steps found", file=sys.stderr)
        return 1
    n = len(steps)
    span = sum(s[0] for s in steps) / n
    busy = sum(s[1] for s in steps) / n
    print(f"== {args.label or args.trace}: {n} steps; per step {span / 1e3:.1f} us, GPU busy {busy / 1e3:.1f} us, "
          f"idle {(span - busy) / 1e3:.1f} us")
    own: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    launches: collections.Counter = collections.Counter()
    for s in steps:
        own.update(s[2])
        total.update(s[3])
        launches.update(s[4])
    print(f"   {'own us':>9}  {'launch-end':>10}  {'n':>4}  kernel")
    for name, ns in own.most_common(args.top):
        print(f"   {ns / n / 1e3:9.1f}  {total[name] / n / 1e3:10.1f}  {launches[name] / n:4.0f}  {name}")
    calls = [r for r in rows if is_host_call(r[2])]
    if calls:
        call_time: collections.Counter = collections.Counter()
        call_count: collections.Counter = collections.Counter()
        for step in raw_steps:
            t, c = host_calls(step, calls)
            call_time.update(t)
            call_count.update(c)
        print(f"   {'host us':>9}  {'calls':>10}  host call")
        for name, ns in call_time.most_common():
            print(f"   {ns / n / 1e3:9.1f}  {call_count[name] / n:10.1f}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
