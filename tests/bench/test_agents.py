"""polyforge bench --agents: B agents over a shared prefix, against a fake llama-batched-bench."""

from __future__ import annotations

import json

import pytest

import buildkit
from buildkit import FAKE_BATCHED_BENCH, LLAMA_META, fake_build, run_pf, write_gguf_header, write_script
from conftest import ROOT, assert_clean_error, run_cli
from polyforge.bench import agents, matrix
from polyforge.errors import BadInput, VerificationFailed

real_build = buildkit.real_build  # the session fixture (test_real_agents)


def _spec(**kw):
    args = dict(kv=["f16/f16,q8_0/q8_0", "q4_0/q4_0"], reference=None, agents=[8, 1, 4], prefixes=[3000, 1000],
                n_gen=16)
    args.update(kw)
    return agents.AgentsSpec.make(**args)


def _run(tmp_path, **kw):
    exe = write_script(tmp_path / "llama-batched-bench", FAKE_BATCHED_BENCH)
    model = tmp_path / "m.gguf"
    write_gguf_header(model, LLAMA_META)
    result = agents.run(exe, model, _spec(**kw), tmp_path / "out")
    calls = (tmp_path / "llama-batched-bench.calls").read_text().splitlines()
    return result, calls


def _row(result, kv, prefix, n):
    return next(r for r in result.rows if (r.kv, r.prefix, r.agents) == (kv, prefix, n))


@pytest.mark.parametrize("kw, fragment", [
    ({"kv": ["q8_0"]}, "not a K/V type pair"), ({"agents": []}, "--agents: a list of agent counts"),
    ({"agents": [0, 4]}, "--agents"), ({"agents": [257]}, "from 1 to 256"), ({"prefixes": []}, "--prefix: a list"),
    ({"prefixes": [0]}, "positive prompt lengths"), ({"n_gen": 0}, "at least one token"),
    ({"flag_sets": ["-ub '2"]}, "--flags"),
    ({"prefixes": [2**24], "agents": [256], "separate": True}, "llama.cpp's context holds at most"),
])
def test_spec_validation(kw, fragment):
    with pytest.raises(BadInput, match=fragment):
        _spec(**kw)


def test_int_list():
    assert matrix.int_list("1, 4,8,", "--agents") == [1, 4, 8]
    with pytest.raises(BadInput, match="--agents 1,x: not a comma-separated list of whole numbers"):
        matrix.int_list("1,x", "--agents")


def test_spec_sorts_and_adds_the_reference():
    spec = _spec(kv=["q8_0/q8_0"], reference="f16/f16")
    assert spec.kv == ("f16/f16", "q8_0/q8_0") and spec.reference == "f16/f16"
    assert spec.agents == (1, 4, 8) and spec.prefixes == (1000, 3000)


def test_pps_kvu_only_when_shared():
    shared, separate = _spec(), _spec(separate=True)
    argv = [str(a) for a in shared.argv("bb", "m.gguf", "q8_0/q4_0", 1000, "-ub 256")]
    assert argv == ["bb", "-m", "m.gguf", "-ctk", "q8_0", "-ctv", "q4_0", "-npp", "1000,1", "-ntg", "16",
                    "-npl", "1,4,8", "-c", str(1000 + 8 * 16), "-fa", "on", "-ngl", "99", "--output-format", "jsonl",
                    "-pps", "-kvu", "-ub", "256"]
    argv = [str(a) for a in separate.argv("bb", "m.gguf", "q8_0/q4_0", 1000, "")]
    assert "-pps" not in argv and "-kvu" not in argv
    assert argv[argv.index("-c") + 1] == str(8 * (1000 + 16))  # a copy of the prompt per agent


