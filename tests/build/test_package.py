"""polyforge package: the archive, its provenance, --verify against a flipped byte in any file and
against a provenance of another chain, and the unpacked archive running with no build tree."""

from __future__ import annotations

import io
import json
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from buildkit import TINY_TARGETS, fake_build, real_build, run_pf, tiny_project  # noqa: F401 - real_build: a fixture
from conftest import ROOT, assert_clean_error, capture, run_cli
from polyforge.build import builder as build_lib
from polyforge.build import package as package_lib
from polyforge.hashing import sha256_bytes


@pytest.fixture
def packaged(tmp_path, monkeypatch):
    """A tiny project with a one-patch chain, built, a passing gate verdict recorded, packaged."""
    proj = tiny_project(tmp_path, monkeypatch)
    capture(proj, "0001-answer", {"src/llama.c": "int ggml_answer(void);\nint llama_answer(void) { return ggml_answer() + 1; }\n"})
    result = build_lib.build(proj.chain(), build_lib.BuildOptions.make(targets=TINY_TARGETS))
    verdict_dir = result.manifest.build_dir / "gates" / "tiny"
    verdict_dir.mkdir(parents=True)
    cli = result.manifest.build_dir / "bin" / "llama-cli"
    (verdict_dir / "verdict.json").write_text(json.dumps({
        "recorded_at": "2026-01-01T00:00:00+0000", "inputs_digest": "0" * 64, "inputs": {},
        "binaries": {"llama-cli": sha256_bytes(cli.read_bytes())}, "verdict": {"gate": "tiny", "ok": True}}))
    done = run_cli("package", "--out", str(tmp_path / "dist"), "--json", cwd=proj.root)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    return proj, result.manifest, Path(info["archive"]), info


def _members(archive: Path) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    with tarfile.open(archive, "r:xz") as tar:
        return {m.name: (m, tar.extractfile(m).read() if m.isfile() else None) for m in tar}


def _repack(archive: Path, dest: Path, change) -> Path:
    """The archive with change(name, data) -> data applied to each file."""
    with lzma.open(dest, "wb") as xz, tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as out:
        for name, (info, data) in _members(archive).items():
            if data is None:
                out.addfile(info)
                continue
            data = change(name, data)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return dest


def test_the_archive_holds_the_build_and_its_provenance(packaged):
    proj, manifest, archive, info = packaged
    assert archive.name == f"polyforge-{manifest.key}.tar.xz" and info["gates"] == [{"gate": "tiny", "ok": True, "judged_these_files": True}]
    members = _members(archive)
    top = f"polyforge-{manifest.key}"
    statement = json.loads(members[f"{top}/provenance.json"][1])
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects == {f"bin/{a.name}": a.sha256 for a in manifest.artifacts}
    for name, digest in subjects.items():
        assert sha256_bytes(members[f"{top}/{name}"][1]) == digest
    assert members[f"{top}/bin/libllama.so"][0].linkname == "libllama.so.0.5.0"
    build = statement["predicate"]["buildDefinition"]
    chain = build["externalParameters"]["chain"]
    patch = proj.patches / "0001-answer.patch"
    assert chain["patches"] == [{"name": "0001-answer.patch", "sha256": sha256_bytes(patch.read_bytes())}]
    lock = json.loads((proj.patches / "chain.lock").read_text())
    assert chain["lock_final_tree"] == lock["patches"][-1]["tree"] and chain["live_edits"] is False
    pin = build["externalParameters"]["pin"]
    assert pin["tree"] == proj.upstream.tree and pin["release"]
    assert build["externalParameters"]["key"] == manifest.key and build["externalParameters"]["options"]["runpath"] == "$ORIGIN"
    assert build["internalParameters"]["toolchain"]["cxx"]
    assert {"name": "patches/0001-answer.patch", "digest": {"sha256": chain["patches"][0]["sha256"]}} in build["resolvedDependencies"]
    verdict = statement["predicate"]["runDetails"]["byproducts"][0]
    assert verdict["name"] == "gates/tiny/verdict.json" and verdict["annotations"]["ok"] is True
    assert verdict["digest"]["sha256"] == sha256_bytes(members[f"{top}/gates/tiny/verdict.json"][1])
    # reproducible: the same build packages to the same bytes
    again = run_cli("package", "--out", str(archive.parent / "again"), "--json", cwd=proj.root)
    assert json.loads(again.stdout)["sha256"] == info["sha256"]


