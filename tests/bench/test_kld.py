"""polyforge bench --kld: the rules (types, pairs, Pareto front, recommendation) on real cases, the run
against a fake llama-perplexity, the CLI's bad input; the real run on SmolLM2 is slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from buildkit import FAKE_BENCH, real_build, run_pf, write_script  # noqa: F401 (fixture)
from conftest import ROOT, assert_clean_error, run_cli
from polyforge.bench import kld
from polyforge.errors import BadInput, VerificationFailed
from polyforge.kvtypes import bits_per_pair, dominates

HELP = """\
-ctk,  --cache-type-k TYPE              KV cache data type for K
                                        allowed values: f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1,
                                        turbo2, turbo3, turbo4
                                        (default: f16)
-ctv,  --cache-type-v TYPE              KV cache data type for V
"""
TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "turbo2", "turbo3", "turbo4")


def test_supported_types_read_across_wrapped_help_lines():
    assert kld.supported_types(HELP) == TYPES
    assert kld.supported_types(HELP.split("turbo2")[0].rstrip().rstrip(",") + "\n") == TYPES[:9]
    assert kld.supported_types("usage: llama-perplexity\n") == ()


def test_bits_per_pair_from_block_sizes():
    assert bits_per_pair("f16/f16") == 32.0
    assert bits_per_pair("q8_0/q4_0") == 8.5 + 4.5  # 34-byte blocks of 32, 18-byte blocks of 32
    assert bits_per_pair("q8_0/turbo3") == 8.5 + 3.25  # 3 bits + one fp16 norm per 64 values
    assert bits_per_pair("q3_k/q3_k") is None


def test_default_pairs_symmetric_and_q8_0_keys_most_bits_first():
    pairs = kld.default_pairs(TYPES)
    assert "f32/f32" not in pairs and "bf16/bf16" not in pairs  # more bits than the reference, no use
    assert pairs[0] == "f16/f16" and pairs[1] == "q8_0/q8_0"
    assert {"q4_0/q4_0", "turbo3/turbo3", "turbo2/turbo2", "q8_0/q4_0", "q8_0/turbo4", "q8_0/turbo2"} <= set(pairs)
    assert "q4_0/q8_0" not in pairs and "q8_0/f16" not in pairs  # cheap keys, or V dearer than K: not proposed
    bits = [bits_per_pair(p) for p in pairs]
    assert bits == sorted(bits, reverse=True)
    assert kld.default_pairs(("f16", "q4_0")) == ("f16/f16", "q4_0/q4_0")  # no q8_0: no asymmetric pairs


def _row(kv, kld_mean, top1=None):
    return kld.KldRow(kv, bits_per_pair(kv), kld_mean, None, None, top1, None, None)


# the measured Qwen2.5 Coder 1.5B shape: upstream's 4-bit keys collapse, q8_0 keys and turbo4 hold
COLLAPSE = [_row("f16/f16", 0.0001), _row("q8_0/q8_0", 0.0030), _row("q8_0/q4_0", 0.0056), _row("q4_0/q4_0", 6.55),
            _row("q8_0/turbo4", 0.0062), _row("q8_0/turbo3", 0.0146), _row("turbo4/turbo4", 0.0265),
            _row("turbo3/turbo3", 0.383)]


def test_pareto_front_drops_the_dominated():
    rows = [kld.KldRow(**r.__dict__) for r in COLLAPSE]
    kld.mark_pareto(rows)
    front = {r.kv for r in rows if r.pareto}
    # q4_0/q4_0 (9 bits, 6.55) is beaten by turbo4/turbo4 (8.5 bits, 0.0265); q8_0/q4_0 (13 bits) by
    # q8_0/turbo4 (12.75 bits) only if its KLD were lower: 0.0062 > 0.0056, so both stay
    assert front == {"f16/f16", "q8_0/q8_0", "q8_0/q4_0", "q8_0/turbo4", "q8_0/turbo3", "turbo4/turbo4",
                     "turbo3/turbo3"}
    assert dominates((8.5, 0.0265), (9.0, 6.55)) and not dominates((9.0, 1.0), (9.0, 1.0))


def test_recommendation_the_fewest_bits_within_the_bound():
    rec = kld.recommend(COLLAPSE, None)  # bound: q8_0/q4_0's 0.0056
    assert (rec.pair, rec.bound, rec.bound_from) == ("q8_0/q4_0", 0.0056, "q8_0/q4_0")
    assert rec.flags == "-ctk q8_0 -ctv q4_0"
    # a looser bound: turbo4/turbo4 (8.5 bits) under 0.03, never the collapsed q4_0/q4_0
    assert kld.recommend(COLLAPSE, 0.03).pair == "turbo4/turbo4"
    assert kld.recommend(COLLAPSE, 0.007).pair == "q8_0/turbo4"
    # nothing under the bound but the reference: the reference
    assert kld.recommend(COLLAPSE, 0.0002).pair == "f16/f16"
    with pytest.raises(VerificationFailed, match="not even f16/f16"):
        kld.recommend(COLLAPSE, 0.00001)
    with pytest.raises(BadInput, match="give --max-kld"):
        kld.recommend([r for r in COLLAPSE if r.kv != "q8_0/q4_0"], None)


def test_equal_bits_prefer_the_lower_kld():
    rows = [_row("f16/f16", 0.0), _row("q4_0/q4_0", 0.05), _row("iq4_nl/iq4_nl", 0.03), _row("q8_0/q4_0", 0.06)]
    assert kld.recommend(rows, None).pair == "iq4_nl/iq4_nl"


def test_spec_validation(tmp_path):
    make = lambda **kw: kld.KldSpec.make(**{"kv": None, "text": None, "ctx": 512, "chunks": None, "max_kld": None,  # noqa: E731
                                            "depths": [], **kw})
    assert make().text == kld.DEFAULT_TEXT and kld.DEFAULT_TEXT.stat().st_size > 4000
    with pytest.raises(BadInput, match="not a K/V type pair"):
        make(kv=["q8_0"])
    with pytest.raises(BadInput, match="unknown KV type q3_k"):
        make(kv=["q8_0/q3_k"])
    with pytest.raises(BadInput, match="no such file"):
        make(text=str(tmp_path / "missing.txt"))
    with pytest.raises(BadInput, match="--max-kld takes a positive"):
        make(max_kld=0)
    with pytest.raises(BadInput, match="--ctx must be"):
        make(chunks=0)
    spec = make(kv=["q8_0/q4_0,turbo3/turbo3"], max_kld=0.01)
    assert spec.measured(TYPES) == ("f16/f16", "q8_0/q4_0", "turbo3/turbo3")  # with --max-kld: no bound pair
    assert make(kv=["turbo3/turbo3"]).measured(TYPES) == ("f16/f16", "turbo3/turbo3", "q8_0/q4_0")
    with pytest.raises(BadInput, match="this build has no KV type turbo3"):
        make(kv=["turbo3/turbo3"]).measured(TYPES[:9])


# a fake llama-perplexity: the KLD of a pair is its bits' distance from 32, so the rules have real inputs
FAKE_PERPLEXITY = '''
import sys
args = sys.argv[1:]
if "--help" in args:
    print(open(sys.argv[0] + ".help").read())
    sys.exit(0)
k, v = args[args.index("-ctk") + 1], args[args.index("-ctv") + 1]
with open(sys.argv[0] + ".calls", "a") as f:
    f.write(" ".join(args) + "\\n")
base = args[args.index("--kl-divergence-base") + 1]
if "--kl-divergence" not in args:
    open(base, "w").write("logits")
    print("Final estimate: PPL = 10.5000 +/- 0.1")
    sys.exit(0)
bits = {"f16": 16, "q8_0": 8.5, "q4_0": 4.5, "turbo4": 4.25, "turbo3": 3.25}
kld = 0.0 if (k, v) == ("f16", "f16") else (32 - bits[k] - bits[v]) ** 2 / 1000
print(f"llama_kv_cache: size =    12.00 MiB")
print(f"Mean PPL(Q)                   :  10.6000 +/- 0.1")
print(f"Mean    KLD:   {kld:.6f} ±   0.0001")
print(f"Maximum KLD:   {10 * kld:.6f}")
print(f"99.0%   KLD:   {5 * kld:.6f}")
print(f"Same top p: {100 - 100 * kld:.3f} ± 0.1 %")
'''


def _fake(tmp_path):
    exe = write_script(tmp_path / "llama-perplexity", FAKE_PERPLEXITY)
    (tmp_path / "llama-perplexity.help").write_text(
        "-ctk,  --cache-type-k TYPE    KV cache data type for K\n"
        "                              allowed values: f32, f16, bf16, q8_0, q4_0,\n"
        "                              turbo3, turbo4\n")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    return exe, model


def test_run_measures_every_supported_pair_and_recommends(tmp_path):
    exe, model = _fake(tmp_path)
    spec = kld.KldSpec.make(None, None, 512, 2, None, [])
    steps = []
    result = kld.run(exe, None, model, spec, tmp_path / "out", progress=lambda d, t, w: steps.append((d, t)))
    measured = [r.kv for r in result.rows]
    assert measured == ["f16/f16", "q8_0/q8_0", "q8_0/q4_0", "q8_0/turbo4", "q8_0/turbo3", "q4_0/q4_0",
                        "turbo4/turbo4", "turbo3/turbo3"]
    calls = (tmp_path / "llama-perplexity.calls").read_text().splitlines()
    assert len(calls) == 1 + len(measured)
    assert all("-fa on" in c and "-c 512" in c and "--chunks 2" in c for c in calls)
    assert steps[0] == (0, 1 + len(measured)) and steps[-1] == (1 + len(measured),) * 2
    row = {r.kv: r for r in result.rows}
    assert row["f16/f16"].kld_mean == 0.0 and row["q8_0/q4_0"].kld_mean == pytest.approx(0.361)
    assert row["q8_0/q4_0"].top1 == pytest.approx(63.9) and row["q8_0/q4_0"].kv_mib == 12.0
    # fewer bits, more KLD: every pair is on the front; the bound (q8_0/q4_0's) admits only pairs of >= 13 bits
    assert all(r.pareto for r in result.rows)
    assert result.recommendation.pair == "q8_0/q4_0"
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["recommendation"] == {"pair": "q8_0/q4_0", "flags": "-ctk q8_0 -ctv q4_0",
                                       "bound": pytest.approx(0.361), "bound_from": "q8_0/q4_0"}
    assert saved["base"]["ppl"] == 10.5 and len(saved["rows"]) == len(measured)
    assert "decode_ts" not in saved["rows"][0]
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "recommended: `-ctk q8_0 -ctv q4_0`" in md and "| K/V | bits | KLD |" in md
    assert "decode t/s" not in md
    assert (tmp_path / "out" / "bits_vs_kld.png").stat().st_size > 10_000
    assert not (tmp_path / "out" / "base.kld").exists()  # the logits are large: removed


def test_depths_add_decode_speed_from_llama_bench(tmp_path):
    exe, model = _fake(tmp_path)
    bench_bin = write_script(tmp_path / "llama-bench", FAKE_BENCH)
    spec = kld.KldSpec.make(["q8_0/q8_0"], None, 512, 1, None, [1000, 0], n_gen=8, repetitions=1)
    result = kld.run(exe, bench_bin, model, spec, tmp_path / "out")
    calls = (tmp_path / "llama-bench.calls").read_text().splitlines()
    assert len(calls) == 3 and all("-d 0,1000" in c and "-fa 1" in c and "-n 8" in c for c in calls)
    row = {r.kv: r for r in result.rows}
    # the fake: 1.5 x (100 for f16 keys, 90 for q8_0) with -fa 1, divided by 1 + depth / 1000
    assert row["f16/f16"].decode_ts == {"0": 150.0, "1000": 75.0}
    assert row["q8_0/q8_0"].decode_ts == {"0": 135.0, "1000": 67.5}
    assert "| decode t/s |" in (tmp_path / "out" / "bench.md").read_text()
    assert "135.0 / 67.5" in (tmp_path / "out" / "bench.md").read_text()
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["rows"][0]["decode_ts"] == {"0": 150.0,
                                                                                              "1000": 75.0}


def test_run_refuses_a_pair_the_build_lacks_before_any_run(tmp_path):
    exe, model = _fake(tmp_path)
    with pytest.raises(BadInput, match="this build has no KV type q5_0"):
        kld.run(exe, None, model, kld.KldSpec.make(["q5_0/q5_0"], None, 512, None, None, []), tmp_path / "out")
    assert not (tmp_path / "llama-perplexity.calls").exists() and not (tmp_path / "out").exists()


def test_bench_kld_cli_bad_input(proj, tmp_path):
    assert_clean_error(run_cli("bench", "--kld", "--kv", "q8_0", cwd=proj.root), 2, "not a K/V type pair")
    assert_clean_error(run_cli("bench", "--kld", "--kv", "q8_0/q3_k", cwd=proj.root), 2, "unknown KV type q3_k")
    assert_clean_error(run_cli("bench", "--kld", "--text", str(tmp_path / "none.txt"), cwd=proj.root), 2,
                       "no such file")
    assert_clean_error(run_cli("bench", "--kld", "--max-kld", "-1", cwd=proj.root), 2, "--max-kld takes a positive")
    assert_clean_error(run_cli("bench", "--kld", "--agents", "1,4", cwd=proj.root), 2, "--kld measures against")
    assert_clean_error(run_cli("bench", "--text", "x.txt", cwd=proj.root), 2, "--text goes with --kld")
    assert not (proj.root / "build").exists()


@pytest.mark.slow
def test_real_bench_kld_on_smollm2(real_build, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(kld.DEFAULT_TEXT.read_text()[:3000])
    done = run_pf("bench", "--kld", "--build", real_build.key, "-m", "smollm2-135m", "--kv", "q8_0/q8_0,q4_0/q4_0",
                  "--text", str(text), "--ctx", "128", "--out", str(tmp_path / "out"), "--json", cwd=ROOT,
                  timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    rows = {r["kv"]: r for r in result["rows"]}
    assert set(rows) == {"f16/f16", "q8_0/q8_0", "q4_0/q4_0", "q8_0/q4_0"}  # with the bound's pair
    assert abs(rows["f16/f16"]["kld_mean"]) < 1e-3 and rows["f16/f16"]["top1"] > 99
    assert rows["q4_0/q4_0"]["kld_mean"] > rows["q8_0/q8_0"]["kld_mean"] and rows["q4_0/q4_0"]["kld_mean"] > 1e-3
    assert all(r["bits"] == bits_per_pair(kv) for kv, r in rows.items())
    rec = result["recommendation"]
    assert rec["bound"] == rows["q8_0/q4_0"]["kld_mean"] and rows[rec["pair"]]["kld_mean"] <= rec["bound"]
    assert rec["flags"] == "-ctk {} -ctv {}".format(*rec["pair"].split("/"))
    assert (tmp_path / "out" / "bits_vs_kld.png").is_file()
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_text("not a model")
    assert_clean_error(run_pf("bench", "--kld", "--build", real_build.key, "-m", str(not_gguf), cwd=ROOT), 2,
                       "not a GGUF file")


def test_run_kld_through_the_pipeline_on_an_existing_build(proj, tmp_path):
    """--build KEY and a GGUF path: llama-perplexity (and llama-bench with depths) of that build, the
    model used where it lies, the result under build/KEY/bench/ with the key."""
    from buildkit import fake_build
    from polyforge import pipeline
    build_dir = fake_build(proj.root, "cpu-fake", {"llama-perplexity": FAKE_PERPLEXITY, "llama-bench": FAKE_BENCH})
    _, model = _fake(tmp_path)
    (build_dir / "bin" / "llama-perplexity.help").write_text((tmp_path / "llama-perplexity.help").read_text())
    spec = kld.KldSpec.make(["q8_0/q4_0"], None, 512, 1, None, [0], n_gen=4, repetitions=1)
    result = pipeline.run_kld(proj.chain(), spec, model=str(model), build_key="cpu-f",
                              build_fn=lambda chain, options: pytest.fail("--build builds nothing"))
    assert result.build == "cpu-fake" and [r.kv for r in result.rows] == ["f16/f16", "q8_0/q4_0"]
    assert result.rows[1].decode_ts == {"0": 135.0} and result.model == str(model.resolve())
    assert Path(result.files["json"]).parent.parent == build_dir / "bench"
