"""scripts/fa_perf_table.py on test-backend-ops perf output: shapes grouped, ratios to f16/f16 within a run and to
the first run, bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fa_perf_table.py"

COLOR = "\033[1;34m"
RESET = "\033[0m"


def _line(kv: int, nb: int, type_k: str, type_v: str, us: float) -> str:
    params = (f"hsk=128,hsv=128,nh=8,nr23=[2,1],kv={kv},nb={nb},mask=1,sinks=0,max_bias=0.000000,"
              f"logit_softcap=0.000000,prec=f32,type_K={type_k},type_V={type_v},permute=[0,1,2,3],kv_view=1,"
              f"v_is_view_of_k=0,n_kv_max=0")
    return (f"  FLASH_ATTN_EXT({params}):          1000 runs - {us:8.2f} us/run -  68.72 GFLOP/run - "
            f"{COLOR}  1.21 TFLOPS{RESET}\n")


def _perf(tmp_path: Path, name: str, times: dict[tuple[int, str], float]) -> Path:
    text = "Testing 2 devices\n\nBackend 1/2: CUDA0\n  Device description: NVIDIA H200\n"
    for (nb, pair), us in times.items():
        type_k, type_v = pair.split("/")
        text += _line(32768, nb, type_k, type_v, us)
    # a case the backend lacks is listed without a time
    text += "  FLASH_ATTN_EXT(hsk=576,hsv=512,nh=1,nr23=[20,1],kv=8192,nb=32,type_K=f16,type_V=f16): not supported\n"
    path = tmp_path / name / "perf.txt"
    path.parent.mkdir()
    path.write_text(text)
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_ratios_within_and_across_runs(tmp_path):
    base = _perf(tmp_path, "base", {(16, "f16/f16"): 50.0, (16, "turbo3/turbo3"): 80.0, (16, "q8_0/turbo3"): 100.0,
                                    (1, "f16/f16"): 30.0, (1, "turbo3/turbo3"): 15.0})
    variant = _perf(tmp_path, "variant", {(16, "f16/f16"): 50.0, (16, "turbo3/turbo3"): 40.0,
                                          (16, "q8_0/turbo3"): 125.0})
    done = _run(f"base={base}", f"nostage={variant}", "--json")
    assert done.returncode == 0, done.stderr
    rows = {(r["shape"], r["run"], r["pair"]): r for r in json.loads(done.stdout)}

    q16 = "D=128 kv_heads=8 gqa=[2,1] kv=32768 queries=16"
    q1 = "D=128 kv_heads=8 gqa=[2,1] kv=32768 queries=1"
    assert rows[(q16, "base", "turbo3/turbo3")]["vs_f16"] == 50.0 / 80.0
    assert rows[(q16, "base", "q8_0/turbo3")]["vs_f16"] == 0.5
    assert rows[(q1, "base", "turbo3/turbo3")]["vs_f16"] == 2.0
    assert rows[(q16, "base", "f16/f16")]["vs_f16"] is None
    # the first run is the reference of the others
    assert rows[(q16, "base", "turbo3/turbo3")]["vs_first_run"] is None
    assert rows[(q16, "nostage", "turbo3/turbo3")]["vs_first_run"] == 2.0
    assert rows[(q16, "nostage", "q8_0/turbo3")]["vs_first_run"] == 0.8
    assert rows[(q16, "nostage", "turbo3/turbo3")]["vs_f16"] == 1.25
    # shapes one run lacks are only in the other
    assert (q1, "nostage", "turbo3/turbo3") not in rows
    # queries sort numerically: 1 before 16
    order = [r["shape"] for r in json.loads(done.stdout)]
    assert order.index(q1) < order.index(q16)

    table = _run(f"base={base}")
    assert table.returncode == 0, table.stderr
    assert f"| {q16} | base | turbo3/turbo3 | 80.00 | 0.62 | - |" in table.stdout


def test_refuses_missing_and_empty_input(tmp_path):
    missing = _run(str(tmp_path / "nothing.txt"))
    assert missing.returncode == 2
    assert "no file" in missing.stderr

    empty = tmp_path / "empty.txt"
    empty.write_text("Testing 1 devices\n  MUL_MAT(type_a=f16):  10 runs - 1.00 us/run - \n")
    none = _run(str(empty))
    assert none.returncode == 1
    assert "no FLASH_ATTN_EXT times" in none.stderr


def test_baseline_ratio_and_bandwidth_share(tmp_path):
    perf = _perf(tmp_path, "run", {(1, "f16/f16"): 100.0, (1, "q8_0/q8_0"): 80.0, (1, "turbo3/turbo3"): 40.0,
                                   (1, "turbo9/turbo9"): 20.0})
    done = _run(str(perf), "--json", "--bandwidth", "2000")
    assert done.returncode == 0, done.stderr
    rows = {r["pair"]: r for r in json.loads(done.stdout)}
    assert rows["turbo3/turbo3"]["vs_q8_0"] == 2.0
    assert rows["f16/f16"]["vs_q8_0"] == 0.8
    assert rows["q8_0/q8_0"]["vs_q8_0"] is None
    # 32768 cells x 8 heads x 128 values x (16 + 16) bits = 134.2 MB in 100 us against 2000 GB/s
    assert abs(rows["f16/f16"]["of_bandwidth"] - 32768 * 8 * 128 * 4 / (100.0 * 2000 * 1e3)) < 1e-12
    assert abs(rows["turbo3/turbo3"]["of_bandwidth"] - 32768 * 8 * 128 * 6.5 / 8 / (40.0 * 2000 * 1e3)) < 1e-12
    # a type of unknown size has no share
    assert rows["turbo9/turbo9"]["of_bandwidth"] is None

    table = _run(str(perf), "--bandwidth", "2000")
    assert table.returncode == 0, table.stderr
    assert "| of bandwidth |" in table.stdout
    assert "| 40.00 | 2.50 | 2.00 | - | 34% |" in table.stdout
    # without a bandwidth the column is not there
    assert "of bandwidth" not in _run(str(perf)).stdout

    bad = _run(str(perf), "--bandwidth", "0")
    assert bad.returncode == 2
    assert "--bandwidth must be a positive" in bad.stderr
