"""The gate programs (gates/*/gate_*.py) and the MTP fixture tooling, without a llama.cpp build:
the paths the gate YAML hands them, their argument parsing and verdict logic on canned data, the
fixture they read, and the llama-server harness they share with the server kind
(polyforge.gates.server.LlamaServer) against a fake server."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from polyforge.errors import VerificationFailed
from polyforge.gates.server import LlamaServer

GATES = ROOT / "gates"
MTP_DATA = GATES / "mtp" / "data"
GGUF_PY = ROOT / "vendor" / "llama.cpp" / "gguf-py"


def gate_program(folder: str, module: str):
    """gates/FOLDER/MODULE.py imported as the runner runs it: with its folder first on sys.path,
    so that its plain imports of the files beside it resolve."""
    path = str(GATES / folder)
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(module)


def vendored_gguf():
    if not (GGUF_PY / "gguf").is_dir():
        pytest.skip("needs the vendored tree's gguf-py (polyforge vendor fetch)")
    if str(GGUF_PY) not in sys.path:
        sys.path.insert(0, str(GGUF_PY))
    return importlib.import_module("gguf")


# -- the gate definitions point at files that exist --------------------------------------------
def _command_argvs() -> dict[str, list[str]]:
    argvs = {}
    for path in sorted(GATES.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if path.name != "build.yaml" and raw["kind"] == "command":
            argvs[raw["name"]] = [str(a) for a in raw["params"]["argv"]]
    return argvs


def test_gate_argv_paths_exist():
    programs, data = set(), set()
    for name, argv in _command_argvs().items():
        for arg in argv:
            if arg.startswith("{root}/") and not arg.startswith("{root}/vendor/"):
                programs.add(arg.removeprefix("{root}/"))
            data.update(re.findall(r"\{data:([^{}]+)\}", arg))
    assert {"gates/mtp/gate_mtp.py", "gates/shared_pool/gate_shared_pool.py"} <= programs
    assert [p for p in programs if not (ROOT / p).is_file()] == []
    assert "mtp/data/target.gguf" in data
    assert [d for d in data if not (GATES / d).is_file()] == []  # {data:...} is relative to gates/


@pytest.mark.parametrize("program", ["mtp/gate_mtp.py", "shared_pool/gate_shared_pool.py", "mtp/gguf_rewrite.py",
                                     "mtp/pad_mtp_target.py", "mtp/check_mtp_fixture.py", "needle/gate_needle.py",
                                     "kv_state/gate_kv_state.py", "key_guard/gate_key_guard.py"])
def test_programs_run_as_files_from_anywhere(program, tmp_path):
    """As the runner starts them (python FILE, this interpreter): every import resolves, the
    package harness included, whatever the working folder."""
    done = subprocess.run([sys.executable, str(GATES / program), "--help"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")


# -- gate mtp -----------------------------------------------------------------------------------
MTP_ARGV = ["--server", "S", "--target", "T", "--assistant", "A", "--assistant-centroid", "C", "--text", "X",
            "--gguf-py", "G"]


def test_mtp_arguments():
    gate_mtp = gate_program("mtp", "gate_mtp")
    args = gate_mtp.parse_args(MTP_ARGV + ["--ngl", "99", "--json"])
    assert (args.ngl, args.json, args.prompts, args.n_predict, args.twin_ff, args.bad_input) == (99, True, 8, 128,
                                                                                                  16384, True)
    assert gate_mtp.parse_args(MTP_ARGV + ["--no-bad-input", "--twin-ff", "0"]).bad_input is False
    with pytest.raises(SystemExit) as exc:
        gate_mtp.parse_args(MTP_ARGV + ["--twin-rounds", "0"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        gate_mtp.parse_args(MTP_ARGV[2:])  # no --server


def test_mtp_prompts_are_line_starts_of_the_corpus():
    gate_mtp = gate_program("mtp", "gate_mtp")
    text = (MTP_DATA / "corpus.txt").read_text()
    prompts = gate_mtp.make_prompts(text, 8, 160)
    assert len(prompts) == 8 and len(set(prompts)) == 8
    for prompt in prompts:
        assert len(prompt) == 160 and prompt[0].isalpha() and ("\n" + prompt) in text


def _run(tokens, timings):
    gate_mtp = gate_program("mtp", "gate_mtp")
    return {"tokens": tokens, **gate_mtp.summarize_run(timings)}


def test_mtp_judges_a_configuration_against_mtp_off():
    gate_mtp = gate_program("mtp", "gate_mtp")
    off = _run([[1, 2], [3, 4]], [{"predicted_n": 100, "predicted_ms": 1000.0}] * 2)
    assert off["tps"] == 100.0 and off["draft_n"] == 0 and off["acceptance"] == 0.0
    on = _run([[1, 2], [3, 4]], [{"predicted_n": 100, "predicted_ms": 500.0, "draft_n": 40, "draft_n_accepted": 30},
                                 {"predicted_n": 100, "predicted_ms": 500.0, "draft_n": 60, "draft_n_accepted": 40}])
    row, lossless, accepts = gate_mtp.judge_config(on, off, 1.0, 2)
    assert row == {"outputs_equal": 2, "teacher_forced_top1": 1.0, "draft_n": 100, "draft_n_accepted": 70,
                   "acceptance": 0.7, "tps": 200.0, "speedup": 2.0}
    assert lossless and accepts
    # one prompt's output differs, or one token disagrees with teacher forcing: not lossless
    assert gate_mtp.judge_config({**on, "tokens": [[1, 2], [3, 5]]}, off, 1.0, 2)[1] is False
    assert gate_mtp.judge_config(on, off, 0.9921, 2)[1] is False
    # acceptance under THRESHOLDS["min_acceptance"] (0.6)
    assert gate_mtp.judge_config({**on, "acceptance": 0.59}, off, 1.0, 2)[2] is False


@pytest.mark.parametrize("exit_code, log, ok", [
    (1, "load: mtp head built for a target of width 256, not 128\n", True),
    (134, "load: mtp head built for a target of width 256\nAborted\n", False),  # SIGABRT: not a clean refusal
    (None, "server listening\n", False),                                          # it loaded the bad head
    (1, "error: something else\n", False),                                        # refused, but not saying why
])
def test_mtp_bad_head_refusals(exit_code, log, ok):
    gate_mtp = gate_program("mtp", "gate_mtp")
    result = gate_mtp.judge_refusal(exit_code, log, "target of width 256")
    assert result["ok"] is ok and result["exit_code"] == exit_code
    assert (result["line"] is not None) == ("width 256" in log)


# -- the MTP fixture and its tools ---------------------------------------------------------------
def test_mtp_fixture_matches_its_manifest():
    manifest = json.loads((MTP_DATA / "MANIFEST.json").read_text())
    assert manifest["made_by"] == "gates/mtp/train_mtp_fixture.py"
    assert (ROOT / manifest["made_by"]).is_file() and (ROOT / manifest["corpus"]["file"]).is_file()
    for name, entry in manifest["files"].items():
        data = (MTP_DATA / name).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["bytes"], entry["sha256"]), name


def test_mtp_vocab_encodes_the_fixture_prompts():
    """The ids the fixture was trained on are what mtp_vocab (and llama.cpp, checked by
    check_mtp_fixture.py through /tokenize) makes of the prompt text."""
    mtp_vocab = gate_program("mtp", "mtp_vocab")
    reference = json.loads((MTP_DATA / "reference.json").read_text())
    assert len(reference["prompts"]) == 8
    for prompt in reference["prompts"]:
        assert prompt["prompt_ids"] == [mtp_vocab.BOS_ID] + mtp_vocab.encode(prompt["prompt_text"])
    text = "a b\u00e9\u2581"
    assert mtp_vocab.decode(mtp_vocab.encode(text)) == text
    assert mtp_vocab.encode(" ") == [mtp_vocab.SPACE_ID]
    tokens = mtp_vocab.vocab_tokens(288)
    assert len(tokens) == 288 and tokens[mtp_vocab.BYTE0] == ("<0x00>", 0.0, mtp_vocab.BYTE)
    assert tokens[mtp_vocab.SPACE_ID][0] == mtp_vocab.SPACE_PIECE and tokens[-1][2] == mtp_vocab.UNUSED


def test_check_mtp_fixture_defaults_to_the_fixture():
    check = gate_program("mtp", "check_mtp_fixture")
    args = check.parse_args(["--bin", "b"])
    assert Path(args.fixtures) == MTP_DATA and (Path(args.fixtures) / "reference.json").is_file()
    assert (check.HERE / "mtp_logits_dump.cpp").is_file()


def test_pad_target_computes_the_same_function(tmp_path):
    """The speed twin: every FFN widened by zero rows/columns, the original weights unchanged."""
    gguf = vendored_gguf()
    pad_mtp_target = gate_program("mtp", "pad_mtp_target")
    twin = tmp_path / "twin.gguf"
    pad_mtp_target.pad_target(gguf, str(MTP_DATA / "target.gguf"), str(twin), 512)
    before, after = gguf.GGUFReader(str(MTP_DATA / "target.gguf")), gguf.GGUFReader(str(twin))
    assert after.fields["gemma4.feed_forward_length"].contents() == 512
    old = {t.name: t.data for t in before.tensors}
    padded = 0
    for t in after.tensors:
        if t.name.endswith((".ffn_gate.weight", ".ffn_up.weight")):
            assert t.data.shape[0] == 512 and (t.data[:old[t.name].shape[0]] == old[t.name]).all()
            assert not t.data[old[t.name].shape[0]:].any()
            padded += 1
        elif t.name.endswith(".ffn_down.weight"):
            assert t.data.shape[1] == 512 and (t.data[:, :old[t.name].shape[1]] == old[t.name]).all()
            assert not t.data[:, old[t.name].shape[1]:].any()
            padded += 1
        else:
            assert (t.data == old[t.name]).all(), t.name
    assert padded == 3 * 4  # gate, up, down in each of the 4 layers


def test_fork_format_renames_arch_keys_and_tensors(tmp_path):
    gguf = vendored_gguf()
    gguf_rewrite = gate_program("mtp", "gguf_rewrite")
    fork = tmp_path / "fork.gguf"
    gguf_rewrite.to_fork_format(gguf, str(MTP_DATA / "assistant-centroid.gguf"), str(fork))
    reader = gguf.GGUFReader(str(fork))
    assert reader.fields["general.architecture"].contents() == "gemma4_assistant"
    assert reader.fields["gemma4_assistant.n_embd_backbone"].contents() == 128
    assert not any(k.endswith(("embedding_length_out", "nextn_predict_layers")) for k in reader.fields)
    names = {t.name for t in reader.tensors}
    assert set(gguf_rewrite.FORK_TENSORS.values()) <= names
    assert not set(gguf_rewrite.FORK_TENSORS) & names


# -- gate shared-pool ---------------------------------------------------------------------------
def test_shared_pool_arguments():
    gate = gate_program("shared_pool", "gate_shared_pool")
    args = gate.parse_args(["--server", "S", "--model", "M", "--json", "--extra-args", "-ctk turbo3 -ctv turbo3",
                            "--cold-tolerance", "1.0"])
    assert (args.json, args.extra_args, args.cold_tolerance, args.ctx, args.load) == (
        True, "-ctk turbo3 -ctv turbo3", 1.0, 16384, 64)
    defaults = gate.parse_args(["--server", "S", "--model", "M"])
    assert defaults.cold_tolerance == gate.THRESHOLDS["max_abs_dprob_cold"]
    assert defaults.near_tie_margin == gate.THRESHOLDS["near_tie_margin"] == 0.15
    assert gate.parse_args(["--server", "S", "--model", "M", "--near-tie-margin", "1.0"]).near_tie_margin == 1.0


def test_shared_pool_document_and_suffixes():
    gate = gate_program("shared_pool", "gate_shared_pool")
    doc = gate.make_document(20)
    assert doc.count(str(gate.NEEDLE_CODE)) == 1 and doc.endswith("\n\n")
    suffixes = [gate.make_suffix(i) for i in range(len(gate.AGENTS))]
    # each suffix starts with its agent's name, so two prompts share the document and nothing more
    assert [s.split(" ")[0] for s in suffixes] == gate.AGENTS
    assert all(str(gate.LOCKERS[i]) in s and s.endswith("Answer:") for i, s in enumerate(suffixes))
    assert "vault access code" in suffixes[0] and f"agent {gate.AGENTS[2]}" in suffixes[1]


def test_shared_pool_reads_kv_cells_from_metrics():
    gate = gate_program("shared_pool", "gate_shared_pool")
    text = ("# HELP llamacpp:kv_cells_used cells in use\n"
            'llamacpp:kv_cells_used{cache="0"} 1018\n'
            'llamacpp:kv_cells_used{cache="1"} 512\n'
            'llamacpp:kv_cells_used_max{cache="0"} 1.2e3\n'
            'llamacpp:kv_cells{cache="0"} 16384\n'
            "llamacpp:prompt_tokens_total 5\n")
    assert gate.parse_kv_cells(text) == {"kv_cells_used": {0: 1018, 1: 512}, "kv_cells_used_max": {0: 1200},
                                         "kv_cells": {0: 16384}}


def _probs(*tops):
    """A /completion reply's completion_probabilities: per token, [(id, prob), ...]."""
    return {"completion_probabilities": [{"top_probs": [{"id": i, "prob": p} for i, p in top]} for top in tops]}


