"""Recorded verdicts: a gate that passed is not run again while nothing it depends on changed;
every input's change, a failure, --rerun and a broken record make it run."""

from __future__ import annotations

import json

import pytest
import yaml

from buildkit import fake_build, real_build, run_pf, write_script  # noqa: F401 (fixture)
from conftest import ROOT, run_cli
from polyforge import pipeline
from polyforge.gates import record
from polyforge.models import registry as models_lib

# a fake binary that counts its runs (in the file named by argv[1]) and reports a metric
COUNTING = """\
    import json, sys
    from pathlib import Path
    runs = Path(sys.argv[1])
    n = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(n))
    print(json.dumps({"value": 3}))
    """


@pytest.fixture
def counted(proj, monkeypatch):
    """A project whose gate 'g' runs the counting binary; returns (proj, build_dir, runs())."""
    model = proj.root / "m.gguf"
    model.write_bytes(b"GGUF")
    sha = {"value": "0" * 64}
    monkeypatch.setattr(models_lib, "fetch",
                        lambda name, **kw: models_lib.Fetched(name, model, sha["value"], True, 0.0))
    build_dir = fake_build(proj.root, "cpu-fake", {"counting": COUNTING})
    (build_dir / "bin" / "libllama.so.0.0.1").write_bytes(b"\x7fELF 1")
    (build_dir / "bin" / "libllama.so").symlink_to("libllama.so.0.0.1")
    write_gate(proj, ["value == 3"])
    runs_file = proj.root / "runs"

    def runs() -> int:
        return int(runs_file.read_text()) if runs_file.exists() else 0
    return proj, build_dir, runs, sha


def write_gate(proj, thresholds, env=None, models=("m",)):
    """Gate g: the counting binary, given the count file and (as {root}/notes.txt) a file it names."""
    data = {"name": "g", "kind": "command", "models": list(models), "timeout": 60,
            "params": {"argv": ["{bin:counting}", str(proj.root / "runs"), "{root}/notes.txt"], "parse": "json"},
            "thresholds": thresholds}
    if env:
        data["env"] = env
    (proj.root / "gates").mkdir(exist_ok=True)
    (proj.root / "gates" / "g.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def run(proj, **kw):
    return pipeline.run_gate(proj.chain(), "g", build_key="cpu-fake", **kw)


def test_a_passing_verdict_on_the_same_inputs_is_reused(counted):
    proj, build_dir, runs, _ = counted
    first = run(proj)
    assert first.ok and first.reused_from is None and runs() == 1
    second = run(proj)
    assert runs() == 1, "the gate ran again on unchanged inputs"
    assert second.ok and second.reused_from is not None
    assert second.metrics == first.metrics and second.thresholds == first.thresholds
    assert second.as_dict()["reused_from"] == second.reused_from
    saved = json.loads((build_dir / "gates" / "g" / record.RECORD).read_text())
    assert saved["verdict"]["ok"] is True and saved["inputs"]["build"] == "cpu-fake"
    # --rerun runs it whatever is recorded
    assert run(proj, rerun=True).reused_from is None and runs() == 2


@pytest.mark.parametrize("change", ["binary", "new library", "changed library", "threshold", "gate data", "model",
                                    "env", "gate env", "referenced"])
def test_any_changed_input_runs_the_gate_again(counted, monkeypatch, change):
    proj, build_dir, runs, sha = counted
    assert run(proj).ok and runs() == 1
    if change == "binary":
        write_script(build_dir / "bin" / "counting", COUNTING + "    # rebuilt\n")
    elif change == "new library":
        (build_dir / "bin" / "libggml-cpu.so").write_bytes(b"\x7fELF")
    elif change == "changed library":
        (build_dir / "bin" / "libllama.so.0.0.1").write_bytes(b"\x7fELF 2")
    elif change == "threshold":
        write_gate(proj, ["value >= 3"])
    elif change == "gate data":
        (proj.root / "gates" / "data").mkdir()
        (proj.root / "gates" / "data" / "prompt.txt").write_text("hello\n")
    elif change == "model":
        sha["value"] = "1" * 64
    elif change == "env":
        monkeypatch.setenv("GGML_SCHED_MAX_COPIES", "1")
    elif change == "gate env":
        write_gate(proj, ["value == 3"], env={"LLAMA_ARG_THREADS": "1"})
    elif change == "referenced":
        (proj.root / "notes.txt").write_text("changed\n")
    verdict = run(proj)
    assert verdict.ok and verdict.reused_from is None
    assert runs() == 2


def test_unrelated_environment_does_not_matter(counted, monkeypatch):
    proj, _, runs, _ = counted
    run(proj)
    monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "x")
    assert run(proj).reused_from is not None and runs() == 1


