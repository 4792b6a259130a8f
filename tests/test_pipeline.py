"""polyforge up: fetch -> apply -> verify-patches -> build -> gates, stopping at the first
failure with its exit code; on the tiny CMake project with the real cmake and ninja."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from buildkit import CMAKE_FILES, TINY_TARGETS, run_pf, tiny_project
from conftest import assert_clean_error, capture
from polyforge.build import builder as build_lib
from polyforge import pipeline
from polyforge.errors import BadInput


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    proj = tiny_project(tmp_path, monkeypatch)
    capture(proj, "0001-answer", {"ggml/ggml.c": CMAKE_FILES["ggml/ggml.c"].replace("42", "43")})
    proj.chain().unapply()  # up applies it
    gates = proj.root / "gates"
    for name, argv, expr in (("answers", ["{bin:llama-cli}"], "exit_code == 0"),
                             ("wrong", ["{bin:llama-cli}"], "exit_code == 1"),
                             ("prints", ["python", "-c", "print('3 passed, 0 failed')"], "passed == 3 and failed == 0")):
        (gates / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "kind": "command", "build": {"targets": ["llama-cli"]},
            "params": {"argv": argv, "parse": "counts" if name == "prints" else "exit"}, "thresholds": [expr]}))
    return proj


def _options():
    return build_lib.BuildOptions.make(targets=TINY_TARGETS)


def test_up_runs_everything_in_order(tiny):
    seen = []
    result = pipeline.up(tiny.chain(), options=_options(), gates=["answers", "prints"], on_step=seen.append)
    assert result.ok and result.exit_code == 0
    assert [s.name for s in result.steps] == ["fetch", "apply", "verify-patches", "build", "gate answers", "gate prints"]
    assert [s.name for s in seen] == [s.name for s in result.steps]
    assert result.steps[1].detail["applied"] == ["0001-answer.patch"]
    key = result.steps[3].detail["key"]
    manifest = build_lib.read_manifest(tiny.root / "build" / key)
    assert [c["name"] for c in manifest.inputs["chain"]] == ["0001-answer.patch"]
    assert result.steps[4].detail["verdict"]["build"] == key
    # a second run: everything already there, the build reused
    again = pipeline.up(tiny.chain(), options=_options(), gates=["answers"])
    assert again.ok and again.steps[0].detail["already"] and not again.steps[3].detail["configured"]
    assert again.steps[3].detail["key"] == key


def test_up_stops_at_the_first_failing_gate(tiny):
    result = pipeline.up(tiny.chain(), options=_options(), gates=["wrong", "answers"])
    assert not result.ok and result.exit_code == 1
    assert [s.name for s in result.steps][-1] == "gate wrong"
    assert result.steps[-1].error == "threshold failed: exit_code == 1"


def test_up_says_why_a_gate_failed(tiny):
    (tiny.root / "gates" / "crashes.yaml").write_text(yaml.safe_dump({
        "name": "crashes", "kind": "command", "build": {"targets": ["llama-cli"]},
        "params": {"argv": ["python", "-c", "import sys; sys.exit('ImportError: numpy is missing')"], "parse": "json"},
        "thresholds": ["exit_code == 0 and ok"]}))
    result = pipeline.up(tiny.chain(), options=_options(), gates=["crashes"])
    assert not result.ok and result.exit_code == 1 and result.steps[-1].name == "gate crashes"
    assert "exited with status 1: ImportError: numpy is missing" in result.steps[-1].error
    assert result.steps[-1].detail["verdict"]["output_tail"] == ["ImportError: numpy is missing"]
    assert result.as_dict()["steps"][-1]["verdict"]["output_tail"] == ["ImportError: numpy is missing"]


def test_up_stops_at_a_build_failure(tiny):
    tiny.chain().apply()
    capture(tiny, "0002-break", {"src/llama.c": "int llama_answer(void) { return nope; }\n"})
    tiny.chain().unapply()
    result = pipeline.up(tiny.chain(), options=_options(), gates=["answers"])
    assert [s.name for s in result.steps] == ["fetch", "apply", "verify-patches", "build"]
    assert result.exit_code == 1 and "src/llama.c:1" in result.steps[-1].error


def test_up_stops_at_verify(tiny, monkeypatch):
    class Bad:
        ok = False
        problems = ["the chain on a fresh baseline does not reproduce the live tree"]
        patches = []
    monkeypatch.setattr(pipeline.verify_lib, "verify", lambda chain: Bad())
    result = pipeline.up(tiny.chain(), options=_options(), gates=["answers"])
    assert [s.name for s in result.steps][-1] == "verify-patches" and result.exit_code == 1
    assert "does not reproduce" in result.steps[-1].error


def test_unknown_gate_fails_before_any_work(tiny):
    with pytest.raises(BadInput, match="unknown gate 'nope'"):
        pipeline.up(tiny.chain(), options=_options(), gates=["nope"])
    assert not (tiny.root / "build").exists() and tiny.chain().tree.applied() == []


def test_up_cli(tiny):
    done = run_pf("up", "--gate", "answers", "--json", cwd=tiny.root, timeout=600)
    # the CLI builds the default llama.cpp targets, which the tiny project lacks: a clean exit 2
    assert done.returncode == 2
    result = json.loads(done.stdout)
    assert result["steps"][-1]["step"] == "build" and "unknown build target" in result["steps"][-1]["error"]
    assert_clean_error(run_pf("up", "--gate", "nope", cwd=tiny.root), 2, "unknown gate 'nope'")


def test_run_bench_on_an_existing_build(tiny, monkeypatch):
    """--build KEY: no build, the model fetched, the matrix under build/KEY/bench/, the key on the result."""
    from buildkit import FAKE_BENCH, fake_build
    from polyforge.bench import matrix as bench_lib
    build_dir = fake_build(tiny.root, "cpu-fake", {"llama-bench": FAKE_BENCH})
    model = tiny.root / "m.gguf"
    model.write_bytes(b"GGUF")
    fetched = type("Fetched", (), {"path": model, "cached": True})
    monkeypatch.setattr(pipeline.models_lib, "fetch_or_local", lambda name, **kw: fetched)
    spec = bench_lib.BenchSpec.make(["f16/f16,q8_0/q8_0"], None, [0], None, [0], 8, 1)
    result = pipeline.run_bench(tiny.chain(), spec, model="any", build_key="cpu-f",
                                build_fn=lambda chain, options: pytest.fail("--build builds nothing"))
    assert result.build == "cpu-fake" and len(result.rows) == 2
    assert Path(result.files["json"]).parent.parent == build_dir / "bench"
    assert result.as_dict()["build"] == "cpu-fake"
