"""Synthetic scripts/cupti_trace.c CSVs of a llama-bench decode run, for the trace tools' tests."""

from __future__ import annotations

from pathlib import Path

# llama-bench saving the prefilled state: the decode steps come after the last such copy
STATE_COPY = (0, 5_000_000, "memcpy kind 2 268435456 B")


def decode_trace(path: Path, kernels: list[tuple[int, int, str]], steps: int = 5, grid: bool = False) -> Path:
    """The state's copy, then `steps` steps 1 ms apart (from 10 ms on), each an input copy and the kernels given as
    (offset from the step's start, duration, name) in ns; `grid` adds cupti_trace.c's grid columns."""
    rows = [STATE_COPY]
    for step in range(steps):
        t = 10_000_000 + step * 1_000_000
        rows += [(t, 10_000, "memcpy kind 1 262656 B")] + [(t + offset, dur, name) for offset, dur, name in kernels]
    header, extra = (",gx,gy,gz", ",1,1,1") if grid else ("", "")
    path.write_text(f"Start (ns),Duration (ns),Name{header}\n" + "".join(f'{s},{d},"{n}"{extra}\n' for s, d, n in rows))
    return path
