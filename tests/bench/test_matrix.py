"""polyforge bench: the llama-bench matrix against a fake llama-bench; the real one is slow."""

from __future__ import annotations

import json

import pytest

from buildkit import FAKE_BENCH, LLAMA_META, real_build, run_pf, write_gguf_header, write_script  # noqa: F401 (fixture)
from conftest import ROOT, assert_clean_error, run_cli
from polyforge.bench import matrix as bench
from polyforge.errors import BadInput, VerificationFailed


def _spec(**kw):
    args = dict(kv=["f16/f16,q8_0/q8_0", "q4_0/q4_0"], reference=None, depths=[0, 1000], flag_sets=None,
                prompts=[64], n_gen=16, repetitions=2)
    args.update(kw)
    return bench.BenchSpec.make(**args)


@pytest.mark.parametrize("kw, fragment", [
    ({"kv": ["q8_0"]}, "not a K/V type pair"), ({"kv": []}, "at least one"), ({"depths": [-1]}, "non-negative"),
    ({"repetitions": 0}, "-r must be"), ({"prompts": [0], "n_gen": 0}, "-p or -n"), ({"prompts": [64, -1]}, "-p or -n"),
    ({"flag_sets": ["-fa '1"]}, "--flags"),
    ({"bandwidth": 0}, "--bandwidth 0: give auto, off or a positive"),
    ({"bandwidth": "fast"}, "--bandwidth fast: give auto"), ({"baseline": "q8_0"}, "--baseline q8_0: not a K/V"),
])
def test_spec_validation(kw, fragment):
    with pytest.raises(BadInput, match=fragment):
        _spec(**kw)


def test_reference_and_baseline_are_always_measured():
    spec = _spec(kv=["q8_0/q8_0"], reference="f16/f16")
    assert spec.kv == ("f16/f16", "q8_0/q8_0") and spec.reference == "f16/f16"
    spec = _spec(kv=["turbo3/turbo3"], reference="f16/f16")
    assert spec.kv == ("f16/f16", "q8_0/q8_0", "turbo3/turbo3") and spec.baseline == "q8_0/q8_0"
    assert _spec(bandwidth="auto").bandwidth == "auto" and _spec(bandwidth="off").bandwidth is None
    assert _spec(bandwidth="3350").bandwidth == 3350.0


