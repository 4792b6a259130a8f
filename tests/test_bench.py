"""polyforge bench: the llama-bench matrix against a fake llama-bench; the real one is slow."""

from __future__ import annotations

import json

import pytest

from buildkit import real_build, run_pf, write_script  # noqa: F401 (fixture)
from conftest import ROOT, assert_clean_error, run_cli
from polyforge import bench
from polyforge.errors import BadInput, VerificationFailed

FAKE_BENCH = """\
import json, sys
args = sys.argv[1:]
arg = lambda f: args[args.index(f) + 1]
with open(__file__ + ".calls", "a") as f:
    f.write(" ".join(args) + "\\n")
speed = {"f16": 100.0, "q8_0": 90.0, "q4_0": 80.0}[arg("-ctk")]
if "-fa" in args and arg("-fa") == "1":
    speed *= 1.5
print("load_backend: loaded CPU backend", file=sys.stderr)
rows = []
for depth in map(int, arg("-d").split(",")):
    for n_prompt, n_gen in ((int(arg("-p")), 0), (0, int(arg("-n")))):
        if n_prompt == 0 and n_gen == 0:
            continue
        rows.append({"type_k": arg("-ctk"), "type_v": arg("-ctv"), "n_prompt": n_prompt, "n_gen": n_gen,
                     "n_depth": depth, "avg_ts": speed * (4 if n_prompt else 1) / (1 + depth / 1000),
                     "stddev_ts": 1.5, "samples_ts": [1.0] * int(arg("-r"))})
print(json.dumps(rows, indent=2))
"""


def _spec(**kw):
    args = dict(kv=["f16/f16,q8_0/q8_0", "q4_0/q4_0"], reference=None, depths=[0, 1000], flag_sets=None,
                n_prompt=64, n_gen=16, repetitions=2)
    args.update(kw)
    return bench.BenchSpec.make(**args)


@pytest.mark.parametrize("kw, fragment", [
    ({"kv": ["q8_0"]}, "not a K/V type pair"), ({"kv": []}, "at least one"), ({"depths": [-1]}, "non-negative"),
    ({"repetitions": 0}, "-r must be"), ({"n_prompt": 0, "n_gen": 0}, "-p or -n"), ({"flag_sets": ["-fa '1"]}, "--flags"),
])
def test_spec_validation(kw, fragment):
    with pytest.raises(BadInput, match=fragment):
        _spec(**kw)


def test_reference_is_always_measured():
    spec = _spec(kv=["q8_0/q8_0"], reference="f16/f16")
    assert spec.kv == ("f16/f16", "q8_0/q8_0") and spec.reference == "f16/f16"


def test_matrix_ratios_markdown_and_plot(tmp_path):
    exe = write_script(tmp_path / "llama-bench", FAKE_BENCH)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    result = bench.run(exe, model, _spec(flag_sets=["-fa 0", "-fa 1"]), tmp_path / "out")
    calls = (tmp_path / "llama-bench.calls").read_text().splitlines()
    assert len(calls) == 6  # 3 KV pairs x 2 flag sets, each with the whole depth list
    assert all("-d 0,1000" in c and "-r 2" in c and "-o json" in c for c in calls)
    rows = result["rows"]
    assert len(rows) == 3 * 2 * 2 * 2  # kv x flags x depth x (pp, tg)
    row = lambda kv, flags, test, depth: next(r for r in rows if (r["kv"], r["flags"], r["test"], r["depth"]) == (kv, flags, test, depth))  # noqa: E731
    assert row("f16/f16", "-fa 0", "tg16", 0)["ratio"] == 1.0
    assert row("q8_0/q8_0", "-fa 1", "tg16", 1000)["ratio"] == pytest.approx(0.9)
    assert row("q4_0/q4_0", "-fa 0", "pp64", 0)["ratio"] == pytest.approx(0.8)
    assert row("q8_0/q8_0", "-fa 1", "tg16", 0)["avg_ts"] == pytest.approx(135.0)
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["rows"] == rows and saved["reference"] == "f16/f16"
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "| q8_0/q8_0 | -fa 1 | tg16 | 1000 |" in md and "0.900" in md
    png = tmp_path / "out" / "decode_vs_depth.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failing_llama_bench(tmp_path):
    exe = write_script(tmp_path / "llama-bench", "import sys\nprint('error: unknown cache type', file=sys.stderr)\nsys.exit(1)\n")
    with pytest.raises(VerificationFailed, match="llama-bench failed for f16/f16 : error: unknown cache type"):
        bench.run(exe, tmp_path / "m", _spec(), tmp_path / "out")


def test_bench_cli_bad_input(proj):
    assert_clean_error(run_cli("bench", "--kv", "q8_0", cwd=proj.root), 2, "not a K/V type pair")


@pytest.mark.slow
def test_real_bench(real_build, tmp_path):
    done = run_pf("bench", "--build", real_build["key"], "--kv", "f16/f16,q8_0/q8_0", "--depth", "0,256", "-n", "8",
                  "-r", "2", "--out", str(tmp_path), "--json", cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    tg = [r for r in result["rows"] if r["test"] == "tg8"]
    assert {(r["kv"], r["depth"]) for r in tg} == {(kv, d) for kv in ("f16/f16", "q8_0/q8_0") for d in (0, 256)}
    assert all(r["avg_ts"] > 0 for r in tg)
    assert all(r["ratio"] == 1.0 for r in tg if r["kv"] == "f16/f16")
    assert (tmp_path / "decode_vs_depth.png").is_file()