def test_verify_passes_in_and_out_of_a_checkout(packaged, tmp_path):
    proj, manifest, archive, _ = packaged
    done = run_cli("package", "--verify", str(archive), "--json", cwd=proj.root)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["chain_checked"] and report["files"] == len(manifest.artifacts) + 1
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = run_cli("package", "--verify", str(archive), cwd=outside)
    assert done.returncode == 0 and "not in a polyforge checkout" in done.stderr, done.stderr


def test_verify_catches_a_flipped_byte_in_any_file(packaged, tmp_path):
    proj, manifest, archive, _ = packaged
    files = [name for name, (info, data) in _members(archive).items() if data is not None and not name.endswith("provenance.json")]
    assert len(files) == len(manifest.artifacts) + 1
    for i, target in enumerate(files):
        def flip(name, data, target=target):
            if name != target:
                return data
            middle = len(data) // 2
            return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1:]
        bad = _repack(archive, tmp_path / f"bad-{i}.tar.xz", flip)
        done = run_cli("package", "--verify", str(bad), cwd=proj.root)
        rel = target.split("/", 1)[1]
        assert_clean_error(done, 1, f"{rel}: sha256")


def test_verify_catches_a_provenance_of_another_chain(packaged, tmp_path):
    proj, _, archive, _ = packaged

    def other_chain(name, data):
        if not name.endswith("provenance.json"):
            return data
        statement = json.loads(data)
        statement["predicate"]["buildDefinition"]["externalParameters"]["chain"]["patches"][0]["sha256"] = "f" * 64
        return json.dumps(statement).encode()

    bad = _repack(archive, tmp_path / "other-chain.tar.xz", other_chain)
    assert_clean_error(run_cli("package", "--verify", str(bad), cwd=proj.root), 1, "the provenance's 0001-answer.patch has sha256 ffffffffffff")

    def other_tree(name, data):
        if not name.endswith("provenance.json"):
            return data
        statement = json.loads(data)
        statement["predicate"]["buildDefinition"]["externalParameters"]["chain"]["lock_final_tree"] = "e" * 40
        return json.dumps(statement).encode()

    bad = _repack(archive, tmp_path / "other-tree.tar.xz", other_tree)
    assert_clean_error(run_cli("package", "--verify", str(bad), cwd=proj.root), 1, "chain.lock says")


def test_verify_catches_files_added_or_removed(packaged, tmp_path):
    proj, _, archive, _ = packaged
    top = next(iter(_members(archive)))
    extra = tmp_path / "extra.tar.xz"
    shutil.copy(archive, tmp_path / "plain.tar.xz")
    with lzma.open(extra, "wb") as xz, tarfile.open(fileobj=xz, mode="w") as out:
        for name, (info, data) in _members(archive).items():
            if name.endswith("bin/llama-cli"):
                continue  # dropped
            out.addfile(info, io.BytesIO(data) if data is not None else None)
        info = tarfile.TarInfo(f"{top}/bin/evil")
        info.size = 3
        out.addfile(info, io.BytesIO(b"bad"))
    done = run_cli("package", "--verify", str(extra), cwd=proj.root)
    assert_clean_error(done, 1, "bin/evil: in the archive, not in the provenance")
    assert "bin/llama-cli: in the provenance, not in the archive" in done.stderr


@pytest.mark.parametrize("member, fragment", [("../escape", "leaves the package's folder"), ("/abs", "leaves the package's folder")])
def test_verify_refuses_hostile_members(packaged, tmp_path, member, fragment):
    proj, _, archive, _ = packaged
    hostile = tmp_path / "hostile.tar.xz"
    with lzma.open(hostile, "wb") as xz, tarfile.open(fileobj=xz, mode="w") as out:
        info = tarfile.TarInfo(member)
        info.size = 1
        out.addfile(info, io.BytesIO(b"x"))
    assert_clean_error(run_cli("package", "--verify", str(hostile), cwd=proj.root), 1, fragment)