def test_matrix_ratios_markdown_and_plot(tmp_path):
    exe = write_script(tmp_path / "llama-bench", FAKE_BENCH)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    result = bench.run(exe, model, _spec(flag_sets=["-fa 0", "-fa 1"]), tmp_path / "out")
    calls = (tmp_path / "llama-bench.calls").read_text().splitlines()
    assert len(calls) == 6  # 3 KV pairs x 2 flag sets, each with the whole depth list
    assert all("-d 0,1000" in c and "-r 2" in c and "-o json" in c for c in calls)
    rows = result.rows
    assert len(rows) == 3 * 2 * 2 * 2  # kv x flags x depth x (pp, tg)
    row = lambda kv, flags, test, depth: next(r for r in rows if (r.kv, r.flags, r.test, r.depth) == (kv, flags, test, depth))  # noqa: E731
    assert row("f16/f16", "-fa 0", "tg16", 0).ratio == 1.0
    assert row("q8_0/q8_0", "-fa 1", "tg16", 1000).ratio == pytest.approx(0.9)
    assert row("q4_0/q4_0", "-fa 0", "pp64", 0).ratio == pytest.approx(0.8)
    assert row("q8_0/q8_0", "-fa 1", "tg16", 0).avg_ts == pytest.approx(135.0)
    # the baseline column: each pair against q8_0/q8_0 of the same run
    assert row("q8_0/q8_0", "-fa 1", "tg16", 1000).baseline_ratio == 1.0
    assert row("q4_0/q4_0", "-fa 0", "pp64", 0).baseline_ratio == pytest.approx(0.8 / 0.9, abs=1e-4)
    assert row("f16/f16", "-fa 0", "tg16", 0).baseline_ratio == pytest.approx(1 / 0.9, abs=1e-4)
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["rows"] == [r.as_dict() for r in rows] and saved["reference"] == "f16/f16"
    # bench.json: the result before its files were written; no roofline keys without a bandwidth
    assert list(saved) == ["reference", "baseline", "bandwidth", "spec", "model", "rows", "seconds"]
    assert saved["bandwidth"] is None
    assert list(saved["rows"][0]) == ["kv", "flags", "test", "depth", "avg_ts", "stddev_ts", "samples", "n_gen",
                                      "model_size", "ratio", "baseline_ratio"]
    assert bench.BenchResult.from_dict(saved).as_dict() == saved
    assert set(result.files) == {"json", "markdown", "png"} and result.as_dict()["files"] == result.files
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "| q8_0/q8_0 | -fa 1 | tg16 | 1000 |" in md and "0.900 | 1.000 |" in md
    png = tmp_path / "out" / "decode_vs_depth.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prompt_sizes_are_tests_of_their_own(tmp_path):
    """-p 512,64,64,0: one llama-bench call per pair with the sizes once each (0 dropped), a row per
    size and depth, each with its ratio, and bench.md in numeric order (pp64 before pp512)."""
    exe = write_script(tmp_path / "llama-bench", FAKE_BENCH)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    spec = _spec(kv=["f16/f16,q8_0/q8_0"], prompts=[512, 64, 64, 0], n_gen=0, depths=[0])
    assert spec.prompts == (64, 512) and spec.as_dict()["prompts"] == [64, 512]
    result = bench.run(exe, model, spec, tmp_path / "out")
    calls = (tmp_path / "llama-bench.calls").read_text().splitlines()
    assert len(calls) == 2 and all(" -p 64,512 -n 0 " in c for c in calls)
    assert sorted((r.kv, r.test) for r in result.rows) == [
        ("f16/f16", "pp512"), ("f16/f16", "pp64"), ("q8_0/q8_0", "pp512"), ("q8_0/q8_0", "pp64")]
    assert all(r.ratio == pytest.approx(1.0 if r.kv == "f16/f16" else 0.9) for r in result.rows)
    md = (tmp_path / "out" / "bench.md").read_text()
    assert md.index("| pp64 |") < md.index("| pp512 |")
    assert sorted(["tg16", "pp512", "pp64+tg16", "pp64"], key=bench.order_of_test) == ["pp64", "pp512", "tg16", "pp64+tg16"]


def test_bench_json_before_prompt_lists_still_reads():
    saved = {"reference": "f16/f16", "bandwidth_gbps": None, "model": "m.gguf", "rows": [], "seconds": 1.0,
             "spec": {"kv": ["f16/f16"], "depths": [0], "flags": [""], "n_prompt": 512, "n_gen": 0, "repetitions": 2}}
    assert bench.BenchResult.from_dict(saved).spec.prompts == (512,)


def test_gguf_metadata_and_kv_shape(tmp_path):
    from polyforge.models.gguf import read_metadata
    write_gguf_header(tmp_path / "m.gguf", {**LLAMA_META, "tokenizer.ggml.tokens": 0})
    meta = read_metadata(tmp_path / "m.gguf")
    assert meta["llama.block_count"] == 16 and meta["general.architecture"] == "llama"
    shape = bench.kv_shape(meta)
    assert shape == bench.KvShape((8,) * 16, 128, 128)
    # f16: 16 layers x 8 heads x (128 + 128) values x 2 bytes; turbo3: 26 bytes per 64 values
    assert shape.bytes_per_token("f16", "f16") == 16 * 8 * 256 * 2
    assert shape.bytes_per_token("q8_0", "turbo3") == 16 * 8 * 128 * (34 / 32 + 26 / 64)
    per_layer = bench.kv_shape({**meta, "llama.attention.head_count_kv": [8, 0] * 8, "llama.attention.key_length": 64})
    assert per_layer.n_head_kv == (8, 0) * 8 and per_layer.head_dim_k == 64


@pytest.mark.parametrize("change, fragment", [
    ({"llama.attention.sliding_window": 512}, "sliding-window"), ({"llama.block_count": None}, "lacks"),
    ({"llama.attention.head_count_kv": [8, 8]}, "2 entries for 16 layers"),
])
def test_kv_shape_refusals(change, fragment):
    meta = {k: v for k, v in {**LLAMA_META, **change}.items() if v is not None}
    with pytest.raises(BadInput, match=fragment):
        bench.kv_shape(meta)


