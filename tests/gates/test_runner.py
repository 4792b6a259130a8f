"""Gates: the schema, threshold expressions, each kind against fake llama binaries, the CLI,
and (slow) the real gates on the real CPU build."""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from buildkit import fake_build, real_build, run_pf, write_script  # noqa: F401 (fixture)
from conftest import ROOT, assert_clean_error, run_cli
from polyforge.models import registry as models_lib
from polyforge import pipeline, proc, schema
from polyforge.errors import BadInput, TimedOut, VerificationFailed
from polyforge.gates import GATE_MODULES, VENDORED_MODULES, backend_ops, command, kinds, perplexity_kld, runner, server
from polyforge.gates._common import TAIL_LINES, TAIL_WIDTH

# -- schema ----------------------------------------------------------------------------------
GOOD = {"name": "g", "kind": "command", "params": {"argv": ["true"]}, "thresholds": ["exit_code == 0"]}


def _write_gate(folder: Path, data: dict, name: str = "g") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("change, fragment", [
    ({"name": "other"}, "must be the file's stem"),
    ({"kind": "weird"}, "'kind' must be one of"),
    ({"thresholds": []}, "non-empty list"),
    ({"thresholds": ["exit_code =="]}, "syntax error"),
    ({"thresholds": ["__import__('os')"]}, "may be called"),
    ({"thresholds": ["exit_code.real == 0"]}, "Attribute"),
    ({"extra": 1}, "unknown key"),
    ({"build": {"requires": "tpu"}}, "build.requires"),
    ({"params": {"argv": []}}, "non-empty"),
    ({"params": {"argv": ["x"], "parse": "xml"}}, "params.parse"),
    ({"params": {"argv": ["{model:m}"]}}, "must be listed under 'models'"),
    ({"timeout": -1}, "timeout"),
    ({"env": ["A=1"]}, "'env' must map"),
    ({"env": {"1A": "x"}}, "'env': '1A' is not a valid name"),
    ({"env": {"A": True}}, "'env' must map"),
])
def test_schema_rejects(tmp_path, change, fragment):
    path = _write_gate(tmp_path, {**GOOD, **change})
    with pytest.raises(BadInput, match=fragment):
        runner.load(path)


@pytest.mark.parametrize("kind, params, fragment", [
    ("perplexity-kld", {"model": "m", "text": "t", "configs": ["q8_0"]}, "not a K/V type pair"),
    ("perplexity-kld", {"model": "other", "text": "t", "configs": ["q8_0/q8_0"]}, "must be listed"),
    ("perplexity-kld", {"model": "m", "text": "t", "configs": ["q8_0/q8_0", "q8_0/q8_0"]}, "repeat"),
    ("backend-ops", {"backend": "CPU"}, "missing 'params.op'"),
    ("backend-ops", {"op": "ADD", "mode": "perf"}, "'params.mode' must be one of test, grad"),
    ("server", {"model": "m", "requests": [{"name": "a", "path": "health"}]}, "must start with /"),
    ("server", {"model": "m", "requests": [{"name": "a", "path": "/x", "extract": {"v": "a..b"}}]}, "dotted JSON path"),
    ("server", {"model": "m", "requests": [{"path": "/x"}]}, "missing 'params.requests\\[0\\].name'"),
    ("server", {"model": "m", "requests": []}, "non-empty list"),
])
def test_kind_params_are_validated(tmp_path, kind, params, fragment):
    path = _write_gate(tmp_path, {"name": "g", "kind": kind, "models": ["m"], "params": params,
                                  "thresholds": ["true"]})
    with pytest.raises(BadInput, match=fragment):
        runner.load(path)


def test_the_repository_gates_load():
    gates = runner.load_all(ROOT / "gates")
    names = {g.name for g in gates}
    assert {"backend-ops-cpu", "turbo-kld", "server-gemma3"} <= names
    kinds = {g.kind for g in gates}
    assert {"backend-ops", "perplexity-kld", "server"} <= kinds
    kld = next(g for g in gates if g.name == "turbo-kld")
    assert kld.params["ctx"] == 1024 and {"q8_0/q8_0", "q4_0/q4_0", "turbo3/turbo3"} <= set(kld.params["configs"])
    text = ROOT / "gates" / kld.params["text"]
    assert text.is_file() and len(text.read_bytes()) <= 200_000


def test_unknown_gate(tmp_path):
    _write_gate(tmp_path, GOOD)
    with pytest.raises(BadInput, match="unknown gate 'nope' \\(gates: g\\)"):
        runner.find(tmp_path, "nope")
    with pytest.raises(BadInput, match="unknown gate"):
        runner.find(tmp_path, "../etc/passwd")


