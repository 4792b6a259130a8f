"""scripts/attention_ceiling.py: the ceilings' arithmetic on the rows of docs/cuda-attention.md, the trace path on
a synthetic trace, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from synthetic_trace import decode_trace

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "attention_ceiling.py"

HD512 = ["--layers", "16", "--kv-heads", "2", "--head-dim", "512"]
HD128 = ["--layers", "16", "--kv-heads", "8", "--head-dim", "128"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def _json(*args: str) -> dict:
    out = _run(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_hd512_32k_turbo3_is_above_its_ceiling():
    # the H200's hd512 step at 32k: llama-bench 2571 us, its attention (FA + stream-k fixup) 892 us
    c = _json("--step-us", "2571", "--attention-us", "892", "--kv", "turbo3/turbo3", *HD512, "--depth", "32768",
              "--goal", "1.5")
    # 32768 cells x 16 layers x 2 heads x (512 + 512 values at 26 bytes per 64)
    assert c["kv_bytes"] == 32768 * 16 * 2 * 2 * 512 * 26 / 64
    assert c["rest_us"] == 1679
    assert round(c["free_attention"], 3) == 1.531
    assert round(c["at_bandwidth"], 3) == 1.453
    assert round(c["goal_budget_us"], 1) == 35.0
    assert c["goal_bandwidth_share"] > 1  # its bytes alone take longer than the budget


def test_hd128_128k_goals_are_within_reach():
    turbo = _json("--step-us", "3636", "--attention-us", "2567.5", "--kv", "turbo3/turbo3", *HD128,
                  "--depth", "131072", "--goal", "2.0")
    assert round(turbo["at_bandwidth"], 2) == 2.54
    assert round(turbo["goal_budget_us"], 1) == 749.5
    assert round(turbo["goal_bandwidth_share"], 3) == 0.485
    q8 = _json("--step-us", "3636", "--attention-us", "2567.5", "--kv", "q8_0/turbo3", *HD128, "--depth", "131072")
    # q8_0 K: 34 bytes per 32 values
    assert q8["kv_bytes"] == 131072 * 16 * 8 * (128 * 34 / 32 + 128 * 26 / 64)
    assert round(q8["at_bandwidth"], 2) == 2.11
    assert q8["goal"] is None and q8["goal_budget_us"] is None


def test_text_says_whether_the_goal_fits():
    above = _run("--step-us", "2571", "--attention-us", "892", "--kv", "turbo3/turbo3", *HD512, "--depth", "32768",
                 "--goal", "1.5")
    assert above.returncode == 0, above.stderr
    assert above.stdout.splitlines()[-1].endswith("above the ceiling")
    within = _run("--step-us", "2571", "--attention-us", "892", "--kv", "q8_0/turbo3", *HD512, "--depth", "32768",
                  "--goal", "1.3")
    assert within.stdout.splitlines()[-1].endswith("the K/V read at 55 % of the bandwidth, with nothing else")
    none_left = _run("--step-us", "2571", "--attention-us", "892", "--kv", "q8_0/turbo3", *HD512, "--depth", "32768",
                     "--goal", "1.6")
    assert none_left.stdout.splitlines()[-1].endswith("none left, above the free-attention ceiling")


def test_step_and_attention_from_a_trace(tmp_path: Path):
    trace = str(decode_trace(tmp_path / "trace.csv", [(100_000, 300_000, "flash_attn_ext_vec<128>(...)"),
                                                      (400_000, 100_000, "flash_attn_combine_results<128>(...)"),
                                                      (600_000, 250_000, "mul_mat_vec_f<half>(...)")], steps=6))
    c = _json("--trace", trace, "--kv", "turbo3/turbo3", *HD128, "--depth", "4096")
    # 1000 us steps, 400 us of them flash_attn_* kernels: the mat-vec and the idle are the rest
    assert c["step_us"] == 1000 and c["attention_us"] == 400 and c["rest_us"] == 600
    # llama-bench's step instead of the trace's
    c = _json("--trace", trace, "--step-us", "900", "--kv", "turbo3/turbo3", *HD128, "--depth", "4096")
    assert c["step_us"] == 900 and c["rest_us"] == 500
    # another pattern: only the FA kernel itself
    c = _json("--trace", trace, "--attention", "^flash_attn_ext", "--kv", "turbo3/turbo3", *HD128, "--depth", "4096")
    assert c["attention_us"] == 300


@pytest.mark.parametrize("args, message", [
    (["--step-us", "100", "--attention-us", "100"], "longer than its attention"),
    (["--step-us", "100"], "give --step-us and --attention-us, or --trace"),
    (["--step-us", "100", "--attention-us", "10", "--goal", "0"], "--goal must be positive"),
])
def test_bad_numbers_are_one_line_errors(args, message):
    out = _run(*args, "--kv", "turbo3/turbo3", *HD128, "--depth", "4096")
    assert out.returncode == 2
    assert out.stdout == "" and out.stderr.count("\n") == 1 and message in out.stderr


def test_bad_kv_and_missing_trace(tmp_path: Path):
    out = _run("--step-us", "100", "--attention-us", "10", "--kv", "q9/turbo3", *HD128, "--depth", "4096")
    assert out.returncode == 2 and out.stderr == "error: --kv: no size known for KV type q9\n"
    out = _run("--step-us", "100", "--attention-us", "10", "--kv", "turbo3", *HD128, "--depth", "4096")
    assert out.returncode == 2 and "--kv takes a K/V pair" in out.stderr
    out = _run("--trace", str(tmp_path / "missing.csv"), "--kv", "turbo3/turbo3", *HD128, "--depth", "4096")
    assert out.returncode == 2 and out.stderr.startswith("error: ") and out.stderr.count("\n") == 1