def test_a_binary_the_gate_did_not_run_does_not_matter(counted):
    """Another gate's target built into the same build later (up builds each gate's targets as it
    reaches it) leaves this gate's verdict standing."""
    proj, build_dir, runs, _ = counted
    run(proj)
    write_script(build_dir / "bin" / "test-turbo-kv", "print('other gate')\n")
    assert run(proj).reused_from is not None and runs() == 1
    saved = json.loads((build_dir / "gates" / "g" / record.RECORD).read_text())
    assert list(saved["binaries"]) == ["counting"]


def test_a_binary_that_is_gone_runs_the_gate(counted):
    proj, build_dir, runs, _ = counted
    run(proj)
    saved = build_dir / "gates" / "g" / record.RECORD
    data = json.loads(saved.read_text())
    data["binaries"]["llama-server"] = "0" * 64  # as if the gate had also run one that is not there now
    saved.write_text(json.dumps(data))
    assert run(proj).reused_from is None and runs() == 2


def test_a_failed_verdict_is_never_reused(counted):
    proj, build_dir, runs, _ = counted
    write_gate(proj, ["value == 4"])
    assert run(proj).ok is False and runs() == 1
    assert run(proj).ok is False and runs() == 2
    # and a failure replaces an earlier pass: back to passing thresholds, it runs (and then stands)
    write_gate(proj, ["value == 3"])
    (build_dir / "gates" / "g" / record.RECORD).unlink()
    run(proj)
    saved = build_dir / "gates" / "g" / record.RECORD
    data = json.loads(saved.read_text())
    data["verdict"]["ok"] = False
    saved.write_text(json.dumps(data))
    assert run(proj).reused_from is None


@pytest.mark.parametrize("damage", ["not json", "no verdict", "empty", "verdict not a mapping", "binaries not a mapping"])
def test_a_broken_record_runs_the_gate(counted, damage):
    proj, build_dir, runs, _ = counted
    run(proj)
    saved = build_dir / "gates" / "g" / record.RECORD
    data = json.loads(saved.read_text())
    text = {"not json": "{", "no verdict": json.dumps({**data, "verdict": None}), "empty": "",
            "verdict not a mapping": json.dumps({**data, "verdict": [1]}),
            "binaries not a mapping": json.dumps({**data, "binaries": ["counting"]})}[damage]
    saved.write_text(text)
    verdict = run(proj)
    assert verdict.ok and verdict.reused_from is None


def test_the_cli_says_a_verdict_was_reused_and_reruns_on_request(counted):
    proj, _, runs, _ = counted
    write_gate(proj, ["value == 3"], models=())  # the CLI runs in a process of its own: no fake model there
    assert run_cli("gate", "run", "g", "--build", "cpu-fake", cwd=proj.root).returncode == 0
    done = run_cli("gate", "run", "g", "--build", "cpu-fake", "--json", cwd=proj.root)
    assert done.returncode == 0 and "reused_from" in json.loads(done.stdout) and runs() == 1
    assert "that verdict stands" in done.stderr
    done = run_cli("gate", "run", "g", "--build", "cpu-fake", "--rerun", "--json", cwd=proj.root)
    assert done.returncode == 0 and "reused_from" not in json.loads(done.stdout) and runs() == 2


@pytest.mark.slow
def test_real_gate_verdict_stands_until_rerun(real_build):
    """On the real CPU build: the binaries, gates and models hash the same from one run to the next."""
    first = run_pf("gate", "run", "turbo-tests", "--rerun", "--json", cwd=ROOT, timeout=1800)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "reused_from" not in json.loads(first.stdout)
    second = run_pf("gate", "run", "turbo-tests", "--json", cwd=ROOT, timeout=1800)
    verdict = json.loads(second.stdout)
    assert second.returncode == 0 and verdict["ok"] is True
    assert verdict["reused_from"] and verdict["metrics"] == json.loads(first.stdout)["metrics"]
