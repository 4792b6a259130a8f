"""scripts/gpu_check.sh on a stand-in machine: a recording "python" in place of polyforge and a recording
test-backend-ops in the build folder. Each step calls the verbs and tools it says, with the build's key; a failed
build stops the run; an unknown step is refused."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"
KEY = "cuda-0123abcd"


def _machine(root: Path, build_exit: int = 0) -> dict[str, str]:
    """A fake python that runs `-c` code as python does, logs any other arguments (one call a line, JSON) and
    answers `polyforge build --json` with a key; a build folder whose test-backend-ops logs its arguments and
    reports one passing case."""
    calls = root / "calls.jsonl"
    fake_python = root / "python"
    fake_python.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        "args = sys.argv[1:]\n"
        "if args[:1] == ['-c']:\n"
        "    os.execv(sys.executable, [sys.executable, *args])\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(args) + '\\n')\n"
        "if args[:3] == ['-m', 'polyforge', 'build']:\n"
        f"    print(json.dumps({{'key': {KEY!r}}}))\n"
        f"    sys.exit({build_exit})\n"
        "if args[:3] == ['-m', 'polyforge', 'package'] and '--json' in args:\n"
        f"    print(json.dumps({{'archive': {str(root / 'polyforge-x.tar')!r}}}))\n")
    fake_python.chmod(0o755)
    bin_dir = root / "build" / KEY / "bin"
    bin_dir.mkdir(parents=True)
    ops = bin_dir / "test-backend-ops"
    ops.write_text(f'#!/bin/sh\necho "$*" >> {root}/ops-calls\necho "  1/1 tests passed"\n')
    ops.chmod(0o755)
    return {"PATH": os.environ["PATH"], "HOME": str(root), "PYTHON": str(fake_python), "WHEELS": str(root / "none")}


def _polyforge_calls(root: Path) -> list[list[str]]:
    lines = (root / "calls.jsonl").read_text().splitlines() if (root / "calls.jsonl").exists() else []
    return [args[2:] for args in map(json.loads, lines) if args[:2] == ["-m", "polyforge"]]


def _run(root: Path, *steps: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(root / "out"), *steps], cwd=root,
                          env={**_machine(root, int(env.pop("BUILD_EXIT", "0"))), **env},
                          capture_output=True, text=True, timeout=60)


def test_build_then_steps_use_its_key(tmp_path: Path) -> None:
    done = _run(tmp_path, "build", "gates", "bench", "agents", GATES="mtp-cuda", HEADS="128 512", BANDWIDTH="3350")
    assert done.returncode == 0, done.stdout + done.stderr
    calls = _polyforge_calls(tmp_path)
    build = calls[0]
    assert build[:4] == ["build", "--cuda", "--arch", "90-real"] and build[-1] == "--json"
    assert [build[i + 1] for i, a in enumerate(build) if a == "--target"] == [
        "test-backend-ops", "llama-bench", "llama-batched-bench", "llama-perplexity", "llama-server"]
    assert (tmp_path / "build" / "gpu-check.key").read_text().strip() == KEY
    assert calls[1] == ["gate", "run", "mtp-cuda", "--build", KEY, "--json"]
    benches = [c for c in calls if c[0] == "bench"]
    assert len(benches) == 3
    for c, dims in zip(benches[:2], ("n_embd=2048,n_head=16,n_head_kv=8", "n_embd=4096,n_head=8,n_head_kv=2")):
        assert c[c.index("--build") + 1] == KEY
        assert c[c.index("-m") + 1] == f"random:n_layer=16,{dims},n_ff=5632,n_vocab=32000,n_ctx=140000"
        assert c[c.index("-d") + 1] == "0,32768,131072" and c[c.index("--bandwidth") + 1] == "3350"
    agents = benches[2]
    assert agents[agents.index("--agents") + 1] == "1,4,8,16,32"
    assert agents[agents.index("--prefix") + 1] == "32768,131072"
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert f"build: exit 0, key {KEY}" in summary and "gate mtp-cuda: exit 0" in summary


def test_pack_is_vendored_and_applied_before_the_build(tmp_path: Path) -> None:
    done = _run(tmp_path, "build", PACK="/packs/llama.tar.xz")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [c[:2] for c in _polyforge_calls(tmp_path)] == [["vendor", "fetch"], ["apply"], ["build", "--cuda"]]
    assert _polyforge_calls(tmp_path)[0][2:] == ["--source", "/packs/llama.tar.xz", "--force"]


def _ship(root: Path, key: str) -> Path:
    """A build made on another host as cuda_host_build.sh packs it: KEY/manifest.json naming that host's folder, and
    KEY/bin with a test-backend-ops that logs its arguments."""
    made = root / "elsewhere" / key
    (made / "bin").mkdir(parents=True)
    (made / "manifest.json").write_text(json.dumps({"key": key, "build_dir": f"/host/build/{key}", "inputs": {}}))
    ops = made / "bin" / "test-backend-ops"
    ops.write_text(f'#!/bin/sh\necho "shipped $*" >> {root}/ops-calls\necho "  2/2 tests passed"\n')
    ops.chmod(0o755)
    archive = root / "ship.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(made, arcname=key)
    return archive


def test_a_shipped_build_is_unpacked_not_compiled(tmp_path: Path) -> None:
    archive = _ship(tmp_path, "cuda-shipped01")
    done = _run(tmp_path, "build", "ops-fa", SHIP=str(archive), PACK="/packs/llama-pruned.tar.xz")
    assert done.returncode == 0, done.stdout + done.stderr
    # the baseline vendored for gguf-py, not patched, and nothing compiled
    assert _polyforge_calls(tmp_path) == [["vendor", "fetch", "--source", "/packs/llama-pruned.tar.xz", "--force"]]
    assert (tmp_path / "build" / "gpu-check.key").read_text().strip() == "cuda-shipped01"
    manifest = json.loads((tmp_path / "build" / "cuda-shipped01" / "manifest.json").read_text())
    assert manifest["build_dir"] == str(tmp_path / "build" / "cuda-shipped01")
    assert (tmp_path / "ops-calls").read_text().splitlines() == ["shipped -o FLASH_ATTN_EXT -b CUDA0"]
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("build: shipped cuda-shipped01, unpacked: exit 0")
    assert summary[1] == "FLASH_ATTN_EXT: 2/2 tests passed (exit 0)"


def test_a_shipped_archive_that_is_not_one_stops_the_run(tmp_path: Path) -> None:
    (tmp_path / "ship.tar.xz").write_text("not an archive")
    done = _run(tmp_path, "build", "ops", SHIP=str(tmp_path / "ship.tar.xz"))
    assert done.returncode == 1
    assert not (tmp_path / "ops-calls").exists()
    assert "unpacked: exit " in (tmp_path / "out" / "summary.txt").read_text()


def test_ops_run_against_the_cpu_and_are_summarised(tmp_path: Path) -> None:
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "gpu-check.key").write_text(KEY + "\n")
    done = _run(tmp_path, "ops", "ops-fa")
    assert done.returncode == 0, done.stdout + done.stderr
    calls = (tmp_path / "ops-calls").read_text().splitlines()
    assert "-o FLASH_ATTN_EXT -p turbo -b CUDA0" in calls and calls[-1] == "-o FLASH_ATTN_EXT -b CUDA0"
    assert "-o MUL_MAT_HADAMARD,MUL_MAT_SCALED_HADAMARD -b CUDA0" in calls
    assert all(c.endswith("-b CUDA0") for c in calls)
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0] == "SET_ROWS turbo: 1/1 tests passed (exit 0)" and len(summary) == 7


def test_a_failed_build_stops_the_run(tmp_path: Path) -> None:
    done = _run(tmp_path, "build", "bench", BUILD_EXIT="1")
    assert done.returncode == 1
    assert [c[0] for c in _polyforge_calls(tmp_path)] == ["build"]


def test_unknown_step_refused(tmp_path: Path) -> None:
    done = _run(tmp_path, "variant")
    assert done.returncode == 2 and "unknown step variant" in done.stderr


def test_package_runs_the_server_from_the_unpacked_archive_with_no_build_tree(tmp_path: Path) -> None:
    staged = tmp_path / "staged" / "polyforge-x" / "bin"
    staged.mkdir(parents=True)
    server = staged / "llama-server"
    # the server fails if the build tree it must not need is still there
    server.write_text(f'#!/bin/sh\n[ -d {tmp_path}/build ] && exit 7\necho "version: 1 (build 16)"\n')
    server.chmod(0o755)
    subprocess.run(["tar", "-cf", str(tmp_path / "polyforge-x.tar"), "-C", str(tmp_path / "staged"), "polyforge-x"],
                   check=True)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "gpu-check.key").write_text(KEY)  # as the build step leaves it
    done = _run(tmp_path, "package")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _polyforge_calls(tmp_path)[-2:] == [["package", "--build", KEY, "--json"],
                                               ["package", "--verify", str(tmp_path / "polyforge-x.tar")]]
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "package: exit 0, verify exit 0, llama-server --version from the unpacked archive: exit 0" in summary
    assert "version: 1 (build 16)" in (tmp_path / "out" / "package.log").read_text()
    assert (tmp_path / "build" / KEY / "bin" / "test-backend-ops").exists(), "build/ is put back"