def test_bad_input_is_one_error_line(packaged, tmp_path):
    proj, manifest, archive, _ = packaged
    assert_clean_error(run_cli("package", "--verify", str(tmp_path / "none.tar.xz"), cwd=proj.root), 2, "no such file")
    (tmp_path / "junk.tar.xz").write_bytes(b"not an archive")
    assert_clean_error(run_cli("package", "--verify", str(tmp_path / "junk.tar.xz"), cwd=proj.root), 1, "not a readable package archive")
    assert_clean_error(run_cli("package", "--verify", str(archive), "--build", "x", cwd=proj.root), 2, "--verify takes an archive alone")
    assert_clean_error(run_cli("package", "--build", "nope", cwd=proj.root), 2, "no such build")
    assert_clean_error(run_cli("package", "--build", manifest.key, "--cuda", cwd=proj.root), 2, "no --cuda")
    fake_build(proj.root, "cpu-000000000000", {"llama-cli": "print(1)\n"})
    assert_clean_error(run_cli("package", "--build", "cpu-000000000000", cwd=proj.root), 2, "RUNPATH $ORIGIN")
    (manifest.build_dir / "bin" / "llama-cli").write_bytes(b"changed")
    assert_clean_error(run_cli("package", "--build", manifest.key, cwd=proj.root), 1, "changed since build")


def _runpaths(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        dynamic = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
        for line in dynamic.splitlines():
            if "(RUNPATH)" in line or "(RPATH)" in line:
                out[path.name] = line.split("[", 1)[1].rstrip("]")
    return out


def _unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(dest, filter="data")
    (folder,) = list(dest.iterdir())
    return folder


def test_the_unpacked_archive_runs_without_the_build(packaged, tmp_path):
    proj, manifest, archive, _ = packaged
    shutil.rmtree(manifest.build_dir)  # no build tree left
    folder = _unpack(archive, tmp_path / "unpacked")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    done = subprocess.run([str(folder / "bin" / "llama-cli")], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "43", done.stderr  # 42 + the patch's 1
    if shutil.which("readelf"):
        assert set(_runpaths(folder / "bin").values()) <= {"$ORIGIN"} and _runpaths(folder / "bin")


@pytest.mark.slow
def test_real_build_packages_and_generates_from_anywhere(real_build, tmp_path):
    """The CPU build of the vendored tree: packaged, verified against this checkout, unpacked in a
    folder of its own, then llama-server --version and an 8-token generation from it."""
    done = run_pf("package", "--build", real_build.key, "--out", str(tmp_path), "--json", cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr
    archive = Path(json.loads(done.stdout)["archive"])
    done = run_pf("package", "--verify", str(archive), "--json", cwd=ROOT, timeout=600)
    assert done.returncode == 0 and json.loads(done.stdout)["chain_checked"], done.stdout + done.stderr
    folder = _unpack(archive, tmp_path / "fleet")
    bin_dir = folder / "bin"
    for name, runpath in _runpaths(bin_dir).items():
        entries = runpath.split(":")
        assert str(ROOT) not in runpath and "$ORIGIN" in entries and "" not in entries, (name, runpath)
    ldd = subprocess.run(["ldd", str(bin_dir / "llama-cli")], capture_output=True, text=True).stdout
    ours = [ln for ln in ldd.splitlines() if "libllama" in ln or "libggml" in ln]
    assert ours and all(str(bin_dir) in ln for ln in ours), ldd
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    version = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=60)
    assert version.returncode == 0 and "version:" in version.stdout + version.stderr, version.stderr
    from polyforge.models import registry
    model = registry.fetch("smollm2-135m").path
    gen = subprocess.run([str(bin_dir / "llama-cli"), "-m", str(model), "-p", "The capital of France is", "-n", "8",
                          "-st", "-t", "2", "--temp", "0"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert gen.returncode == 0, gen.stderr[-2000:]
    answer = gen.stdout.split("The capital of France is", 1)[-1]
    assert "Generation:" in answer and answer.split("[ Prompt:")[0].strip(), gen.stdout[-2000:]


def test_verify_in_a_checkout_with_a_broken_patch_is_one_error_line(packaged):
    proj, _, archive, _ = packaged
    patch = proj.patches / "0001-answer.patch"
    before = patch.read_bytes()
    patch.write_bytes(before.replace(b"\n", b"\r\n"))
    assert_clean_error(run_cli("package", "--verify", str(archive), cwd=proj.root), 2, "CRLF")
    assert patch.read_bytes() == before.replace(b"\n", b"\r\n")