def test_not_a_gguf(tmp_path):
    from polyforge.models.gguf import read_metadata
    (tmp_path / "x.gguf").write_bytes(b"GGML....")
    with pytest.raises(BadInput, match="not a GGUF file"):
        read_metadata(tmp_path / "x.gguf")
    (tmp_path / "y.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    with pytest.raises(BadInput, match="truncated"):
        read_metadata(tmp_path / "y.gguf")


def test_roofline_columns(tmp_path):
    exe = write_script(tmp_path / "llama-bench", FAKE_BENCH)
    write_gguf_header(tmp_path / "m.gguf", LLAMA_META)
    result = bench.run(exe, tmp_path / "m.gguf", _spec(kv=["f16/f16,q8_0/q8_0"], prompts=[0], bandwidth=4000),
                       tmp_path / "out")
    row = next(r for r in result.rows if (r.kv, r.depth) == ("q8_0/q8_0", 1000))
    nbytes = 2e9 + (1000 + 7.5) * 16 * 8 * 256 * 34 / 32  # weights + KV at the mean depth of tg16
    assert row.bytes_per_token == round(nbytes)
    assert row.roofline_ts == pytest.approx(4000e9 / nbytes, abs=0.1)
    assert row.roofline_fraction == pytest.approx(row.avg_ts / row.roofline_ts, abs=1e-4)
    assert list(row.as_dict())[-3:] == ["bytes_per_token", "roofline_ts", "roofline_fraction"]
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["bandwidth"]["reference_gbps"] == 4000
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "roofline at 4000 GB/s (given)" in md and "| of bandwidth |" in md and f"{row.roofline_fraction:.0%} |" in md
    with pytest.raises(BadInput, match="no size known for KV type q3_k"):  # a given figure: refused before any run
        bench.run(exe, tmp_path / "m.gguf", _spec(kv=["q3_k/q3_k"], bandwidth=4000), tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
    # a measured bandwidth on a pair or model with no modelled bytes: the runs go on, without rooflines
    measured = bench.MemoryBandwidth("GPU", 3352.3, 2900.0)
    logged = []
    write_gguf_header(tmp_path / "swa.gguf", {**LLAMA_META, "llama.attention.sliding_window": 4096})
    result = bench.run(exe, tmp_path / "swa.gguf", _spec(kv=["f16/f16"]), tmp_path / "out3", bandwidth=measured,
                       log=logged.append)
    assert result.bandwidth is None and all(r.roofline_fraction is None for r in result.rows)
    assert any(m.startswith("no rooflines: roofline: llama has sliding-window layers") for m in logged)
    result = bench.run(exe, tmp_path / "m.gguf", _spec(kv=["f16/f16"], prompts=[0]), tmp_path / "out4",
                       bandwidth=measured)
    row = next(r for r in result.rows if r.kv == "f16/f16" and r.depth == 0)
    assert row.roofline_ts == pytest.approx(3352.3e9 / row.bytes_per_token, abs=0.1)  # the peak, not the copy rate


def test_failing_llama_bench(tmp_path):
    exe = write_script(tmp_path / "llama-bench", "import sys\nprint('error: unknown cache type', file=sys.stderr)\nsys.exit(1)\n")
    with pytest.raises(VerificationFailed, match="llama-bench failed for f16/f16 : error: unknown cache type"):
        bench.run(exe, tmp_path / "m", _spec(), tmp_path / "out")


def test_bench_cli_bad_input(proj):
    assert_clean_error(run_cli("bench", "--kv", "q8_0", cwd=proj.root), 2, "not a K/V type pair")
    assert_clean_error(run_cli("bench", "--bandwidth", "-1", cwd=proj.root), 2, "--bandwidth -1: give auto, off or a")
    assert_clean_error(run_cli("bench", "-p", "64,1k", cwd=proj.root), 2, "-p 64,1k: not a comma-separated list")
    assert_clean_error(run_cli("bench", "-p", "0", "-n", "0", cwd=proj.root), 2, "-p or -n must be > 0")


@pytest.mark.slow
def test_real_bench(real_build, tmp_path):
    done = run_pf("bench", "--build", real_build.key, "--kv", "f16/f16,q8_0/q8_0", "--depth", "0,256", "-n", "8",
                  "-r", "2", "--out", str(tmp_path), "--json", cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    tg = [r for r in result["rows"] if r["test"] == "tg8"]
    assert {(r["kv"], r["depth"]) for r in tg} == {(kv, d) for kv in ("f16/f16", "q8_0/q8_0") for d in (0, 256)}
    assert all(r["avg_ts"] > 0 for r in tg)
    assert all(r["ratio"] == 1.0 for r in tg if r["kv"] == "f16/f16")
    assert (tmp_path / "decode_vs_depth.png").is_file()


@pytest.mark.slow
def test_real_bench_roofline(real_build, tmp_path):
    """--bandwidth on a real run: the weights as llama-bench sizes them plus the KV bytes of the model's shape;
    prompt rows (two sizes, one llama-bench call) get ratios but no roofline."""
    done = run_pf("bench", "--build", real_build.key, "-m", "random:tiny,n_layer=3", "--kv", "f16/f16,q8_0/turbo3",
                  "--depth", "0,512", "-p", "16,8", "-n", "4", "-r", "1", "--bandwidth", "50", "--out", str(tmp_path),
                  "--json", cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    pp = [r for r in rows if r["test"].startswith("pp")]
    # q8_0/q8_0, the default baseline, is measured in the same run
    assert sorted((r["kv"], r["test"], r["depth"]) for r in pp) == sorted(
        (kv, t, d) for kv in ("f16/f16", "q8_0/q8_0", "q8_0/turbo3") for t in ("pp8", "pp16") for d in (0, 512))
    assert all(r["avg_ts"] > 0 and r["ratio"] > 0 and "roofline_ts" not in r for r in pp)
    rows = [r for r in rows if r["test"] == "tg4"]
    f16, turbo = (next(r for r in rows if (r["kv"], r["depth"]) == (kv, 512)) for kv in ("f16/f16", "q8_0/turbo3"))
    # tiny: 3 layers, 1 KV head of 128; weights the same in both rows
    kv_f16 = (512 + 1.5) * 3 * 256 * 2
    kv_turbo = (512 + 1.5) * 3 * 128 * (34 / 32 + 26 / 64)
    assert f16["model_size"] == turbo["model_size"] > 0
    assert f16["bytes_per_token"] - turbo["bytes_per_token"] == pytest.approx(kv_f16 - kv_turbo, abs=1)
    assert 0 < f16["roofline_fraction"] == pytest.approx(f16["avg_ts"] / f16["roofline_ts"], abs=1e-3)
    assert "| of bandwidth |" in (tmp_path / "bench.md").read_text()


def test_markdown_columns():
    """The table comes from COLUMNS; the roofline's three only with a bandwidth."""
    rows = [bench.BenchRow("f16/f16", "", "tg16", 0, 100.0, 1.5, 2, 16, 2_000_000_000, ratio=1.0, baseline_ratio=1.25,
                           bytes_per_token=2_000_000_000, roofline_ts=50.0, roofline_fraction=2.0),
            bench.BenchRow("q8_0/q8_0", "-fa 1", "pp64", 0, 320.0, 1.5, 2, 0, 2_000_000_000, ratio=0.8)]
    md = bench.markdown(bench.BenchResult(_spec(), "m.gguf", rows, 1.0, bandwidth=bench.MemoryBandwidth.of(100)))
    assert md.splitlines()[2:] == [
        "| kv | flags | test | depth | t/s | ± | ratio | vs baseline | GB/token | roofline t/s | of bandwidth |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        "| f16/f16 | - | tg16 | 0 | 100.00 | 1.50 | 1.000 | 1.250 | 2.00 | 50 | 200% |",
        "| q8_0/q8_0 | -fa 1 | pp64 | 0 | 320.00 | 1.50 | 0.800 | - | - | - | - |"]
    plain = bench.markdown(bench.BenchResult(_spec(), "m.gguf", rows, 1.0))
    assert plain.splitlines()[2] == "| kv | flags | test | depth | t/s | ± | ratio | vs baseline |"