# -- thresholds ------------------------------------------------------------------------------
METRICS = {
    "q8_0/q4_0": {"kld_mean": 0.020, "bits_per_pair": 13.0},
    "q8_0/turbo4": {"kld_mean": 0.024, "bits_per_pair": 12.75},
    "q4_0/q4_0": {"kld_mean": 0.050, "bits_per_pair": 9.0},
    "q8_0/turbo3": {"kld_mean": 0.060, "bits_per_pair": 11.75},
    "passed": 10, "failed": 0, "content": "Paris",
}


@pytest.mark.parametrize("expr, ok", [
    ("[q8_0/turbo4].kld_mean <= 1.3 * [q8_0/q4_0].kld_mean", True),
    ("[q8_0/turbo4].kld_mean <= 1.1 * [q8_0/q4_0].kld_mean", False),
    ("failed == 0 and passed >= 1", True),
    ("failed > 0 or passed < 1", False),
    ("0 < [q8_0/q4_0].kld_mean < [q4_0/q4_0].kld_mean", True),
    ("max([q8_0/q4_0].kld_mean, [q4_0/q4_0].kld_mean) == 0.05", True),
    ("len(content) > 0", True),
    # q4_0/q4_0 (0.05, 9.0) dominates q8_0/turbo3 (0.06, 11.75): worse in both
    ("not dominates('q*/q*', '*/turbo*', 'kld_mean', 'bits_per_pair')", False),
    ("not dominates('q*/q*', '*/turbo4', 'kld_mean', 'bits_per_pair')", True),
    ("dominates('q4_0/q4_0', 'q8_0/turbo3', 'kld_mean', 'bits_per_pair')", True),
    ("dominates('q8_0/q4_0', 'q4_0/q4_0', 'kld_mean', 'bits_per_pair')", False),
])
def test_threshold_expressions(expr, ok):
    result = runner.evaluate(expr, METRICS)
    assert result["ok"] is ok, result
    assert "error" not in result


def test_threshold_missing_metric_fails_with_reason():
    result = runner.evaluate("[q8_0/turbo2].kld_mean < 1", METRICS)
    assert result == {"ok": False, "error": "no metric [q8_0/turbo2].kld_mean", "values": {}}
    assert runner.evaluate("nothing == 0", METRICS)["error"] == "no metric nothing"
    assert "no configuration matches" in runner.evaluate("dominates('x*', '*', 'kld_mean')", METRICS)["error"]
    assert runner.evaluate("passed / failed > 1", METRICS)["error"].startswith("ZeroDivisionError")


def test_judge_records_values():
    verdict = runner.judge("g", METRICS, ["failed == 0", "passed > 100"])
    assert verdict.ok is False and verdict.gate == "g" and verdict.metrics is METRICS
    assert verdict.thresholds["failed == 0"] == {"ok": True, "values": {"failed": 0}}
    assert verdict.thresholds["passed > 100"]["ok"] is False
    assert verdict.exit_code == 1 and verdict.error is None


def test_verdict_json_shape():
    """as_dict() is the --json shape: optional keys only when they say something."""
    judged = runner.judge("g", {"passed": 1}, ["passed == 1"])
    assert judged.exit_code == 0
    assert judged.as_dict() == {"gate": "g", "ok": True, "metrics": {"passed": 1},
                                "thresholds": {"passed == 1": {"ok": True, "values": {"passed": 1}}}, "seconds": 0.0}
    stopped = runner.Verdict("g", False, {}, {}, error="llama-server exited", error_exit_code=3,
                             output_tail=("last line",), seconds=1.5, build="cpu-x", live_tree=None)
    assert stopped.exit_code == 3
    assert list(stopped.as_dict()) == ["gate", "ok", "metrics", "thresholds", "error", "exit_code", "output_tail",
                                       "seconds", "build", "live_tree"]
    assert stopped.as_dict()["output_tail"] == ["last line"] and stopped.as_dict()["live_tree"] is None


# -- output parsers on llama.cpp's real output formats --------------------------------------------
KLD_OUTPUT = """\
llama_kv_cache: size =   12.00 MiB (  2048 cells,   3 layers,  1/1 seqs), K (q8_0):    6.00 MiB, V (q8_0):    6.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 1024 cells
llama_kv_cache: size =   19.12 MiB (  1024 cells,  15 layers,  1/1 seqs), K (q8_0):    9.56 MiB, V (q8_0):    9.56 MiB
====== Perplexity statistics ======
Mean PPL(Q)                   :  21.517893 ±   0.582011
Mean PPL(base)                :  21.490032 ±   0.580950
====== KL divergence statistics ======
Mean    KLD:   0.001234 ±   0.000021
Maximum KLD:   0.201010
99.9%   KLD:   0.052311
99.0%   KLD:   0.011987
Median  KLD:   0.000511
====== Token probability statistics ======
Same top p: 98.432 ± 0.123 %
"""