def test_agents_rows_ratios_markdown_and_plot(tmp_path):
    result, calls = _run(tmp_path)
    assert len(calls) == 3 * 2  # a call per KV pair and prefix, each with the whole B list
    assert all("-pps -kvu" in c and "-npl 1,4,8 " in c and "--output-format jsonl" in c and "-fa on -ngl 99" in c
               for c in calls)
    # a 1-token prompt after P: the tool can lose the lines printed just before it exits (the fake always does)
    assert sum(f"-npp 3000,1 -ntg 16 -npl 1,4,8 -c {3000 + 8 * 16} " in c for c in calls) == 3
    assert len(result.rows) == 3 * 2 * 3  # kv x prefix x B
    f16, q8, q4 = (_row(result, kv, 1000, 4) for kv in ("f16/f16", "q8_0/q8_0", "q4_0/q4_0"))
    # the fake: 100/90/80 t/s per agent, / (1 + P/1000); q4_0 also / (1 + B/100)
    assert f16.decode_ts == pytest.approx(200.0) and f16.ratio == 1.0
    assert q8.decode_ts == pytest.approx(180.0) and q8.ratio == pytest.approx(0.9)
    assert q4.ratio == pytest.approx(0.8 / 1.04, abs=1e-4)
    assert _row(result, "q4_0/q4_0", 3000, 8).ratio == pytest.approx(0.8 / 1.08, abs=1e-4)  # same P and B only
    assert q8.prompt_ts == pytest.approx(900.0) and q8.n_kv == 1000 + 4 * 16 and q8.n_gen == 16
    assert q8.decode_s == pytest.approx(4 * 16 / 180.0, abs=1e-5)
    # beside the reference: the baseline q8_0/q8_0, and the prefix's prefill against the reference's
    assert (q8.baseline_ratio, q8.prompt_ratio) == (1.0, pytest.approx(0.9))
    assert q4.baseline_ratio == pytest.approx(0.8 / 1.04 / 0.9, abs=1e-4) and q4.prompt_ratio == pytest.approx(0.8)
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert list(saved) == ["scenario", "reference", "baseline", "bandwidth", "spec", "model", "rows", "seconds"]
    assert saved["scenario"] == "agents" and saved["reference"] == "f16/f16"
    assert saved["spec"] == {"kv": ["f16/f16", "q8_0/q8_0", "q4_0/q4_0"], "agents": [1, 4, 8], "prefixes": [1000, 3000],
                             "n_gen": 16, "separate": False, "flags": [""], "rounds": 1}
    assert saved["rows"] == [r.as_dict() for r in result.rows]
    assert list(saved["rows"][0]) == ["kv", "flags", "prefix", "agents", "n_gen", "n_kv", "prompt_s", "prompt_ts",
                                      "decode_s", "decode_ts", "total_ts", "ratio", "baseline_ratio", "prompt_ratio"]
    assert agents.AgentsResult.from_dict(saved).as_dict() == saved
    assert set(result.files) == {"json", "markdown", "png"} and result.as_dict()["files"] == result.files
    md = (tmp_path / "out" / "bench.md").read_text().splitlines()
    assert md[0].startswith("shared prefix: B agents over one P-token prefix")
    assert "reference `f16/f16` (ratio), baseline `q8_0/q8_0` (vs baseline)" in md[0]
    assert md[2:4] == ["| kv | prefix | agents | prompt t/s | decode t/s | prompt ratio | ratio | vs baseline |",
                       "|---|---:|---:|---:|---:|---:|---:|---:|"]
    assert "| q8_0/q8_0 | 1000 | 4 | 900.00 | 180.00 | 0.900 | 0.900 | 1.000 |" in md
    assert "| q4_0/q4_0 | 1000 | 4 | 800.00 | 153.85 | 0.800 | 0.769 | 0.855 |" in md
    assert md[4] == "| f16/f16 | 1000 | 1 | 1000.00 | 50.00 | 1.000 | 1.000 | 1.111 |"  # by prefix, B, then kv
    png = tmp_path / "out" / "decode_vs_agents.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "out").glob("*.log"))[0] == "f16-f16-p1000.log"