def test_shared_pool_compares_top_tokens():
    gate = gate_program("shared_pool", "gate_shared_pool")
    a = gate.top_probs(_probs([(5, 0.2), (7, 0.7)], [(9, 0.5), (8, 0.45)]))
    assert a == [(7, 0.7, 0.2), (9, 0.5, 0.45)]  # sorted: (top1 id, top1 prob, top2 prob)
    same = gate.top_probs(_probs([(7, 0.68), (5, 0.2)], [(9, 0.5), (8, 0.45)]))
    assert gate.compare_probs(a, same, 0.15) == (pytest.approx(0.02), False, False)
    info = {}
    near_tie_flip = gate.top_probs(_probs([(7, 0.7), (5, 0.2)], [(8, 0.5), (9, 0.45)]))
    assert gate.compare_probs(a, near_tie_flip, 0.15, info)[1:] == (True, True)
    assert info["flip_at"] == 1
    sure_flip = [(7, 0.7, 0.2), (8, 0.9, 0.05)]
    clear = [(7, 0.7, 0.2), (9, 0.9, 0.05)]
    assert gate.compare_probs(clear, sure_flip, 0.15)[1:] == (True, False)


def test_shared_pool_verdict():
    gate = gate_program("shared_pool", "gate_shared_pool")
    assert gate.verdict({"P": 1018}, {"a": True, "b": True})["ok"] is True
    failed = gate.verdict({"P": 1018}, {"a": True, "exception": False})
    assert failed["ok"] is False and failed["metrics"] == {"P": 1018, "checks": {"a": True, "exception": False}}
    assert gate.verdict({}, {})["ok"] is False  # no check ran: never ok