def test_perplexity_parsers():
    row = perplexity_kld.parse_kld(KLD_OUTPUT)
    assert row == {"kld_mean": 0.001234, "kld_p99": 0.011987, "kld_max": 0.20101, "top1": 98.432, "ppl": 21.517893}
    assert perplexity_kld.kv_mib(KLD_OUTPUT) == 31.12
    assert perplexity_kld.kv_mib("nothing") is None
    assert perplexity_kld.bits_per_pair("q8_0/q4_0") == 13.0
    assert perplexity_kld.bits_per_pair("q8_0/turbo3") == 11.75  # kvtypes: the one table
    assert perplexity_kld.bits_per_pair("q8_0/q3_k") is None


BACKEND_OPS_OUTPUT = """\
Testing 1 devices

Backend 1/1: CPU
  Device description: AMD EPYC
  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=4,type_KV=q8_0): \x1b[1;32mOK\x1b[0m
  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=4,type_KV=q4_0): \x1b[1;32mOK\x1b[0m
  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=4,type_KV=q5_0): not supported [CPU] 
  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=4,type_KV=q4_1): [FLASH_ATTN_EXT] NMSE = 0.1 > 0.0005 \x1b[1;31mFAIL\x1b[0m
  3/4 tests passed
  Backend CPU: \x1b[1;31mFAIL\x1b[0m

Failing tests:
  FLASH_ATTN_EXT(hsk=128,hsv=128,nh=4,type_KV=q4_1)
0/1 backends passed
"""


def test_backend_ops_parser():
    assert backend_ops.parse(BACKEND_OPS_OUTPUT) == {"passed": 2, "failed": 1, "skipped": 1, "total": 4,
                                                     "reported_total": 4}


def test_command_parsers():
    out = "log line\n{\"not\": json\n{\"ok\": false, \"metrics\": {\"hit_rate\": 0.5}}\ntrailer\n"
    assert command.parse_output(out, "json") == {"hit_rate": 0.5, "ok": False}
    assert command.parse_output("x\n12 passed, 0 failed\n13 passed, 2 failed\n", "counts") == {"passed": 13, "failed": 2}
    assert command.parse_output("nothing", "counts") == {}
    assert server.json_path({"choices": [{"message": {"content": "hi"}}]}, "choices.0.message.content") == "hi"
    with pytest.raises(KeyError):
        server.json_path({"choices": []}, "choices.0.message")


# -- kinds against fake binaries ---------------------------------------------------------------
FAKE_PERPLEXITY = """\
import sys, os
args = sys.argv[1:]
def arg(flag, default=None):
    return args[args.index(flag) + 1] if flag in args else default
with open(os.path.join(os.path.dirname(sys.argv[0]), "calls.log"), "a") as f:
    f.write(" ".join(args) + "\\n")
size = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5}[arg("-ctk")] * 2
if arg("-lv") == "4":  # llama's info lines only show at verbosity 4
    print(f"llama_kv_cache: size = {size:7.2f} MiB (  2048 cells,  18 layers,  1/1 seqs), K (x): 1 MiB, V (x): 1 MiB", file=sys.stderr)
if "--kl-divergence" not in args:
    open(arg("--kl-divergence-base"), "w").write("logits")
    print("Final estimate: PPL = 20.1234 +/- 0.50000")
else:
    assert os.path.exists(arg("--kl-divergence-base"))
    kld = {"q8_0": 0.0012, "q4_0": 0.0300}[arg("-ctk")]
    print(f"Mean PPL(Q)                   :  {20 + kld:.6f} ±   0.5")
    print(f"Mean    KLD: {kld:10.6f} ±   0.000021")
    print(f"Maximum KLD: {kld * 50:10.6f}")
    print(f"99.0%   KLD: {kld * 8:10.6f}")
    print(f"Same top p: {100 - kld * 100:6.3f} ± 0.1 %")
"""

FAKE_BACKEND_OPS = f"""\
import sys
print({BACKEND_OPS_OUTPUT.replace("q4_1): [FLASH_ATTN_EXT] NMSE = 0.1 > 0.0005 " + chr(27) + "[1;31mFAIL", "q4_1): " + chr(27) + "[1;32mOK")!r})
print(" ".join(sys.argv[1:]), file=sys.stderr)
"""