def test_separate_prompts(tmp_path):
    result, calls = _run(tmp_path, separate=True, prefixes=[1000], flag_sets=["", "-ub 256"])
    assert len(calls) == 3 * 2 and not any("-pps" in c or "-kvu" in c for c in calls)
    assert sum(c.endswith("-ub 256") for c in calls) == 3
    q8 = next(r for r in result.rows if (r.kv, r.agents, r.flags) == ("q8_0/q8_0", 4, "-ub 256"))
    assert q8.decode_ts == pytest.approx(90.0) and q8.ratio == pytest.approx(0.9)  # the fake halves separate decode
    assert q8.n_kv == 4 * (1000 + 16)
    md = (tmp_path / "out" / "bench.md").read_text()
    assert md.startswith("separate prompts: B agents, each its own P-token prompt")
    assert "| kv | flags | prefix | agents |" in md
    assert "| q8_0/q8_0 | -ub 256 | 1000 | 4 | 900.00 | 90.00 | 0.900 | 0.900 | 1.000 |" in md
    assert (tmp_path / "out" / "q8_0-q8_0-p1000-ub_256.log").is_file()


def test_rounds_medians_and_ratio_range(tmp_path, monkeypatch):
    """--rounds 3: the pairs alternate their order, each row is the rounds' median, its ratio the median of the
    rounds' ratios (each against its own round's reference) with their range."""
    # the fake machine's speed per call: round 1 f16 q8, round 2 q8 f16 (reversed), round 3 f16 q8
    monkeypatch.setenv("FAKE_BB_DRIFT", "1.0,1.0,0.5,0.5,1.2,1.0")
    result, calls = _run(tmp_path, kv=["f16/f16", "q8_0/q8_0"], agents=[4], prefixes=[1000], rounds=3)
    assert [c.split()[c.split().index("-ctk") + 1] for c in calls] == ["f16", "q8_0", "q8_0", "f16", "f16", "q8_0"]
    f16, q8 = (_row(result, kv, 1000, 4) for kv in ("f16/f16", "q8_0/q8_0"))
    assert len(result.rows) == 2
    assert f16.decode_ts == pytest.approx(200.0)  # 200, 100, 240
    assert q8.decode_ts == pytest.approx(180.0)  # 180, 90, 180
    assert q8.decode_s == pytest.approx(4 * 16 / 180.0, abs=1e-5)
    assert (q8.ratio, q8.ratio_min, q8.ratio_max) == (pytest.approx(0.9), pytest.approx(0.75), pytest.approx(0.9))
    assert (f16.ratio, f16.ratio_min, f16.ratio_max) == (1.0, 1.0, 1.0)
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["spec"]["rounds"] == 3 and saved["rows"][1]["ratio_min"] == pytest.approx(0.75)
    assert agents.AgentsResult.from_dict(saved).as_dict() == saved
    md = (tmp_path / "out" / "bench.md").read_text().splitlines()
    assert "3 rounds, KV pairs in alternating order" in md[0]
    assert md[2] == "| kv | prefix | agents | prompt t/s | decode t/s | prompt ratio | ratio | ratio range | vs baseline |"
    assert "| q8_0/q8_0 | 1000 | 4 | 900.00 | 180.00 | 0.900 | 0.900 | 0.750-0.900 | 1.000 |" in md
    assert sorted(p.name for p in (tmp_path / "out").glob("q8_0*.log")) == [
        f"q8_0-q8_0-p1000-r{n}.log" for n in (1, 2, 3)]
    with pytest.raises(BadInput, match="--rounds: at least one round"):
        _spec(rounds=0)


def test_a_one_token_prefix(tmp_path):
    """P = 1 is also the drain's length: P's lines are the first of the two."""
    result, calls = _run(tmp_path, kv=["f16/f16"], prefixes=[1])
    assert "-npp 1,1 " in calls[0] and [r.agents for r in result.rows if r.kv == "f16/f16"] == [1, 4, 8]


def test_a_skipped_b_is_an_error(tmp_path):
    """The tool leaves out what its context cannot hold; a -c in the flag set that is too small must not
    pass as a shorter table."""
    with pytest.raises(VerificationFailed, match=r"P=400 -c 512: no result for B=8 .*log: .*f16-f16-p400-c_512\.log"):
        _run(tmp_path, agents=[1, 8], prefixes=[400], flag_sets=["-c 512"])