# -- needles in a haystack ----------------------------------------------------------------------
def test_needles_are_distinct_and_reproducible():
    gate = gate_program("needle", "gate_needle")
    needles = gate.make_needles(8, seed=18)
    assert needles == gate.make_needles(8, seed=18) != gate.make_needles(8, seed=19)
    assert len({n for n, _ in needles}) == 8 and len({c for _, c in needles}) == 8
    assert all(len(code) == 5 and code.isdigit() for _, code in needles)
    with pytest.raises(SystemExit):
        gate.make_needles(len(gate.NAMES) + 1, seed=0)


def test_haystack_spreads_the_needles_in_order():
    gate = gate_program("needle", "gate_needle")
    needles = [("A", "11111"), ("B", "22222"), ("C", "33333")]
    paragraphs = [f"paragraph {i} " * 5 for i in range(4)]
    parts = gate.make_haystack(paragraphs, needles, 40).split("\n\n")
    assert len(parts) == 43
    where = [parts.index(f"The access code of {n} is {c}.") for n, c in needles]
    assert where == sorted(where) and where[0] > 5 and where[-1] < 38  # spread, none at an end


NEEDLE_SERVER = """\
import http.server, json, re, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
cache_k = args[args.index("-ctk") + 1]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def send(self, body):
        body = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.send({"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self.send({"tokens": list(range(len(req["content"])))})
            return
        # a perfect retriever with f16 K, a wrong one otherwise
        name = re.search(r"The access code of (\\w+) is$", req["prompt"]).group(1)
        code = re.search(r"The access code of " + name + r" is (\\d+)\\.", req["prompt"]).group(1)
        answer = code if cache_k == "f16" else "12345"
        self.send({"content": " " + answer + ".", "timings": {"prompt_ms": 1500.0}})
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_needle_check_counts_retrievals_per_configuration(tmp_path):
    gate = gate_program("needle", "gate_needle")
    server = tmp_path / "llama-server"
    server.write_text(f"#!{sys.executable}\n{NEEDLE_SERVER}")
    server.chmod(0o755)
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"Paragraph {i} says something long enough to count." for i in range(30)))
    args = gate.parse_args(["--server", str(server), "--model", "m.gguf", "--text", str(text), "--tokens", "3000",
                            "--kv", "f16/f16", "--kv", "turbo3/turbo3", "--needles", "5", "--health-timeout", "10"])
    result = gate.check(args)
    assert result["ok"] is True and result["needles"] == 5
    assert 2000 < result["tokens"] <= 3000 - 16
    assert result["f16/f16"]["found"] == 5 and result["f16/f16"]["missed"] == []
    assert result["turbo3/turbo3"]["found"] == 0 and len(result["turbo3/turbo3"]["missed"]) == 5
    assert result["f16/f16"]["prefill_s"] == 1.5


# -- the llama-server harness, against a fake server --------------------------------------------
FAKE_SERVER = """\
import http.server, json, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
print("fake llama-server", " ".join(args), flush=True)
if "--refuse" in args:
    print("load: the head does not fit this target", flush=True)
    sys.exit(1)