FAKE_SERVER = """\
import http.server, json, os, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
open(os.path.join(os.path.dirname(sys.argv[0]), "server.pid"), "w").write(str(os.getpid()))
mode = args[args.index("--fake-mode") + 1] if "--fake-mode" in args else "ok"
if mode == "crash":
    print("error: failed to load model", file=sys.stderr)
    sys.exit(1)
started = time.time()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/health":
            ready = mode != "never" and time.time() - started > 0.3
            self.send(200 if ready else 503, {"status": "ok" if ready else "loading"})
        elif self.path == "/props":
            self.send(200, {"default_generation_settings": {"n_ctx": 2048}})
        else:
            self.send(404, {"error": "not found"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/completion":
            self.send(200, {"content": " Paris", "tokens_predicted": req["n_predict"], "stop": True})
        else:
            self.send(404, {"error": "not found"})
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def gate_env(proj, monkeypatch):
    """A project with a fake finished build and a fake model 'm'."""
    model = proj.root / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(models_lib, "fetch", lambda name, **kw: models_lib.Fetched(name, model, "0" * 64, True, 0.0))
    build_dir = fake_build(proj.root, "cpu-fake", {"llama-perplexity": FAKE_PERPLEXITY,
                                                   "test-backend-ops": FAKE_BACKEND_OPS,
                                                   "llama-server": FAKE_SERVER})
    (proj.root / "gates" / "data").mkdir(parents=True)
    (proj.root / "gates" / "data" / "text.txt").write_text("some text\n")
    return proj, build_dir


def _gate(proj, name, kind, params, thresholds, models=("m",), build=None, env=None):
    data = {"name": name, "kind": kind, "models": list(models), "params": params, "thresholds": thresholds,
            "timeout": 60}
    if build:
        data["build"] = build
    if env:
        data["env"] = env
    _write_gate(proj.root / "gates", data, name)


def test_perplexity_kld_gate(gate_env):
    proj, build_dir = gate_env
    _gate(proj, "kld", "perplexity-kld",
          {"model": "m", "text": "data/text.txt", "ctx": 512, "chunks": 2, "configs": ["q8_0/q8_0", "q4_0/q4_0"],
           "flags": ["-t", 2]},
          ["[q8_0/q8_0].kld_mean <= 0.01", "[q4_0/q4_0].kld_mean <= 0.01", "[q4_0/q4_0].kv_mib < [base].kv_mib"],
          build={"targets": ["llama-perplexity"]})
    verdict = pipeline.run_gate(proj.chain(), "kld", build_key="cpu-fake")
    m = verdict.metrics
    assert m["q8_0/q8_0"]["kld_mean"] == 0.0012 and m["q4_0/q4_0"]["kld_mean"] == 0.03
    assert m["q8_0/q8_0"]["top1"] == 99.88 and m["q8_0/q8_0"]["bits_per_pair"] == 17.0
    assert m["base"] == {"ppl": 20.1234, "kv_mib": 32.0, "bits_per_pair": 32.0}
    assert m["q4_0/q4_0"]["kv_mib"] == 9.0
    assert verdict.ok is False  # q4_0's 0.03 is over the 0.01 threshold
    assert [e for e, r in verdict.thresholds.items() if not r["ok"]] == ["[q4_0/q4_0].kld_mean <= 0.01"]
    calls = (build_dir / "bin" / "calls.log").read_text().splitlines()
    assert len(calls) == 3
    assert "-ctk f16 -ctv f16" in calls[0] and "--chunks 2" in calls[0] and "-t 2" in calls[0]
    assert "--kl-divergence" in calls[1].split() and "-ctk q8_0 -ctv q8_0" in calls[1]
    assert not (build_dir / "gates" / "kld" / "base.kld").exists()  # large logits are removed


def test_verdict_renders_configuration_names_literally(gate_env):
    """`[q4_0/q4_0].kld_mean` in a threshold is data, not rich markup: the terminal shows it whole."""
    proj, _ = gate_env
    script = write_script(proj.root / "scripts" / "gate_kld.py", """\
        import json
        print(json.dumps({"q4_0/q4_0": {"kld_mean": 0.03}, "note": "[bold]not markup[/]"}))
        """)
    _gate(proj, "kld", "command", {"argv": ["python", str(script)], "parse": "json"},
          ["[q4_0/q4_0].kld_mean <= 0.01"], models=())
    done = run_cli("gate", "run", "kld", "--build", "cpu-fake", cwd=proj.root)
    assert done.returncode == 1, done.stderr
    assert "FAIL [q4_0/q4_0].kld_mean <= 0.01" in done.stderr
    assert "q4_0/q4_0: kld_mean=0.03" in done.stderr and "note: [bold]not markup[/]" in done.stderr


def test_backend_ops_gate(gate_env):
    proj, build_dir = gate_env
    _gate(proj, "ops", "backend-ops", {"op": "FLASH_ATTN_EXT", "pattern": "type_KV=q", "backend": "CPU"},
          ["failed == 0", "passed >= 1"], models=())
    verdict = pipeline.run_gate(proj.chain(), "ops", build_key="cpu-fake")
    assert verdict.ok is True
    assert verdict.metrics["passed"] == 3 and verdict.metrics["skipped"] == 1
    log = (build_dir / "gates" / "ops" / "test-backend-ops.log").read_text()
    assert "test -o FLASH_ATTN_EXT -b CPU -p type_KV=q" in log


def _pid_gone(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
            stat = Path(f"/proc/{pid}/stat").read_text().split()[2]
            if stat == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


SERVER_PARAMS = {"model": "m", "health_timeout": 10, "requests": [
    {"name": "props", "path": "/props", "extract": {"n_ctx": "default_generation_settings.n_ctx"}},
    {"name": "completion", "method": "POST", "path": "/completion", "body": {"prompt": "x", "n_predict": 8},
     "extract": {"content": "content", "predicted": "tokens_predicted", "missing": "no.such.field"}},
]}


def test_server_gate_passes_and_stops_the_server(gate_env):
    proj, build_dir = gate_env
    _gate(proj, "srv", "server", SERVER_PARAMS,
          ["[props].n_ctx == 2048", "[completion].status == 200 and [completion].predicted == 8",
           "len([completion].content) > 0"])
    verdict = pipeline.run_gate(proj.chain(), "srv", build_key="cpu-fake")
    assert verdict.ok is True, verdict
    assert verdict.metrics["completion"]["content"] == " Paris"
    assert "missing" not in verdict.metrics["completion"]
    assert _pid_gone(build_dir / "bin" / "server.pid")


@pytest.mark.parametrize("mode, fragment", [("never", "did not become healthy within 2 s"),
                                            ("crash", "exited with status 1 before it became healthy")])
def test_server_gate_unhealthy_fails_cleanly(gate_env, mode, fragment):
    proj, build_dir = gate_env
    _gate(proj, "srv", "server", {**SERVER_PARAMS, "health_timeout": 2, "flags": ["--fake-mode", mode]},
          ["[props].status == 200"])
    verdict = pipeline.run_gate(proj.chain(), "srv", build_key="cpu-fake")
    assert verdict.ok is False and fragment in verdict.error and verdict.as_dict()["exit_code"] == 1
    assert "llama-server.log" in verdict.error
    assert _pid_gone(build_dir / "bin" / "server.pid")


def test_command_gate_with_placeholders(gate_env):
    proj, build_dir = gate_env
    script = write_script(proj.root / "scripts" / "gate_probe.py", """\
        import json, sys
        print("checking", sys.argv[1:])
        print(json.dumps({"ok": True, "metrics": {"args": len(sys.argv) - 1, "model": sys.argv[2]}}))
        """)
    _gate(proj, "cmd", "command",
          {"argv": ["python", str(script), "--server", "{bin:llama-server}", "--model", "{model:m}", "{work}"],
           "parse": "json"},
          ["ok", "args == 5", "exit_code == 0"])
    verdict = pipeline.run_gate(proj.chain(), "cmd", build_key="cpu-fake")
    assert verdict.ok is True, verdict
    assert verdict.metrics["model"] == str(build_dir / "bin" / "llama-server")
    _gate(proj, "cmd2", "command", {"argv": ["{bin:no-such-binary}"]}, ["exit_code == 0"], models=())
    with pytest.raises(BadInput, match="has no no-such-binary"):
        pipeline.run_gate(proj.chain(), "cmd2", build_key="cpu-fake")


def test_gate_env_reaches_its_commands(gate_env, monkeypatch):
    proj, _ = gate_env
    monkeypatch.setenv("POLYFORGE_TEST_KEPT", "kept")
    script = write_script(proj.root / "scripts" / "gate_env.py", """\
        import json, os
        print(json.dumps({"mode": os.environ.get("POLYFORGE_TEST_MODE"), "kept": os.environ.get("POLYFORGE_TEST_KEPT")}))
        """)
    _gate(proj, "envd", "command", {"argv": ["python", str(script)], "parse": "json"},
          ["mode == '1' and kept == 'kept'"], models=(), env={"POLYFORGE_TEST_MODE": 1})
    assert runner.find(proj.root / "gates", "envd").env == (("POLYFORGE_TEST_MODE", "1"),)
    verdict = pipeline.run_gate(proj.chain(), "envd", build_key="cpu-fake")
    assert verdict.ok is True, verdict
    _gate(proj, "plain", "command", {"argv": ["python", str(script)], "parse": "json"}, ["mode == '1'"], models=())
    verdict = pipeline.run_gate(proj.chain(), "plain", build_key="cpu-fake")
    assert verdict.ok is False and verdict.metrics["mode"] is None


def test_gate_requires_matching_build(gate_env):
    proj, _ = gate_env
    _gate(proj, "gpu", "command", {"argv": ["true"]}, ["exit_code == 0"], models=(), build={"requires": "cuda"})
    with pytest.raises(BadInput, match="needs a cuda build"):
        pipeline.run_gate(proj.chain(), "gpu", build_key="cpu-fake")


def test_gate_cli_json_and_exit_codes(gate_env):
    proj, _ = gate_env
    _gate(proj, "pass", "command", {"argv": ["true"]}, ["exit_code == 0"], models=())
    _gate(proj, "fail", "command", {"argv": ["false"]}, ["exit_code == 0"], models=())
    done = run_cli("gate", "run", "pass", "--build", "cpu-fake", "--json", cwd=proj.root)
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)
    assert {"gate", "ok", "metrics", "thresholds"} <= set(verdict) and verdict["ok"] is True
    done = run_cli("gate", "run", "fail", "--build", "cpu-fake", "--json", cwd=proj.root)
    assert done.returncode == 1 and json.loads(done.stdout)["ok"] is False
    assert_clean_error(run_cli("gate", "run", "nope", cwd=proj.root), 2, "unknown gate 'nope'")
    assert_clean_error(run_cli("gate", "run", "pass", "--build", "zzz", cwd=proj.root), 2, "no such build")
    listed = json.loads(run_cli("gate", "list", "--json", cwd=proj.root).stdout)
    assert {g["name"] for g in listed} == {"pass", "fail"}


# -- the kind registry ------------------------------------------------------------------------
def test_every_registered_kind_follows_the_protocol():
    for name, kind in kinds.KINDS.items():
        assert callable(kind.validate_params) and callable(kind.run), name
        doc = kind.__doc__ or ""
        assert "params:" in doc and "metrics:" in doc, f"kind {name}: its docstring documents params and metrics"


def test_unknown_kind_is_one_line_listing_the_registered_kinds(gate_env):
    proj, _ = gate_env
    _gate(proj, "odd", "weird", {}, ["true"], models=())
    listed = ", ".join(kinds.KINDS)
    assert listed == "backend-ops, command, perplexity-kld, server"
    assert_clean_error(run_cli("gate", "run", "odd", "--build", "cpu-fake", cwd=proj.root), 2,
                       f"'kind' must be one of {listed} (got 'weird')")


class EchoKind:
    """A test-only kind: metrics echo params.value; params.fail raises as a broken binary would."""

    def validate_params(self, params: dict, where: str, models: tuple[str, ...]) -> dict:
        schema.only(params, {"value", "fail"}, where, section="params")
        return {"value": schema.need(params, "value", int, where, section="params"),
                "fail": schema.optional(params, "fail", bool, where, False, section="params")}

    def run(self, ctx) -> dict:
        if ctx.gate.params["fail"]:
            raise VerificationFailed("echo: the binary crashed")
        return {"value": ctx.gate.params["value"], "in_work_dir": ctx.work_dir.is_dir()}


def test_a_registered_kind_runs_through_run_gate(gate_env, monkeypatch):
    proj, _ = gate_env
    monkeypatch.setitem(kinds.KINDS, "echo", EchoKind())
    _gate(proj, "echo", "echo", {"value": 7}, ["value == 7 and in_work_dir"], models=())
    verdict = pipeline.run_gate(proj.chain(), "echo", build_key="cpu-fake")
    assert verdict.ok is True and verdict.exit_code == 0 and verdict.build == "cpu-fake", verdict
    assert verdict.metrics == {"value": 7, "in_work_dir": True}
    _gate(proj, "echo", "echo", {"value": 7, "fail": True}, ["value == 7"], models=())
    verdict = pipeline.run_gate(proj.chain(), "echo", build_key="cpu-fake")
    assert verdict.ok is False and verdict.error == "echo: the binary crashed" and verdict.exit_code == 1
    _gate(proj, "echo", "echo", {"value": "seven"}, ["value == 7"], models=())
    with pytest.raises(BadInput, match="'params.value' must be an integer"):
        pipeline.run_gate(proj.chain(), "echo", build_key="cpu-fake")


def test_a_command_that_hangs_fails_the_gate(gate_env):
    proj, build_dir = gate_env
    _write_gate(proj.root / "gates", {"name": "hang", "kind": "command", "timeout": 0.5, "thresholds": ["exit_code == 0"],
                                      "params": {"argv": ["python", "-c", "import time; time.sleep(30)"]}}, "hang")
    verdict = pipeline.run_gate(proj.chain(), "hang", build_key="cpu-fake")
    assert verdict.ok is False and verdict.exit_code == 1  # the gate's failure, not the machine's (3)
    assert "did not finish within" in verdict.error and "command.log" in verdict.error


def test_proc_run_timeout_is_timed_out():
    with pytest.raises(TimedOut, match="did not finish within"):
        proc.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3)


CRASHING_PROGRAM = """\
    import sys
    for i in range(40):
        print(f"progress line {i}", file=sys.stderr)
    print("x" * 5000, file=sys.stderr)
    print("ModuleNotFoundError: No module named 'numpy'", file=sys.stderr)
    sys.exit(1)
    """


def test_a_failed_command_shows_the_end_of_its_output(gate_env):
    proj, _ = gate_env
    script = write_script(proj.root / "scripts" / "gate_crash.py", CRASHING_PROGRAM)
    _gate(proj, "crash", "command", {"argv": ["python", str(script)], "parse": "json"}, ["exit_code == 0 and ok"],
          models=())
    verdict = pipeline.run_gate(proj.chain(), "crash", build_key="cpu-fake")
    assert verdict.ok is False
    tail = list(verdict.output_tail)
    assert tail[-1] == "ModuleNotFoundError: No module named 'numpy'"
    assert len(tail) == TAIL_LINES and "progress line 39" in tail and "progress line 0" not in tail
    assert max(len(line) for line in tail) <= TAIL_WIDTH  # a huge line is cut, not dropped
    assert "gate_crash.py exited with status 1" in verdict.error and "No module named 'numpy'" in verdict.error
    # the terminal shows it, and so does --json
    done = run_cli("gate", "run", "crash", "--build", "cpu-fake", cwd=proj.root)
    assert done.returncode == 1
    assert "progress line 39" in done.stderr and "No module named 'numpy'" in done.stderr
    done = run_cli("gate", "run", "crash", "--build", "cpu-fake", "--json", cwd=proj.root)
    assert json.loads(done.stdout)["output_tail"] == tail
    # a passing gate carries no tail
    _gate(proj, "fine", "command", {"argv": ["true"]}, ["exit_code == 0"], models=())
    assert "output_tail" not in pipeline.run_gate(proj.chain(), "fine", build_key="cpu-fake").as_dict()


def test_a_failed_binary_shows_the_end_of_its_output(gate_env):
    proj, build_dir = gate_env
    write_script(build_dir / "bin" / "test-backend-ops", """\
        import sys
        print("ggml_backend_load: cannot open libggml-cpu.so", file=sys.stderr)
        sys.exit(3)
        """)
    _gate(proj, "ops", "backend-ops", {"op": "FLASH_ATTN_EXT"}, ["failed == 0"], models=())
    verdict = pipeline.run_gate(proj.chain(), "ops", build_key="cpu-fake")
    assert verdict.ok is False and verdict.output_tail == ("ggml_backend_load: cannot open libggml-cpu.so",)


# -- what the gate programs import is what `pip install .` installs -----------------------------
def _base_dependencies() -> set[str]:
    """Distribution names in pyproject.toml's [project] dependencies (no extras)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower() for req in project["dependencies"]}