def test_failing_tool(tmp_path):
    with pytest.raises(VerificationFailed, match="llama-batched-bench q5_0/q5_0 P=1000 failed: .*Unsupported cache"):
        _run(tmp_path, kv=["q5_0/q5_0"], prefixes=[1000])


def test_run_agents_builds_llama_batched_bench(proj, monkeypatch):
    from polyforge import pipeline
    from polyforge.build import builder
    build_dir = fake_build(proj.root, "cpu-fake", {"llama-batched-bench": FAKE_BATCHED_BENCH})
    model = proj.root / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(pipeline.models_lib, "fetch_or_local", lambda name, **kw: type("F", (), {"path": model, "cached": True}))
    built = []

    def build_fn(chain, options):
        built.append(options.targets)
        return type("Built", (), {"manifest": builder.read_manifest(build_dir)})

    result = pipeline.run_agents(proj.chain(), _spec(kv=["f16/f16"], prefixes=[1000]), model="any", build_fn=build_fn)
    assert built == [("llama-batched-bench",)] and result.build == "cpu-fake" and len(result.rows) == 2 * 3
    assert "llama-batched-bench" in builder.DEFAULT_TARGETS
    assert result.files["json"].startswith(str(build_dir / "bench"))


@pytest.fixture
def cli_build(proj):
    """A project with a fake build cpu-fake and a cached random:tiny model (the fake never reads it)."""
    from polyforge.models import registry
    fake_build(proj.root, "cpu-fake", {"llama-batched-bench": FAKE_BATCHED_BENCH})
    (proj.chain().tree.path / "gguf-py").mkdir(parents=True)
    model = registry._random_path("random:tiny")
    model.parent.mkdir(parents=True)
    model.write_bytes(b"GGUF")
    return proj


def test_agents_cli(cli_build, tmp_path):
    common = ("bench", "--agents", "1,4", "--prefix", "1000", "--kv", "f16/f16,q8_0/q8_0", "-n", "16",
              "-m", "random:tiny", "--build", "cpu-fake")
    done = run_cli(*common, "--out", str(tmp_path / "a"), "--json", cwd=cli_build.root)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["scenario"] == "agents" and result["build"] == "cpu-fake" and result["spec"]["agents"] == [1, 4]
    row = next(r for r in result["rows"] if (r["kv"], r["agents"]) == ("q8_0/q8_0", 4))
    assert row["decode_ts"] == pytest.approx(180.0) and row["ratio"] == pytest.approx(0.9)
    assert result["files"]["png"] == str(tmp_path / "a" / "decode_vs_agents.png")
    done = run_cli(*common, "--separate", "--out", str(tmp_path / "b"), cwd=cli_build.root)
    assert done.returncode == 0, done.stderr
    assert "| q8_0/q8_0 | 1000 | 4 | 900.00 | 90.00 | 0.900 |" in done.stderr and "ok 4 rows" in done.stderr
    assert "-pps" not in (tmp_path / "b" / "q8_0-q8_0-p1000.log").read_text().splitlines()[0]


@pytest.mark.parametrize("args, fragment", [
    (("--agents", "0,4"), "--agents: a list of agent counts from 1 to 256"),
    (("--agents", "1,x"), "--agents 1,x: not a comma-separated list"),
    (("--agents", "4", "--prefix", "0"), "--prefix: a list of positive prompt lengths"),
    (("--agents", "4", "--prefix", "1k"), "--prefix 1k: not a comma-separated list"),
    (("--agents", "4", "--kv", "q8_0"), "not a K/V type pair"),
    (("--agents", "4", "--depth", "0"), "--depth is an option of the llama-bench matrix"),
    (("--agents", "4", "-r", "2"), "-r is an option of the llama-bench matrix"),
    (("--agents", "4", "-p", "512"), "-p is an option of the llama-bench matrix"),
    (("--separate",), "--prefix, --separate and --rounds go with --agents"),
    (("--rounds", "3"), "--prefix, --separate and --rounds go with --agents"),
])
def test_agents_cli_bad_input(proj, args, fragment):
    assert_clean_error(run_cli("bench", *args, cwd=proj.root), 2, fragment)