started = time.time()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def send(self, code, body, kind="application/json"):
        body = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/health":
            ready = time.time() - started > 0.3
            self.send(200 if ready else 503, json.dumps({"status": "ok" if ready else "loading"}))
        elif self.path == "/metrics":
            self.send(200, 'llamacpp:kv_cells_used{cache="0"} 7\\n', "text/plain")
        else:
            self.send(404, json.dumps({"error": "not found"}))
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self.send(200, json.dumps({"tokens": [ord(c) for c in req["content"]]}))
        else:
            self.send(400, json.dumps({"error": {"message": "bad request"}}))
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def fake_server(tmp_path) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    path.chmod(0o755)
    return path


def test_harness_serves_json_and_text_and_stops(fake_server, tmp_path):
    server = LlamaServer(fake_server, "m.gguf", ["-c", 512], tmp_path / "srv.log")
    with server:
        assert 0 < server.wait_healthy(10) < 10
        assert server.alive() and server.base == f"http://127.0.0.1:{server.port}"
        assert server.tokenize("ab", add_special=True) == [97, 98]
        assert server.get("/metrics") == (200, 'llamacpp:kv_cells_used{cache="0"} 7\n')
        assert server.post_json("/completion", {"prompt": "x"}) == (400, {"error": {"message": "bad request"}})
    assert not server.alive()
    assert f"-m m.gguf --host 127.0.0.1 --port {server.port} -c 512" in server.log_text()