def _gate_programs() -> list[Path]:
    """The Python programs the repository's command gates run ({root}/gates/GATE/NAME.py)."""
    programs = set()
    for gate in runner.load_all(ROOT / "gates"):
        if gate.kind == "command":
            programs.update(ROOT / arg.removeprefix("{root}/") for arg in gate.params["argv"]
                            if arg.startswith("{root}/") and arg.endswith(".py"))
    return sorted(programs)


def _top_level_imports(path: Path, module_level_only: bool = False) -> set[str]:
    """Top-level names of the absolute imports in a file (module_level_only: those its
    import runs unconditionally, not inside functions, try or if blocks)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _program_imports(program: Path) -> set[str]:
    """What a gate program imports, following its imports of sibling scripts."""
    seen, modules, todo = set(), set(), [program]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _top_level_imports(path):
            sibling = path.parent / f"{name}.py"
            if sibling.is_file():
                todo.append(sibling)
            else:
                modules.add(name)
    return modules


def _not_covered(modules: set[str]) -> set[str]:
    # polyforge: the programs share its llama-server harness; its own imports are base dependencies
    return modules - set(sys.stdlib_module_names) - set(VENDORED_MODULES) - set(GATE_MODULES) - {"polyforge"}


def test_gate_programs_need_only_the_base_install():
    programs = _gate_programs()
    assert ROOT / "gates" / "mtp" / "gate_mtp.py" in programs  # the gate whose numpy was missing
    imported = set().union(*(_program_imports(p) for p in programs))
    assert "numpy" in imported and "gguf" in imported
    assert _not_covered(imported) == set(), "declare these in polyforge.gates.GATE_MODULES"
    # every declared module's distribution is a base dependency, not an extra
    assert {dist.lower() for dist in GATE_MODULES.values()} <= _base_dependencies()


@pytest.mark.slow
def test_vendored_gguf_py_needs_only_the_base_install():
    """The modules `import gguf` loads unconditionally (the vendored tree's gguf-py)."""
    package = ROOT / "vendor" / "llama.cpp" / "gguf-py" / "gguf"
    imported = set().union(*(_top_level_imports(p, module_level_only=True) for p in package.glob("*.py")))
    assert "numpy" in imported
    assert _not_covered(imported) == set(), "declare these in polyforge.gates.GATE_MODULES"


# -- slow: the real gates on the real CPU build --------------------------------------------------
def _cpu_gates() -> list[str]:
    """Every gate in gates/ that runs on a CPU build: a new gate is covered by CI by existing."""
    gates = [runner.find(ROOT / "gates", p.stem) for p in sorted((ROOT / "gates").glob("*.yaml")) if p.stem != "build"]
    return [g.name for g in gates if g.applies_to(False)]


@pytest.mark.slow
@pytest.mark.parametrize("name", _cpu_gates())
def test_real_gate(real_build, name):
    # no --build: the gate adds the targets it needs to the same build (targets are not in the key)
    done = run_pf("gate", "run", name, "--json", cwd=ROOT, timeout=3600)
    verdict = json.loads(done.stdout)
    print(json.dumps(verdict, indent=1))
    assert done.returncode == 0 and verdict["ok"] is True, (verdict, done.stderr[-2000:])


TURBO_KLD = """\
name: turbo-kld
kind: perplexity-kld
description: the shape of the gate the kernel work adds once the turbo types exist
build: {targets: [llama-perplexity]}
models: [gemma3-270m]
params:
  model: gemma3-270m
  text: data/llama-docs.txt
  ctx: 1024
  configs: [q8_0/q4_0, q8_0/turbo4, q8_0/turbo3, turbo3/turbo3]
thresholds:
  - "[q8_0/turbo4].kld_mean <= 1.3 * [q8_0/q4_0].kld_mean"
  - "not dominates('q*/q*', '*/turbo*', 'kld_mean', 'bits_per_pair')"
"""


def test_turbo_kld_schema_compares_configurations(tmp_path):
    path = tmp_path / "turbo-kld.yaml"
    path.write_text(TURBO_KLD)
    gate = runner.load(path)
    assert gate.params["configs"] == ["q8_0/q4_0", "q8_0/turbo4", "q8_0/turbo3", "turbo3/turbo3"]
    assert [perplexity_kld.bits_per_pair(c) for c in gate.params["configs"]] == [13.0, 12.75, 11.75, 6.5]
    metrics = {"q8_0/q4_0": {"kld_mean": 0.020, "bits_per_pair": 13.0},
               "q8_0/turbo4": {"kld_mean": 0.024, "bits_per_pair": 12.75},
               "q8_0/turbo3": {"kld_mean": 0.030, "bits_per_pair": 11.75},
               "turbo3/turbo3": {"kld_mean": 0.060, "bits_per_pair": 6.5}}
    assert runner.judge(gate.name, metrics, gate.thresholds).ok is True
    # an upstream configuration both smaller and closer than a turbo one fails the gate
    metrics["q4_0/q4_0"] = {"kld_mean": 0.025, "bits_per_pair": 9.0}
    verdict = runner.judge(gate.name, metrics, gate.thresholds)
    assert verdict.ok is False
    assert verdict.thresholds["not dominates('q*/q*', '*/turbo*', 'kld_mean', 'bits_per_pair')"]["ok"] is False
