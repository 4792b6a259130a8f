"""scripts/decode_trace_split.py on a synthetic trace: steps, GPU-busy union under overlap, idle time, own
time by kernel."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from synthetic_trace import decode_trace

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "decode_trace_split.py"


def _trace(tmp_path: Path) -> Path:
    return decode_trace(tmp_path / "trace.csv", [
        (100_000, 400_000, "flash_attn_ext_vec<128>(...)"),
        # launched early (PDL): overlaps the previous kernel, counted once in the busy time
        (200_000, 400_000, "flash_attn_combine_results<128>(...)"),
        (700_000, 100_000, "rms_norm_f32(...)")], grid=True)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_steps_busy_union_and_idle(tmp_path: Path):
    out = _run(str(_trace(tmp_path)), "synthetic", "--skip", "1")
    assert out.returncode == 0, out.stderr
    head, columns, *kernels = out.stdout.splitlines()
    # 4 complete steps, 1 skipped: a 1000 us step, busy 10 + 500 (union of 400 and 400 offset by 100) + 100
    assert head == "== synthetic: 3 steps; per step 1000.0 us, GPU busy 610.0 us, idle 390.0 us"
    assert columns.split() == ["own", "us", "launch-end", "n", "kernel"]
    rows = {r.split()[3]: [float(x) for x in r.split()[:3]] for r in kernels}
    # the combine kernel waited 300 us for its predecessor: its own time is the 100 us after the FA kernel ended
    assert rows["flash_attn_ext_vec<128>"] == [400.0, 400.0, 1.0]
    assert rows["flash_attn_combine_results<128>"] == [100.0, 400.0, 1.0]
    assert rows["rms_norm_f32"] == [100.0, 100.0, 1.0]
    assert sum(own for own, _, _ in rows.values()) == 610.0  # own times add up to the busy time
    assert kernels[0].split()[3] == "flash_attn_ext_vec<128>"


def test_own_time_goes_to_the_earliest_started_activity():
    spec = importlib.util.spec_from_file_location("decode_trace_split", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    # a is running when b and c start; c ends first, inside a; b outlives a; then a gap; then d alone
    acts = [(0, 100, "a(x)"), (10, 150, "b(x)"), (20, 30, "c(x)"), (300, 5, "d(x)")]
    assert mod.own_times(acts) == {"a": 100, "b": 60, "d": 5}


def test_no_steps_is_an_error(tmp_path: Path):
    path = tmp_path / "empty.csv"
    path.write_text("Start (ns),Duration (ns),Name\n1,2,\"k(x)\"\n")
    out = _run(str(path))
    assert out.returncode == 1 and "no decode steps" in out.stderr


def test_all_steps_when_every_step_copies_logits_back(tmp_path: Path):
    """llama-batched-bench: no saved state, the prompt's ubatches first, and each decode step of B agents copies
    more than 1 MiB of logits back: --all-steps keeps every step and --skip leaves out the prompt's."""
    rows = []
    for step in range(6):  # 2 prompt ubatches (long), then 4 decode steps of B agents
        t = step * 10_000_000
        kernel_us = 5_000_000 if step < 2 else 1_000_000
        rows += [(t, 10_000, "memcpy kind 1 1056768 B"),
                 (t + 100_000, kernel_us, "flash_attn_ext_f16<128>(...)"),
                 (t + 100_000 + kernel_us, 40_000, "memcpy kind 2 2048000 B")]
    path = tmp_path / "batched.csv"
    path.write_text("Start (ns),Duration (ns),Name\n" + "".join(f'{s},{d},"{n}"\n' for s, d, n in rows))
    out = _run(str(path))
    assert out.returncode == 1 and "no decode steps" in out.stderr  # cut after the last logits copy
    out = _run(str(path), "agents", "--all-steps", "--skip", "2")
    assert out.returncode == 0, out.stderr
    head = out.stdout.splitlines()[0]
    # 5 complete steps (the last is open-ended), 2 of them the prompt's: 3 decode steps of 1000 us kernels
    assert head.startswith("== agents: 3 steps; per step 10000.0 us, GPU busy 1050.0 us")


def test_host_calls_are_listed_not_counted_as_gpu_work(tmp_path: Path):
    """"api NAME" rows (cupti_trace.c's runtime records) are host time: not in the steps' spans or busy time, but
    listed per step by name."""
    rows = []
    for step in range(4):
        t = step * 1_000_000
        rows += [(t, 10_000, "memcpy kind 1 64 B"),
                 (t + 20_000, 300_000, "api cudaGraphExecUpdate_v12000"),  # the host, before the launch
                 (t + 330_000, 10_000, "api cudaGraphLaunch_v10000"),
                 (t + 400_000, 500_000, "flash_attn_ext_f16<128>(...)")]
    path = tmp_path / "api.csv"
    path.write_text("Start (ns),Duration (ns),Name\n" + "".join(f'{s},{d},"{n}"\n' for s, d, n in rows))
    out = _run(str(path), "graphs", "--all-steps", "--skip", "0")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "== graphs: 3 steps; per step 1000.0 us, GPU busy 510.0 us, idle 490.0 us"
    kernels = [line.split()[3] for line in lines[2:5]]
    assert not any(k.startswith("api") or k.startswith("cudaGraph") for k in kernels)
    calls = lines[lines.index("   " + f"{'host us':>9}  {'calls':>10}  host call"):]
    assert calls[1].split() == ["300.0", "1.0", "cudaGraphExecUpdate_v12000"]
    assert calls[2].split() == ["10.0", "1.0", "cudaGraphLaunch_v10000"]


def test_keep_last_for_one_prompt_batch(tmp_path: Path):
    """A trace of one prompt batch after the saved state (llama-bench -p 512 -n 0 at a depth, traced): its only step has
    no later input copy to end it, so it is found with --keep-last alone, ending at its last activity."""
    rows = [(0, 5_000_000, "memcpy kind 2 268435456 B"),
            (10_000_000, 600_000, "memcpy kind 1 34078720 B"),  # the prompt's KQ mask
            (10_700_000, 8_000_000, "flash_attn_ext_f16<128>(...)"),
            (18_800_000, 1_000_000, "dequantize_block_turbo<3>(...)"),
            (20_000_000, 200_000, "memcpy kind 2 131072 B")]
    path = tmp_path / "prompt.csv"
    path.write_text("Start (ns),Duration (ns),Name\n" + "".join(f'{s},{d},"{n}"\n' for s, d, n in rows))
    out = _run(str(path), "--skip", "0")
    assert out.returncode == 1 and "no decode steps" in out.stderr
    out = _run(str(path), "pp", "--skip", "0", "--keep-last")
    assert out.returncode == 0, out.stderr
    head, _, *kernels = out.stdout.splitlines()
    # from the mask's copy to the logits' copy's end: 10200 us, busy 600 + 8000 + 1000 + 200
    assert head == "== pp: 1 steps; per step 10200.0 us, GPU busy 9800.0 us, idle 400.0 us"
    assert kernels[0].split()[:4] == ["8000.0", "8000.0", "1", "flash_attn_ext_f16<128>"]