def test_harness_reports_a_server_that_exits_before_health(fake_server, tmp_path):
    with LlamaServer(fake_server, "m.gguf", ["--refuse"], tmp_path / "bad.log") as server:
        with pytest.raises(VerificationFailed, match=r"exited with status 1 before it became healthy "
                                                     r"\(log: .*bad.log\): load: the head does not fit"):
            server.wait_healthy(10)
    with LlamaServer(fake_server, "m.gguf", ["--refuse"], tmp_path / "bad2.log") as server:
        assert server.wait_exit(10) == 1
    with LlamaServer(fake_server, "m.gguf", [], tmp_path / "up.log") as server:
        assert server.wait_exit(0.5) is None  # still serving


def test_shared_pool_keeps_its_logs_in_the_folder_asked_for(fake_server, tmp_path):
    """Run by polyforge, the gate's server logs go to its record folder ({work}): nothing is left
    in the temporary folder, and a failing run's logs are where its verdict says."""
    tmp, logs = tmp_path / "tmp", tmp_path / "work"
    tmp.mkdir()
    done = subprocess.run([sys.executable, str(GATES / "shared_pool" / "gate_shared_pool.py"), "--server",
                           str(fake_server), "--model", "m.gguf", "--log-dir", str(logs), "--json",
                           "--extra-args=--refuse", "--startup-timeout", "10"],
                          capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 1, done.stderr
    verdict = json.loads(done.stdout)
    assert verdict["ok"] is False and verdict["metrics"]["log_dir"] == str(logs)
    assert "load: the head does not fit" in (logs / "main.log").read_text()
    assert not (logs / "slots").exists() and list(tmp.iterdir()) == []


@pytest.mark.parametrize("name", ["shared-pool", "shared-pool-turbo3", "shared-pool-turbo3-cuda", "mtp", "mtp-cuda"])
def test_server_gates_log_into_their_record_folder(name):
    argv = _command_argvs()[name]
    assert argv[argv.index("--log-dir") + 1] == "{work}"


# -- gate kv-state-turbo ------------------------------------------------------------------------
# A stand-in compiler: it writes, as the "program", a script that prints one row per K/V pair and
# fails for q4_0 keys (prints no result for f32), so that the gate's build, its per-pair runs and its verdict run for real.
FAKE_CXX = """#!/bin/sh
while [ "$1" != "-o" ]; do shift; done
cat > "$2" <<'PROG'
#!/bin/sh
[ "$3" = q4_0 ] && { echo "error: q4_0 refused" >&2; exit 3; }
[ "$3" = f32 ] && { echo "not a result"; exit 0; }
echo "{\\"type_k\\": \\"$3\\", \\"type_v\\": \\"$4\\", \\"n_tokens\\": $5, \\"shift_kld\\": 0.1, \\"base_kld\\": 0.08}"
PROG
chmod +x "$2"
"""


def _kv_state_run(tmp_path, monkeypatch, pairs, cxx=FAKE_CXX):
    compiler = tmp_path / "fake-cxx"
    compiler.write_text(cxx)
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    argv = [sys.executable, str(GATES / "kv_state" / "gate_kv_state.py"), "--root", str(ROOT), "--lib-from",
            str(tmp_path / "bin" / "llama-perplexity"), "--model", "M", "--text", "T", "--work",
            str(tmp_path / "work"), "--pairs", pairs, "--tokens", "100"]
    return subprocess.run(argv, capture_output=True, text=True)


def test_kv_state_collects_one_row_per_pair(tmp_path, monkeypatch):
    done = _kv_state_run(tmp_path, monkeypatch, "turbo3/turbo3,q8_0/turbo3")
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["ok"] is True
    assert verdict["metrics"] == {
        "turbo3/turbo3": {"n_tokens": 100, "shift_kld": 0.1, "base_kld": 0.08},
        "q8_0/turbo3": {"n_tokens": 100, "shift_kld": 0.1, "base_kld": 0.08},
    }
    assert (tmp_path / "work" / "turbo3-turbo3.log").is_file()


def test_kv_state_a_failing_pair_fails_the_verdict(tmp_path, monkeypatch):
    done = _kv_state_run(tmp_path, monkeypatch, "q4_0/q4_0,f32/f32,turbo4/turbo4")
    assert done.returncode == 1
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["ok"] is False and list(verdict["metrics"]) == ["turbo4/turbo4"]
    assert "q4_0 refused" in done.stderr and "f32/f32: no result line" in done.stderr


def test_kv_state_a_failing_build_is_one_line(tmp_path, monkeypatch):
    done = _kv_state_run(tmp_path, monkeypatch, "turbo3/turbo3", cxx="#!/bin/sh\necho 'fatal: no llama.h' >&2\nexit 1\n")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "error: building kv_shift_state failed with exit 1"
    assert "fatal: no llama.h" in done.stderr



# -- gate key-guard -----------------------------------------------------------------------------
# A stand-in compiler whose "program" prints the row key_guard.cpp prints for each K type it is given,
# or fails as told, so that the gate's build, its run and its verdict run for real.
FAKE_GUARD_CXX = """#!/bin/sh
while [ "$1" != "-o" ]; do shift; done
cat > "$2" <<'PROG'
#!/bin/sh
[ "$3" = fail ] && { echo "error: llama_decode failed" >&2; exit 1; }
[ "$3" = garbled ] && { echo "not a result"; exit 0; }
echo '{"q8_0": {"kl": 0.0001, "kl_q8_0": 0.0001, "estimates": 1, "estimates_disabled": 0, "warned": false, "max_dlogit": 0, "warning": ""}, "turbo2": {"kl": 0.5, "kl_q8_0": 0.0001, "estimates": 1, "estimates_disabled": 0, "warned": true, "max_dlogit": 0, "warning": "turbo2 keys cost"}}'
PROG
chmod +x "$2"
"""


def _key_guard_run(tmp_path, monkeypatch, types, cxx=FAKE_GUARD_CXX):
    compiler = tmp_path / "fake-cxx"
    compiler.write_text(cxx)
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    argv = [sys.executable, str(GATES / "key_guard" / "gate_key_guard.py"), "--root", str(ROOT), "--lib-from",
            str(tmp_path / "bin" / "llama-perplexity"), "--model", "M", "--text", "T", "--work",
            str(tmp_path / "work"), "--types", types]
    return subprocess.run(argv, capture_output=True, text=True)


def test_key_guard_reports_each_type(tmp_path, monkeypatch):
    done = _key_guard_run(tmp_path, monkeypatch, "q8_0,turbo2")
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["ok"] is True
    assert verdict["metrics"]["turbo2"]["warned"] is True and verdict["metrics"]["q8_0"]["warned"] is False
    assert "turbo2: kl 0.5 (q8_0 0.0001), warned True, max_dlogit 0" in done.stderr
    assert (tmp_path / "work" / "key_guard.log").is_file()


@pytest.mark.parametrize("types", ["fail", "garbled"])
def test_key_guard_a_failed_run_fails_the_verdict(tmp_path, monkeypatch, types):
    done = _key_guard_run(tmp_path, monkeypatch, types)
    assert done.returncode == 1
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict == {"ok": False, "metrics": {}}


def test_key_guard_a_failing_build_is_one_line(tmp_path, monkeypatch):
    done = _key_guard_run(tmp_path, monkeypatch, "q8_0", cxx="#!/bin/sh\necho 'fatal: no llama.h' >&2\nexit 1\n")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == "error: building key_guard failed with exit 1"