@pytest.mark.slow
def test_real_agents(real_build, tmp_path):
    """The real llama-batched-bench of the default build, shared and separate, on a random tiny model."""
    for mode in ((), ("--separate",)):
        out = tmp_path / (mode[0][2:] if mode else "shared")
        done = run_pf("bench", "--build", real_build.key, "-m", "random:tiny", "--agents", "1,4",
                      "--prefix", "256,512", "--kv", "f16/f16,q8_0/q8_0", "-n", "8", *mode, "--out", str(out), "--json",
                      cwd=ROOT, timeout=1800)
        assert done.returncode == 0, done.stderr[-2000:]
        rows = json.loads(done.stdout)["rows"]
        assert {(r["kv"], r["prefix"], r["agents"]) for r in rows} == {
            (kv, p, b) for kv in ("f16/f16", "q8_0/q8_0") for p in (256, 512) for b in (1, 4)}
        assert all(r["decode_ts"] > 0 and r["prompt_ts"] > 0 for r in rows)
        assert all(r["ratio"] == 1.0 for r in rows if r["kv"] == "f16/f16")
        assert (out / "decode_vs_agents.png").is_file()


@pytest.mark.slow
def test_real_agents_shared_prefix_masks(real_build, tmp_path):
    """Agents over a shared prefix with llama.cpp's KV cache debug on: 0077 builds their KQ mask rows from the cells
    they share and, under LLAMA_KV_CACHE_DEBUG, compares each mask with the general loop's, aborting on a difference
    (a deliberately wrong row makes llama-batched-bench exit 134). B up to 8 keeps the open cells
    (each agent's own tokens) under a quarter of the cache, so the shortcut runs for every B > 1."""
    done = run_pf("bench", "--build", real_build.key, "-m", "random:tiny", "--agents", "1,2,4,8", "--prefix", "512",
                  "--kv", "f16/f16,turbo3/turbo3", "-n", "8", "--out", str(tmp_path / "a"), "--json",
                  cwd=ROOT, timeout=1800, env={"LLAMA_KV_CACHE_DEBUG": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    # q8_0/q8_0, the default baseline, is measured in the same run
    assert {(r["kv"], r["agents"]) for r in rows} == {
        (kv, b) for kv in ("f16/f16", "q8_0/q8_0", "turbo3/turbo3") for b in (1, 2, 4, 8)}
    assert all(r["decode_ts"] > 0 for r in rows)


def test_bandwidth_fraction(tmp_path):
    """With a bandwidth: each row's bytes per decode step (the GGUF, and the cells at the step's mean fill, the
    shared prefix once) over the step's time, as a fraction of the bandwidth."""
    result, _ = _run(tmp_path, kv=["f16/f16", "q8_0/turbo3"], agents=[4], prefixes=[1000], bandwidth=2)
    weights = (tmp_path / "m.gguf").stat().st_size
    cell_f16 = 16 * 8 * 128 * 2 * 2  # LLAMA_META: 16 layers, 8 KV heads of 128, K and V
    f16 = _row(result, "f16/f16", 1000, 4)
    nbytes = weights + (1000 + 4 * 15 / 2) * cell_f16
    assert f16.bytes_per_step == round(nbytes)
    assert f16.bandwidth_fraction == pytest.approx(nbytes / (f16.decode_s / 16) / 2e9, abs=1e-4)
    turbo = _row(result, "q8_0/turbo3", 1000, 4)
    assert turbo.bytes_per_step < f16.bytes_per_step
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "bandwidth 2 GB/s (given)" in md and "| GB/step | of bandwidth |" in md
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["bandwidth"]["given"] is True and agents.AgentsResult.from_dict(saved).as_dict() == saved
